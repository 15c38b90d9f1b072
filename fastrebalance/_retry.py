"""Bounded retries of broker round trips: the one place Kafka errors are classified.

A commit or an offset read that fails with a *retriable* error (coordinator moving,
request timed out, broker paused) is retried a few times with backoff; anything
else, or the last failure, is raised unchanged, the same ``KafkaException`` a plain
confluent-kafka consumer would raise. Bounded, so that close() can never hang.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

__all__ = ["call_with_retries", "is_retriable"]

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


def call_with_retries(fn: Callable[[], T], attempts: int = 4, max_seconds: float = 30.0) -> T:
    """Run ``fn``; retry retriable Kafka errors up to ``attempts`` times or ``max_seconds``."""
    for attempt in Retrying(
        stop=stop_after_attempt(attempts) | stop_after_delay(max_seconds),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        retry=retry_if_exception(is_retriable),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")  # pragma: no cover
