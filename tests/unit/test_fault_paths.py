"""Fault paths that a live cluster cannot be made to hit on cue, driven through stubs.

* ``call_bounded``: the helper that keeps a synchronous commit, and close(), from blocking
  forever on a hung broker (librdkafka retries an OffsetCommit until a coordinator answers).
* The child's out-of-range handling when the watermarks cannot be read, and when its range
  lies beyond the log end (topic recreated, log truncated): no exception out of poll(), no
  restart loop, nothing dropped.
* An assignment delivered inside close() is not planned: planning would wait on a group
  that is leaving (found by the chaos soak: a clean close took over 60 s).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import Consumer
from fastrebalance._child import Child, _Cursor, call_bounded
from fastrebalance._consumer import _socket_timeout_s
from fastrebalance._ranges import RangeSet
from fastrebalance._state import PartitionState

KEY = ("t", 0)


def test_call_bounded_returns_and_raises_like_the_call() -> None:
    assert call_bounded(lambda: 42, 1.0, "answer") == 42
    with pytest.raises(KafkaException) as info:
        call_bounded(
            lambda: (_ for _ in ()).throw(KafkaException(KafkaError(KafkaError._FATAL))),
            1.0,
            "fatal",
        )
    assert info.value.args[0].code() == KafkaError._FATAL


def test_call_bounded_gives_up_after_its_timeout() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(KafkaException) as info:
        call_bounded(lambda: release.wait(10), 0.2, "commit")
    elapsed = time.monotonic() - started
    release.set()  # let the abandoned call finish
    assert elapsed < 2
    err = info.value.args[0]
    assert err.code() == KafkaError._TIMED_OUT
    assert "commit did not complete within 0.2s" in err.str()


@pytest.mark.parametrize(
    ("conf", "seconds"),
    [
        ({}, 60.0),
        ({"socket.timeout.ms": 5000}, 5.0),
        ({"socket.timeout.ms": "2500"}, 2.5),
        ({"socket.timeout.ms": "soon"}, 60.0),
    ],
)
def test_commit_bound_is_socket_timeout(conf: dict[str, Any], seconds: float) -> None:
    assert _socket_timeout_s(conf) == seconds


class _StubHandle:
    """A child handle whose broker answers as the test says."""

    def __init__(self, watermarks: tuple[int, int] | Exception) -> None:
        self.watermarks = watermarks
        self.calls: list[tuple[str, Any]] = []

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.calls.append(("watermarks", tp.partition))
        if isinstance(self.watermarks, Exception):
            raise self.watermarks
        return self.watermarks

    def seek(self, tp: TopicPartition) -> None:
        self.calls.append(("seek", tp.offset))

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("unassign", [tp.partition for tp in tps]))

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", [tp.offset for tp in tps]))


def _child_reading(
    handle: _StubHandle, pos: int, ranges: list[tuple[int, int]], errors: list[KafkaError]
) -> tuple[Child, PartitionState]:
    deleted: list[tuple[str, int, int, int]] = []
    child = Child(
        {"group.id": "g.catchup", "error_cb": errors.append}, lambda *a: deleted.append(a)
    )
    child._handle = handle  # type: ignore[assignment]
    state = PartitionState(2000, RangeSet(ranges), 2000)
    piece = state.ranges.next_from(pos)
    assert piece is not None
    cursor = _Cursor(piece[0], piece[1], state)
    cursor.pos = pos
    child._cursors[KEY] = cursor
    child.deleted = deleted  # type: ignore[attr-defined]
    return child, state


def test_out_of_range_without_watermarks_retries_and_skips_nothing() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle(KafkaException(KafkaError(KafkaError._TIMED_OUT, "broker paused")))
    child, state = _child_reading(handle, 550, [(500, 1000)], errors)
    child._skip_deleted(KEY)  # must not raise out of poll()
    assert state.ranges.as_tuple() == ((500, 1000),)
    assert child.position(KEY) == 550
    assert ("seek", 550) in handle.calls, "fetch again: the next answer decides"
    assert not errors and not child.deleted  # type: ignore[attr-defined]


def test_range_beyond_the_log_end_is_reported_once_and_left_pending() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle((0, 100))  # the log now ends at 100: recreated or truncated
    child, state = _child_reading(handle, 500, [(500, 1000)], errors)
    child._skip_deleted(KEY)
    assert state.ranges.as_tuple() == ((500, 1000),), "nothing claimed processed"
    assert child.position(KEY) is None and not child.active, "stopped, not restarted"
    assert ("unassign", [0]) in handle.calls and not any(c[0] == "assign" for c in handle.calls)
    assert len(errors) == 1 and errors[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert "t [0] offsets [500, 1000) are beyond the log end 100" in errors[0].str()


def test_retention_below_the_cursor_is_reported_and_skipped() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle((700, 3000))  # retention deleted up to 700
    child, state = _child_reading(handle, 550, [(500, 1000), (1500, 1600)], errors)
    child._skip_deleted(KEY)
    assert child.deleted == [("t", 0, 550, 700)]  # type: ignore[attr-defined]
    assert state.ranges.as_tuple() == ((700, 1000), (1500, 1600))
    assert child.position(KEY) == 700


class _CountingPrimary:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.round_trips: list[str] = []

    def committed(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips.append("committed")
        return self._inner.committed(*args, **kwargs)

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips.append("watermarks")
        return self._inner.get_watermark_offsets(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_assignment_inside_close_is_not_planned() -> None:
    c = Consumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "enable.parallel.rebalance": True}
    )
    primary = _CountingPrimary(c._primary)
    c._primary = primary  # type: ignore[assignment]
    try:
        c._closed = True  # what close() sets before librdkafka runs the last callbacks
        started = time.monotonic()
        c._on_assign(primary, [TopicPartition("t", 0)])
        assert time.monotonic() - started < 1
        assert primary.round_trips == []
        assert c.catchup_status() == {}
    finally:
        c._primary = primary._inner
        c._closed = False
        c.close()


class _PlanningPrimary:
    """A primary whose broker has committed offset 100 on every partition and a log end
    of 5000; ``hang_after_committed`` makes every later round trip time out."""

    def __init__(self, inner: Any, hang_after_committed: bool = False) -> None:
        self._inner = inner
        self.hang = hang_after_committed
        self.round_trips: list[str] = []

    def _answer(self, what: str, timeout: float) -> None:
        self.round_trips.append(what)
        if self.hang:
            time.sleep(timeout)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{what} timed out"))

    def committed(self, tps: list[TopicPartition], timeout: float = -1) -> Any:
        self.round_trips.append("committed")
        return [TopicPartition(tp.topic, tp.partition, 100) for tp in tps]

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float = -1) -> Any:
        self._answer("offsets_for_times", timeout)
        return [
            TopicPartition(tp.topic, tp.partition, 0 if tp.offset == -2 else 5000) for tp in tps
        ]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = -1, **_: Any) -> Any:
        self._answer("watermarks", timeout)
        return (0, 5000)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _EmptyChildLog:
    """The child's handle, whose commit log holds nothing yet (a first catch-up)."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def committed(self, tps: list[TopicPartition], timeout: float = -1) -> Any:
        self.reads.append(len(tps))
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def close(self) -> None:
        pass


