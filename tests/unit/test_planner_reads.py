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


class _Marks(_Primary):
    """committed() as _Primary; both ends of the log from ``marks`` (an exception: the
    error every ListOffsets answers with)."""

    def __init__(self, committed: list[TopicPartition], marks: Any) -> None:
        super().__init__(committed)
        self.marks = marks
        self.listed = 0

    def offsets_for_times(self, ask: list[TopicPartition], timeout: float) -> Any:
        self.listed += 1
        if isinstance(self.marks, KafkaException):
            raise self.marks
        ends = {-2: self.marks[0], -1: self.marks[1]}
        return [TopicPartition(t.topic, t.partition, ends[t.offset]) for t in ask]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        if isinstance(self.marks, KafkaException):
            raise self.marks
        return self.marks


def test_a_write_reads_a_partition_never_committed_as_committed_at_its_log_start() -> None:
    """Never-committed catch-up: the plan made the whole log backlog; a late commit of the
    primary's record [20000, 20001) must keep [300, 20000) unprocessed (the log starts at
    300), not store 20001 bare as a first commit on an empty ledger does."""
    primary = _Marks([_answer(-1001)], (300, 20001))
    restored, fresh = Planner(primary, child=None, uncommitted=True).read_to_write(  # type: ignore[arg-type]
        [("t", 0)], Budget(5.0)
    )
    assert fresh == {("t", 0)}
    ledger = restored[("t", 0)].ledger()
    ledger.claim(20000, 20001)
    assert ledger.safe_offset == 300 and ledger.ranges.as_tuple() == ((300, 20000),)


def test_a_write_reads_nothing_more_with_the_key_off_or_an_offset_committed() -> None:
    off = _Marks([_answer(-1001)], (300, 20001))
    restored, fresh = Planner(off, child=None).read_to_write([("t", 0)], Budget(5.0))  # type: ignore[arg-type]
    assert restored[("t", 0)].position is None and not fresh and off.listed == 0
    committed = _Marks([_answer(500)], (300, 20001))
    restored, fresh = Planner(committed, child=None, uncommitted=True).read_to_write(  # type: ignore[arg-type]
        [("t", 0)], Budget(5.0)
    )
    assert restored[("t", 0)].position == 500 and not fresh and committed.listed == 0


def test_a_write_whose_log_start_cannot_be_read_fails_unless_the_partition_is_unknown() -> None:
    """Without the log start nothing may be written (it could pass the unread log); a
    partition the cluster does not know has no log to protect."""
    down = _Marks([_answer(-1001)], KafkaException(KafkaError(KafkaError._TRANSPORT)))
    with pytest.raises(KafkaException) as info:
        Planner(down, child=None, uncommitted=True).read_to_write([("t", 0)], Budget(0.5))  # type: ignore[arg-type]
    assert info.value.args[0].code() == KafkaError._TRANSPORT
    gone = _Marks([_answer(-1001)], KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    restored, fresh = Planner(gone, child=None, uncommitted=True).read_to_write(  # type: ignore[arg-type]
        [("t", 0)], Budget(0.5)
    )
    assert restored[("t", 0)].position is None and not fresh
