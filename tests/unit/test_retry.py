"""The shared deadline of a sequence of round trips is never overrun by the sequence."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from fastrebalance._retry import Budget, call_with_retries


def _timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "broker silent"))


def test_a_request_timeout_never_exceeds_what_is_left() -> None:
    # A floor under the request's timeout overran committed(timeout=0.05) tenfold.
    budget = Budget(0.05)
    assert budget.request_timeout(10.0) <= 0.05
    assert budget.request_timeout(0.01) == 0.01


def test_an_exhausted_budget_fails_before_the_round_trip() -> None:
    budget = Budget(0)
    with pytest.raises(KafkaException) as info:
        budget.request_timeout(10.0)
    assert info.value.args[0].code() == KafkaError._TIMED_OUT


def test_no_retry_starts_after_the_deadline() -> None:
    # Each attempt uses up what is left, as a request to a silent broker does; the
    # retries' backoff sleeps must not carry the sequence past the budget either.
    budget = Budget(0.6)
    calls = []

    def attempt() -> None:
        calls.append(time.monotonic())
        time.sleep(min(0.25, budget.remaining()))
        raise _timed_out()

    started = time.monotonic()
    with pytest.raises(KafkaException):
        call_with_retries(attempt, attempts=50, max_seconds=budget.remaining())
    assert time.monotonic() - started < 0.6 + 0.25
    assert all(t - started < 0.6 for t in calls)


def test_errors_that_are_not_retriable_are_raised_at_once() -> None:
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError.INVALID_COMMIT_OFFSET_SIZE, "too big"))

    with pytest.raises(KafkaException):
        call_with_retries(attempt, attempts=5, max_seconds=5)
    assert calls == [1]
