"""Fault paths that a live cluster cannot be made to hit on cue, driven through stubs.

* ``call_bounded``: the helper that keeps a synchronous commit, and close(), from blocking
  forever on a hung broker (librdkafka retries an OffsetCommit until a coordinator answers).
* The child's out-of-range handling when the watermarks cannot be read, when its range
  lies beyond the log end (topic recreated, log truncated), and when the broker keeps
  saying "out of range" for an offset inside the log (a leader change): no exception out
  of poll(), no tight loop, nothing dropped.
* An assignment delivered inside close() is not planned: planning would wait on a group
  that is leaving (found by the chaos soak: a clean close took over 60 s).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import Consumer
from fastrebalance._child import Child, _Cursor, call_bounded
from fastrebalance._consumer import _socket_timeout_s
from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._retry import Budget
from fastrebalance._routing import Epoch

from ..integration.helpers import swap_primary

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

    def pause(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("pause", [tp.partition for tp in tps]))

    def resume(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("resume", [tp.partition for tp in tps]))

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("unassign", [tp.partition for tp in tps]))

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", [tp.offset for tp in tps]))

    def list_topics(self, topic: str, timeout: float) -> None:
        pass  # the metadata asked for before a first assign (not what is tested here)


def _child_reading(
    handle: _StubHandle, pos: int, ranges: list[tuple[int, int]], errors: list[KafkaError]
) -> tuple[Child, _Cursor]:
    deleted: list[tuple[str, int, int, int]] = []
    child = Child({"group.id": "g.catchup"}, lambda *a: deleted.append(a), report=errors.append)
    child._handle = handle  # type: ignore[assignment]
    ledger = Ledger(2000, RangeSet(ranges))
    piece = ledger.ranges.next_from(pos)
    assert piece is not None
    cursor = _Cursor(piece[0], piece[1], ledger, Epoch(2000, 2000))
    cursor.pos = pos
    child._cursors[KEY] = cursor
    child.deleted = deleted  # type: ignore[attr-defined]
    return child, cursor


def test_out_of_range_without_watermarks_retries_later_and_skips_nothing() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle(KafkaException(KafkaError(KafkaError._TIMED_OUT, "broker paused")))
    child, cursor = _child_reading(handle, 550, [(500, 1000)], errors)
    child._out_of_range(KEY, cursor)  # must not raise out of poll()
    assert cursor.ledger.ranges.as_tuple() == ((500, 1000),)
    assert child.position(KEY) == 550
    assert ("pause", [0]) in handle.calls, "not fetched again at once"
    cursor.retry_at = 0.0  # the backoff is over
    child._retry_backed_off()
    assert handle.calls[-2:] == [("resume", [0]), ("seek", 550)], "the next answer decides"
    assert not errors and not child.deleted  # type: ignore[attr-defined]


def test_out_of_range_inside_the_log_backs_off_more_each_time() -> None:
    """A leader change can answer OFFSET_OUT_OF_RANGE for an offset that is inside the
    log (truncated, then grown again): the child fetches it again, never in a tight loop,
    and never skips it."""
    errors: list[KafkaError] = []
    handle = _StubHandle((0, 3000))
    child, cursor = _child_reading(handle, 550, [(500, 1000)], errors)
    waits = []
    for _ in range(4):
        before = time.monotonic()
        child._out_of_range(KEY, cursor)
        waits.append(cursor.retry_at - before)
        cursor.retry_at = 0.0
        child._retry_backed_off()
    assert all(b > a for a, b in itertools.pairwise(waits)), waits
    assert waits[0] >= 0.4
    assert cursor.ledger.ranges.as_tuple() == ((500, 1000),) and child.position(KEY) == 550
    assert not child.deleted  # type: ignore[attr-defined]
    # reported once, after the third answer in a row: the loop is visible, not silent
    assert len(errors) == 1 and errors[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert "keeps answering offset 550 out of range" in errors[0].str()


def test_range_beyond_the_log_end_is_reported_once_and_left_pending() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle((0, 100))  # the log now ends at 100: recreated or truncated
    child, cursor = _child_reading(handle, 500, [(500, 1000)], errors)
    child._out_of_range(KEY, cursor)
    assert cursor.ledger.ranges.as_tuple() == ((500, 1000),), "nothing claimed processed"
    assert child.position(KEY) is None and not child.active, "stopped, not restarted"
    assert ("unassign", [0]) in handle.calls and not any(c[0] == "assign" for c in handle.calls)
    assert len(errors) == 1 and errors[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert "t [0] offsets [500, 1000) are beyond the log end 100" in errors[0].str()


def test_retention_below_the_cursor_is_reported_and_skipped() -> None:
    errors: list[KafkaError] = []
    handle = _StubHandle((700, 3000))  # retention deleted up to 700
    child, cursor = _child_reading(handle, 550, [(500, 1000), (1500, 1600)], errors)
    child._out_of_range(KEY, cursor)
    assert child.deleted == [("t", 0, 550, 700)]  # type: ignore[attr-defined]
    assert cursor.ledger.ranges.as_tuple() == ((700, 1000), (1500, 1600))
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
    swap_primary(c, primary)
    try:
        c._assignments.leaving = True  # what close() sets before the last callbacks run
        started = time.monotonic()
        c._assignments.on_assign(primary, [TopicPartition("t", 0)])
        assert time.monotonic() - started < 1
        assert primary.round_trips == []
        assert c.catchup_status() == {}
    finally:
        swap_primary(c, primary._inner)
        c._assignments.leaving = False
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
    swap_primary(c, primary)
    assert c._child is not None
    c._child._handle = _EmptyChildLog()  # type: ignore[assignment]
    return c, primary


def test_planning_a_large_assignment_reads_watermarks_in_two_round_trips() -> None:
    """Both ends of all 64 logs come from one ListOffsets each: planning costs no round
    trip per partition inside the rebalance callback."""
    c, primary = _planning_consumer(hang=False)
    try:
        readings = c._planner.read([TopicPartition("t", p) for p in range(64)], Budget(30))
        assert primary.round_trips == ["committed", "offsets_for_times", "offsets_for_times"]
        # no token in the group's log: the child's log is not read
        assert c._child._handle.reads == []  # type: ignore[union-attr]
        plans = [c._assignments._plan(key, r, -1001) for key, r in readings.items()]
        assert all(p is not None and p.start == 5000 for p in plans)  # fresh data first
        assert all(p is not None and p.ledger.ranges.as_tuple() == ((100, 5000),) for p in plans)
        # Checkpoints to retire: one read of the child's log for all 64.
        c._child.retire_stale({key: (100, 5000) for key in readings}, Budget(5))
        assert c._child._handle.reads == [64]  # type: ignore[union-attr]
    finally:
        swap_primary(c, primary._inner)
        c.close()


def test_planning_on_a_hung_broker_is_bounded_by_one_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every round trip after the committed offsets times out. Bounded one by one, 32
    partitions would hold poll() for 32 timed-out watermark reads (each retried, 40 s each
    with the defaults); sharing one budget ends planning when the budget does, and every
    partition resumes at its committed offset with nothing skipped."""
    import fastrebalance._planner as planner_module

    monkeypatch.setattr(planner_module, "PLAN_BUDGET_S", 2.0)
    monkeypatch.setattr(planner_module, "REQUEST_TIMEOUT_S", 1.0)
    c, primary = _planning_consumer(hang=True)
    try:
        started = time.monotonic()
        readings = c._planner.read([TopicPartition("t", p) for p in range(32)], Budget(2.0))
        elapsed = time.monotonic() - started
        assert elapsed < 2.0 + 1.0 + 2, elapsed  # the budget, one last read, slack
        plans = [c._assignments._plan(key, r, -1001) for key, r in readings.items()]
        assert [p.start for p in plans if p is not None] == [100] * 32
        assert all(p is not None and not p.ledger.ranges for p in plans)
    finally:
        swap_primary(c, primary._inner)
        c.close()


