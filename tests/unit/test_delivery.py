"""What poll() hands out of the primary's records: pure bookkeeping over a fake primary,
no broker."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message

from fastrebalance._config import ParallelConfig
from fastrebalance._delivery import Delivery, hot_poll
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
