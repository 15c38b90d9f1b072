"""``Child.favour``: a small partition's records before the big ones' it is read beside.

librdkafka hands a consumer's records out in fetch order; the child pauses the other
partitions while a favoured one is read (which drops what librdkafka queued of them) and
resumes them from the cursor after. The handle is a stub that records the calls: which
partitions are paused when is the whole contract here (the ordering itself is proven end
to end in tests/integration/test_group_catchup.py)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from fastrebalance._child import FAVOUR_STALL_S, Child
from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import Epoch

BIG, OTHER, SMALL = ("t", 0), ("t", 1), ("t", 3)


class _Handle:
    """Records pause/resume/seek/assign; what is paused now is ``paused``."""

    def __init__(self) -> None:
        self.paused: set[int] = set()
        self.seeks: list[tuple[int, int]] = []

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        pass

    def list_topics(self, topic: str, timeout: float) -> None:
        pass

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.partition, tp.offset))

    def consume(self, num: int, timeout: float) -> list[Any]:
        return []


def _child(*keys: tuple[str, int]) -> tuple[Child, _Handle]:
    child = Child({"group.id": "g.catchup"}, lambda *a: None)
    handle = _Handle()
    child._handle = handle  # type: ignore[assignment]
    for k in keys:
        child.start(k, Ledger(1000, RangeSet([(0, 1000)])), Epoch(1000, 1000))
    return child, handle


def test_the_others_wait_while_a_favoured_partition_is_read_then_go_on_from_the_cursor() -> None:
    child, handle = _child(BIG, OTHER)
    child._cursors[BIG].pos = 700  # what it handed out before the small one came
    child.start(SMALL, Ledger(30, RangeSet([(0, 30)])), Epoch(30, 30))
    child.favour([SMALL])
    assert handle.paused == {0, 1}  # what librdkafka queued of them is dropped
    child.stop([SMALL])  # read to its end
    assert handle.paused == set()
    assert (0, 700) in handle.seeks  # from the cursor, not from what was fetched


def test_a_partition_started_while_one_is_favoured_waits_too() -> None:
    child, handle = _child(SMALL)
    child.favour([SMALL])
    assert handle.paused == set()  # nothing else to hold back
    child.start(BIG, Ledger(1000, RangeSet([(0, 1000)])), Epoch(1000, 1000))
    assert handle.paused == {0}


def test_the_application_s_pause_outlasts_a_hold_and_its_resume_waits_for_it() -> None:
    child, handle = _child(BIG, OTHER, SMALL)
    child.pause([BIG])
    child.favour([SMALL])
    assert handle.paused == {0, 1}
    child.resume([BIG])  # the application's resume: still held back for the small one
    assert handle.paused == {0, 1}
    child.pause([OTHER])
    child.favour([])
    assert handle.paused == {1}  # the application paused it meanwhile: it stays paused


def test_a_favoured_partition_paused_by_the_application_holds_nothing_back() -> None:
    child, handle = _child(BIG, SMALL)
    child.pause([SMALL])
    child.favour([SMALL])
    assert handle.paused == {3}


def test_a_favoured_partition_whose_records_do_not_come_stops_holding_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    # the child module's clock only (``fastrebalance._child`` is also a name in the package)
    monkeypatch.setattr(
        sys.modules[Child.__module__], "time", SimpleNamespace(monotonic=lambda: clock[0])
    )
    child, handle = _child(BIG, SMALL)
    child.favour([SMALL])
    assert handle.paused == {0}

    def polls(seconds: float) -> None:  # a busy poll loop
        for _ in range(int(seconds / 0.1)):
            clock[0] += 0.1
            child.consume(10)

    polls(FAVOUR_STALL_S * 0.9)
    child._cursors[SMALL].pos = 10  # records came: still favoured
    polls(FAVOUR_STALL_S * 0.9)
    assert handle.paused == {0}
    clock[0] += FAVOUR_STALL_S * 2  # the application's own work between two calls
    child.consume(10)
    polls(FAVOUR_STALL_S * 0.9)
    assert handle.paused == {0}
    polls(FAVOUR_STALL_S * 0.3)  # nothing for longer than the bound (its leader gone, say)
    assert handle.paused == set()
    child.favour([SMALL])  # asked again each tick: the stalled one stays unfavoured
    assert handle.paused == set()