# -- the order of the child's start and the stale-checkpoint read ---------------------------
@pytest.mark.parametrize(("handle_up", "order"), [
    (False, ["retire_stale", "start_all"]),
    (True, ["start_all", "retire_stale"]),
])  # fmt: skip
def test_a_new_child_reads_its_checkpoints_before_its_first_fetch(
    handle_up: bool, order: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash at 100, committed 100, log end 5000: the child reads [100, 5000). A new child
    handle finds its group coordinator through any broker connection; asked after its
    first fetch, the answer queued behind that fetch's megabytes (0.2-0.5 s measured on
    Apache Kafka 4), and the read of stale checkpoints waited for it inside the rebalance
    callback while the primary's fresh records queued. So a new handle reads first; one
    that is up (coordinator known) still overlaps the read with its fetch."""
    from fastrebalance._planning import Restored, plan_assignment

    c = Consumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "enable.parallel.rebalance": True}
    )
    try:
        child = c._child
        assert child is not None
        calls: list[str] = []
        def called(name: str) -> Any:
            return lambda *_a, **_k: calls.append(name) or []

        monkeypatch.setattr(child, "retire_stale", called("retire_stale"))
        monkeypatch.setattr(child, "start_all", called("start_all"))
        if handle_up:
            child._handle = _EmptyChildLog()  # type: ignore[assignment]
        plan = plan_assignment(Restored(100), 0, 5000, threshold=10)
        assert plan.caught_up == (100, 5000)
        c._assignments._open({KEY: (plan, -1001)})
        assert calls == order
    finally:
        c._child._handle = None  # type: ignore[union-attr]
        c.close()
