"""Planner.read_logs against a fake handle: what a partition's error answer means."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance._planner import Planner
from fastrebalance._retry import Budget


class _Primary:
    """committed() answers from a script, one answer list per call."""

    def __init__(self, *answers: list[TopicPartition]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _answer(offset: int, error: int | None = None) -> TopicPartition:
    tp = TopicPartition("t", 0, offset)
    if error is not None:  # as librdkafka sets it on an OffsetFetch partition answer
        tp = _with_error(tp, KafkaError(error))
    return tp


def _with_error(tp: TopicPartition, error: KafkaError) -> Any:
    class Answer:
        topic, partition, offset, metadata = tp.topic, tp.partition, tp.offset, None

    Answer.error = error  # type: ignore[attr-defined]
    return Answer()


def test_a_retriable_partition_error_is_asked_again_not_read_as_nothing_committed() -> None:
    """Read as "nothing committed", a coordinator still loading would start the partition at
    auto.offset.reset (latest: the records from the committed offset on were skipped)."""
    loading = _answer(-1001, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    primary = _Primary([loading], [_answer(100)])
    restored = Planner(primary, child=None).read_logs([("t", 0)], Budget(5.0))  # type: ignore[arg-type]
    assert restored[("t", 0)].position == 100 and primary.calls == 2


def test_a_partition_error_that_stays_retriable_fails_the_read_within_its_budget() -> None:
    loading = _answer(-1001, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    primary = _Primary([loading])
    with pytest.raises(KafkaException) as info:
        Planner(primary, child=None).read_logs([("t", 0)], Budget(0.5))  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS


def test_an_unknown_partition_and_the_applications_own_read_keep_the_answer() -> None:
    """UNKNOWN_TOPIC_OR_PART is an answer; committed() of the application gets every answer
    as confluent-kafka gives it (``errors``)."""
    unknown = _answer(-1001, KafkaError.UNKNOWN_TOPIC_OR_PART)
    restored = Planner(_Primary([unknown]), child=None).read_logs([("t", 0)], Budget(1.0))  # type: ignore[arg-type]
    assert restored[("t", 0)].position is None
    loading = _answer(-1001, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    errors: dict = {}
    Planner(_Primary([loading]), child=None).read_logs([("t", 0)], Budget(1.0), errors)  # type: ignore[arg-type]
    assert errors[("t", 0)].error.code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
