"""What poll()/consume() hand out of each stream: pure bookkeeping over fake handles, no
broker."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._config import ParallelConfig
from fastrebalance._delivery import Delivery, hot_poll
from fastrebalance._lead import BEHIND_RUN, CHILD_SHARE
from fastrebalance._ledger import Ledger
from fastrebalance._partitions import Partitions

X0, Y0 = ("x", 0), ("y", 0)


class _Primary:
    """Returns the records it is given, one a call; ``during`` runs inside the first call
    before it returns (a rebalance callback librdkafka serves there)."""

    def __init__(self, records: list[Message], during: Any = None) -> None:
        self.records = records
        self.during = during

    def poll(self, timeout: float) -> Message | None:
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return self.records.pop(0) if self.records else None


class _IdleChild:
    active = False
    _cursors: dict[Any, Any] = {}


def _delivery(primary: _Primary, p: Partitions, group_catchup: bool = True) -> Delivery:
    settings = ParallelConfig(enabled=True, group_catchup=group_catchup)
    return Delivery(primary, _IdleChild(), p, settings, lambda now: None)  # type: ignore[arg-type]


def _record(key: tuple[str, int], offset: int) -> Message:
    return Message(topic=key[0], partition=key[1], offset=offset)


def test_poll_hands_out_no_record_of_a_partition_revoked_inside_the_call() -> None:
    # issue 45: after subscribe([Y]) poll() returned one record of X, fetched before the
    # revoke the same call served (consume() already dropped such records; plain
    # confluent-kafka hands out nothing of a partition after its revoke)
    p = Partitions()
    for key in (X0, Y0):
        p.open(key, Ledger(100), 100, 100)
    d = _delivery(_Primary([_record(X0, 120), _record(Y0, 130)], lambda: p.retire([X0])), p)
    m = d._poll_slow(5.0)  # X's record, after X's revoke, is not handed out: Y's is
    assert m is not None and (m.topic(), m.offset()) == ("y", 130)
    assert not p.revoked_in_call


def test_the_hot_path_of_poll_drops_it_too() -> None:
    p = Partitions()
    for key in (X0, Y0):
        p.open(key, Ledger(100), 100, 100)
    d = _delivery(
        _Primary([_record(X0, 120), _record(Y0, 130)], lambda: p.retire([X0])), p, False
    )
    assert d.steady  # no catch-up, nothing waits: poll() is librdkafka's call and a check
    m = hot_poll(d, 5.0)
    assert m is not None and (m.topic(), m.offset()) == ("y", 130)


def test_poll_hands_out_the_records_of_a_partition_assigned_again() -> None:
    p = Partitions()
    p.open(X0, Ledger(100), 100, 100)
    p.retire([X0])
    p.open(X0, Ledger(200), 200, 200)  # assigned again before the next call
    d = _delivery(_Primary([_record(X0, 200)]), p)
    m = d._poll_slow(5.0)
    assert m is not None and m.offset() == 200


class _ReadingChild:
    """A child with backlog records to hand out, counting its calls."""

    active = True
    _cursors: dict[Any, Any] = {X0: None}

    def __init__(self) -> None:
        self.calls = 0

    def consume(self, num: int, timeout: float = 0.0) -> list[Message]:
        self.calls += 1
        return [_record(X0, 5)]


class _FailingPrimary(_Primary):
    def consume(self, num: int, timeout: float) -> list[Message]:
        return [self.records.pop(0)] if self.records else []


def test_the_primarys_fatal_error_ends_the_merge_in_that_very_call() -> None:
    # librdkafka's consumer hands out nothing after its fatal error: neither may the child,
    # in the same consume() (before, its backlog kept coming: 3,670 records in 20 s)
    fatal = Message(error=KafkaError(KafkaError._FATAL, "Fatal error: fenced"))
    for method in ("poll", "consume"):
        p = Partitions()
        p.open(X0, Ledger(0), 0, 100)
        child = _ReadingChild()
        told: list[KafkaError] = []
        settings = ParallelConfig(enabled=True)
        d = Delivery(_FailingPrimary([fatal]), child, p, settings, lambda now: None)  # type: ignore[arg-type]
        d.on_fatal = told.append
        got = d._consume_slow(10, 1.0) if method == "consume" else [d._poll_slow(1.0)]
        assert [m.error().code() for m in got if m is not None] == [KafkaError._FATAL], method
        assert len(told) == 1 and child.calls == 0, method


# -- which stream leads while the child reads a backlog -------------------------------------
class _Queue:
    """A stream with ``n`` records queued: poll()/consume() at timeout 0 take what is there."""

    def __init__(self, key: tuple[str, int], n: int) -> None:
        self.key, self.next, self.end = key, 0, n
        self.active = True
        self._cursors: dict[Any, Any] = {}

    def add(self, n: int) -> None:
        self.end += n

    def consume(self, num: int, timeout: float = 0.0) -> list[Message]:
        got = [_record(self.key, o) for o in range(self.next, min(self.next + num, self.end))]
        self.next += len(got)
        return got

    def poll(self, timeout: float) -> Message | None:
        got = self.consume(1)
        return got[0] if got else None


def _merge(primary: _Queue, child: _Queue) -> Delivery:
    settings = ParallelConfig(enabled=True)
    return Delivery(primary, child, Partitions(), settings, lambda now: None)  # type: ignore[arg-type]


def _split(batch: list[Message]) -> tuple[int, int]:
    fresh = sum(1 for m in batch if m.topic() == "x")
    return fresh, len(batch) - fresh


def test_consume_lets_the_backlog_lead_once_the_primary_is_behind_too() -> None:
    # A loaded CPU: the application processes about as fast as fresh records arrive, so
    # the primary's queue never runs dry. Fresh records leading throughout gave the
    # backlog 62 of each consume(500): it drained at an eighth of the processing rate.
    primary, child = _Queue(X0, 100_000), _Queue(Y0, 100_000)
    d = _merge(primary, child)
    first = d._consume_slow(500, 1.0)
    assert _split(first) == (500 - 500 // CHILD_SHARE, 500 // CHILD_SHARE)  # fresh first
    batches = [_split(d._consume_slow(500, 1.0)) for _ in range(CHILD_SHARE)]
    # the backlog leads, the primary keeps 1 in CHILD_SHARE; every CHILD_SHARE-th batch
    # is the primary's again, to see whether it caught up
    assert batches.count((62, 438)) == CHILD_SHARE - 1
    assert batches.count((438, 62)) == 1


def test_fresh_records_lead_again_once_the_primary_caught_up() -> None:
    primary, child = _Queue(X0, 1_000), _Queue(Y0, 100_000)
    d = _merge(primary, child)
    for _ in range(3):
        d._consume_slow(500, 1.0)
    assert primary.end - primary.next < 500  # what the last batches left of its queue
    while primary.next < primary.end:
        d._consume_slow(500, 1.0)
    # at the live end: each call finds a few fresh records, all handed out at once
    for _ in range(CHILD_SHARE * 2):
        primary.add(100)
        assert _split(d._consume_slow(500, 1.0)) == (100, 400)


def test_consume_at_the_live_end_never_hands_the_lead_to_the_backlog() -> None:
    primary, child = _Queue(X0, 0), _Queue(Y0, 100_000)
    d = _merge(primary, child)
    for _ in range(CHILD_SHARE * 4):
        primary.add(300)  # a burst, each time fewer than the fresh share of a batch
        assert _split(d._consume_slow(500, 1.0)) == (300, 200)


def test_poll_lets_the_backlog_lead_once_the_primary_is_behind_too() -> None:
    primary, child = _Queue(X0, 100_000), _Queue(Y0, 100_000)
    d = _merge(primary, child)
    got = [d._poll_slow(1.0) for _ in range(BEHIND_RUN * 2)]
    topics = [m.topic() if m is not None else None for m in got]
    assert None not in topics
    # before: fresh first, the backlog 1 in CHILD_SHARE + 1
    head = topics[: BEHIND_RUN // 2]
    assert head.count("y") <= len(head) // CHILD_SHARE
    # once BEHIND_RUN fresh records went by without the primary's queue running dry, the
    # backlog leads: the primary keeps 1 in CHILD_SHARE, and 1 round in CHILD_SHARE
    assert topics[-CHILD_SHARE * CHILD_SHARE :].count("y") == (CHILD_SHARE - 1) ** 2 + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=40))
def test_neither_stream_starves_whichever_leads(arrivals: list[tuple[int, int]]) -> None:
    # whatever the two queues hold, while both have records each consume(500) hands out
    # at least 500 // CHILD_SHARE of each, and nothing beyond the batch size
    primary, child = _Queue(X0, 0), _Queue(Y0, 0)
    d = _merge(primary, child)
    for fresh_in, backlog_in in arrivals:
        primary.add(fresh_in)
        child.add(backlog_in)
        had = (primary.end - primary.next, child.end - child.next)
        fresh, backlog = _split(d._consume_slow(500, 0.0))
        assert fresh + backlog <= 500
        assert fresh >= min(had[0], 500 // CHILD_SHARE)
        assert backlog >= min(had[1], 500 // CHILD_SHARE)
