"""Bounded retries of broker round trips: the one place Kafka errors are classified.

A commit or an offset read that fails with a *retriable* error (coordinator moving,
request timed out, broker paused) is retried a few times with backoff; anything
else, or the last failure, is raised unchanged, the same ``KafkaException`` a plain
confluent-kafka consumer would raise. Bounded, so that close() can never hang.

tenacity is imported at the first retry, not with the package: a restarted process's
first assignment makes these round trips, and the import (about 50 ms) was on its way to
the first fresh record although almost every call succeeds at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

__all__ = ["Budget", "call_with_retries", "is_retriable"]

T = TypeVar("T")

_RETRIABLE_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.NETWORK_EXCEPTION,
    }
)


def is_retriable(exc: BaseException) -> bool:
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    if not isinstance(err, KafkaError) or err.fatal():
        return False
    return err.retriable() or err.code() in _RETRIABLE_CODES


class Budget:
    """One deadline shared by a sequence of broker round trips.

    Each round trip is bounded on its own, but a rebalance callback or a commit makes
    several in a row: bounded one by one, their sum on a paused broker grows with the
    number of partitions and retries. Sharing one deadline keeps the whole sequence, and
    so the caller's poll() or close(), within a known time.
    """

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(self._end - time.monotonic(), 0.0)

    def request_timeout(self, longest: float, what: str = "") -> float:
        """A timeout for the next round trip: at most ``longest`` and what is left.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable, as librdkafka's own timeouts) when
                nothing is left; ``what`` names the round trip that was not made. Failing
                here, before the round trip, is what keeps the caller's own timeout: a floor
                under the request's timeout would overrun it on every hung broker.
        """
        left = self.remaining()
        if left <= 0.001:
            message = f"timed out: no time was left for {what}" if what else "timed out"
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, message, retriable=True))
        return min(longest, left)


def call_with_retries(fn: Callable[[], T], attempts: int = 4, max_seconds: float = 30.0) -> T:
    """Run ``fn``; retry retriable Kafka errors up to ``attempts`` times, never starting
    an attempt (or a backoff sleep) that would begin after ``max_seconds``. The backoff
    is exponential from 0.1 s (0.1, 0.2, 0.4, ... at most 2 s)."""
    started = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        if attempts <= 1 or not is_retriable(exc):
            raise
        first_backoff = 0.1
        if time.monotonic() + first_backoff - started > max_seconds:
            raise
    time.sleep(first_backoff)
    from tenacity import (
        Retrying,
        retry_if_exception,
        stop_after_attempt,
        stop_before_delay,
        wait_exponential,
    )

    left = max(max_seconds - (time.monotonic() - started), 0.0)
    for attempt in Retrying(
        stop=stop_after_attempt(attempts - 1) | stop_before_delay(left),
        # attempt n of these is the (n+1)th: its backoff continues the sequence
        wait=wait_exponential(multiplier=2 * first_backoff, max=2.0),
        retry=retry_if_exception(is_retriable),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")  # pragma: no cover