def _planning_consumer(hang: bool) -> tuple[Consumer, _PlanningPrimary]:
    c = Consumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "enable.parallel.rebalance": True}
    )
    primary = _PlanningPrimary(c._primary, hang)
    c._primary = primary  # type: ignore[assignment]
    assert c._child is not None
    c._child._handle = _EmptyChildLog()  # type: ignore[assignment]
    return c, primary


def test_planning_a_large_assignment_reads_watermarks_in_two_round_trips() -> None:
    """Both ends of all 64 logs come from one ListOffsets each: planning no longer costs a
    round trip per partition inside the rebalance callback."""
    c, primary = _planning_consumer(hang=False)
    try:
        planned = c._prepare([TopicPartition("t", p) for p in range(64)])
        assert primary.round_trips == ["committed", "offsets_for_times", "offsets_for_times"]
        # Checkpoints to retire are looked for after the primary is assigned (fresh
        # records are fetched meanwhile): one read of the child's log for all 64.
        assert c._child._handle.reads == []  # type: ignore[union-attr]
        assert len(c._added) == 64
        c._child.retire_stale(c._added)
        assert c._child._handle.reads == [64]  # type: ignore[union-attr]
        assert [tp.offset for tp in planned] == [5000] * 64  # fresh data first
        assert all(st.ranges.as_tuple() == ((100, 5000),) for st in c._prepared.values())
    finally:
        c._primary = primary._inner
        c.close()


def test_planning_on_a_hung_broker_is_bounded_by_one_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every round trip after the committed offsets times out. Bounded one by one, 32
    partitions would hold poll() for 32 timed-out watermark reads (each retried, 40 s each
    with the defaults); sharing one budget ends planning when the budget does, and every
    partition resumes at its committed offset with nothing skipped."""
    import fastrebalance._consumer as consumer_module

    monkeypatch.setattr(consumer_module, "_PLAN_BUDGET_S", 2.0)
    monkeypatch.setattr(consumer_module, "_REQUEST_TIMEOUT_S", 1.0)
    c, primary = _planning_consumer(hang=True)
    try:
        started = time.monotonic()
        planned = c._prepare([TopicPartition("t", p) for p in range(32)])
        elapsed = time.monotonic() - started
        assert elapsed < 2.0 + 1.0 + 2, elapsed  # the budget, one last read, slack
        assert [tp.offset for tp in planned] == [100] * 32
        assert all(not st.ranges for st in c._prepared.values())
    finally:
        c._primary = primary._inner
        c.close()
