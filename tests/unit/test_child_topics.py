"""``Child._learn_topics``: the metadata of a topic is asked for before the first
partition of it is assigned on the child's handle.

librdkafka looks for the leader of a partition assigned on a handle that is already
connected only at its one-second topic scan: a child created ahead of its first chunk
handed out the first record 0.55-0.6 s after ``incremental_assign()`` on Apache Kafka 3.9,
3-5 ms with the topic's metadata asked for first. The handle is a stub that records the
calls in order: which call comes before which is the whole contract here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import _child
from fastrebalance._child import Child
from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import Epoch


class _Broker:
    """What every stub handle records, in order, and whether metadata requests fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = False


class _Handle:
    def __init__(self, broker: _Broker) -> None:
        self.calls = broker.calls
        self.broker = broker

    def list_topics(self, topic: str, timeout: float) -> None:
        self.calls.append(("metadata", topic, timeout))
        if self.broker.fail:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", sorted((tp.topic, tp.partition) for tp in tps)))

    def close(self) -> None:
        self.calls.append(("close",))


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> _Broker:
    b = _Broker()
    monkeypatch.setattr(_child, "_RdConsumer", lambda conf: _Handle(b))
    return b


@pytest.fixture
def child(broker: _Broker) -> Iterator[Child]:
    c = Child({"group.id": "g.catchup"}, lambda *a: None)
    yield c
    c.close()


def _start(child: Child, *keys: tuple[str, int]) -> None:
    child.start_all((k, Ledger(100, RangeSet([(0, 100)])), Epoch(100, 100)) for k in keys)


def test_a_topic_s_metadata_is_asked_for_once_per_handle_before_its_first_assign(
    broker: _Broker, child: Child
) -> None:
    _start(child, ("a", 0), ("b", 1))
    assert broker.calls == [
        ("metadata", "a", ANY),
        ("metadata", "b", ANY),
        ("assign", [("a", 0), ("b", 1)]),
    ]
    broker.calls.clear()
    _start(child, ("a", 1))  # a topic this handle knows: no round trip on the poll path
    _start(child, ("c", 0))
    assert broker.calls == [
        ("assign", [("a", 1)]),
        ("metadata", "c", ANY),
        ("assign", [("c", 0)]),
    ]


def test_a_new_handle_asks_again(broker: _Broker, child: Child) -> None:
    _start(child, ("a", 0))
    broker.calls.clear()
    child.restart()  # a child crash: a new handle, which knows no topic
    assert ("metadata", "a", ANY) in broker.calls
    assert broker.calls.index(("metadata", "a", ANY)) < broker.calls.index(("assign", [("a", 0)]))


def test_no_metadata_in_time_still_assigns_and_is_not_asked_again(
    broker: _Broker, child: Child
) -> None:
    broker.fail = True
    _start(child, ("a", 0))
    _start(child, ("a", 1))
    assert broker.calls == [
        ("metadata", "a", ANY),
        ("assign", [("a", 0)]),
        ("assign", [("a", 1)]),
    ]
    assert child.position(("a", 0)) == 0
