"""Group-wide catch-up and the ordinary API of a member that reads chunks for the group
(issue 45): unsubscribe() with the auto-commit, a changed subscription, and seek() back to a
record poll() returned. One partition, so the second member only ever helps; under both
group protocols where the cluster serves them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from fastrebalance.testing import KafkaCluster
from fastrebalance.testing._groupchaos import prepare

from .helpers import base_conf

PROTOCOLS = ("classic", "consumer")
BACKLOG = 20_000


def _conf(bootstrap: str, group: str, protocol: str, **extra: Any) -> dict[str, Any]:
    conf = base_conf(
        bootstrap,
        group,
        **{
            "parallel.rebalance.group.catchup": True,
            "parallel.rebalance.group.chunk.records": 1000,
            "partition.assignment.strategy": "cooperative-sticky",
            **extra,
        },
    )
    if protocol == "consumer":  # the client refuses classic-only keys under KIP-848
        conf["group.protocol"] = "consumer"
        for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
            conf.pop(key)
    return conf


@contextmanager
def _owner_and_helper(
    cluster: KafkaCluster,
    topic: str,
    group: str,
    protocol: str,
    kip848: tuple[bool, str],
    **helper_extra: Any,
) -> Iterator[tuple[Any, Any]]:
    """The owner holds the one partition; the helper joins after it, so it only reads
    chunks."""
    from fastrebalance import Consumer

    if protocol == "consumer" and not kip848[0]:
        pytest.skip(kip848[1])
    bootstrap = cluster.bootstrap_servers
    prepare(bootstrap, topic, group, BACKLOG)
    owner = Consumer(_conf(bootstrap, group, protocol))
    helper = Consumer(_conf(bootstrap, group, protocol, **helper_extra))
    try:
        owner.subscribe([topic])
        deadline = time.monotonic() + 30
        while not owner.assignment():
            assert time.monotonic() < deadline, "the owner was never assigned"
            owner.consume(100, 0.05)
        yield owner, helper
    finally:
        helper.close()
        owner.close()


def _read(c: Any, into: set[int], n: int = 100) -> list[Any]:
    msgs = [m for m in c.consume(n, 0.05) if m.error() is None]
    into.update(m.offset() for m in msgs)
    return msgs


def _slow_owner(owner: Any, into: set[int]) -> None:
    """The owner works 0.5 ms a record (at most 20 a call): the helper, reading 500 a
    call, gets chunks before the owner drained the backlog alone."""
    time.sleep(0.5e-3 * len(_read(owner, into, 20)))


def _turn(owner: Any, helper: Any, by_owner: set[int], by_helper: set[int]) -> None:
    """One turn of both members: the owner slowly, the helper up to 500 records."""
    _slow_owner(owner, by_owner)
    _read(helper, by_helper, 500)


def _until(cond: Callable[[], bool], step: Callable[[], Any], seconds: float, what: Any) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what() if callable(what) else what
        step()


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unsubscribe_with_the_auto_commit_keeps_what_the_helper_was_handed(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 45: a helper with librdkafka's default enable.auto.commit=true, handed 7,000
    # records, called unsubscribe(): the owner delivered all 7,000 again (no crash)
    topic = topic_factory(1)
    with _owner_and_helper(
        kafka_cluster, topic, unique_group, protocol, kip848, **{"enable.auto.commit": True}
    ) as (owner, helper):
        by_owner: set[int] = set()
        by_helper: set[int] = set()
        helper.subscribe([topic])

        both = partial(_turn, owner, helper, by_owner, by_helper)

        _until(lambda: len(by_helper) >= 3000, both, 60,
               lambda: f"the helper read {len(by_helper)}, the owner {len(by_owner)}")  # fmt: skip
        helper.unsubscribe()
        for _ in range(10):  # nothing more reaches the helper, as a plain consumer's
            assert _read(helper, set()) == []
        _until(lambda: len(by_owner | by_helper) >= BACKLOG,
               lambda: _read(owner, by_owner) and owner.commit(asynchronous=True),
               90, "the backlog did not drain")  # fmt: skip
    again = by_owner & by_helper
    assert not again, f"{len(again)} records the helper was handed were delivered again"


@pytest.mark.kafka4
@pytest.mark.parametrize("call", ["consume", "poll"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_helper_that_subscribes_to_another_topic_gets_none_of_the_old_ones_chunks(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
    call: str,
) -> None:
    # issue 45: after commit(asynchronous=False) and subscribe([Y]) a helper was handed 8,000
    # records of X's chunks within 0.6 s (its new code would process them)
    x, y = topic_factory(1), topic_factory(1)
    with _owner_and_helper(kafka_cluster, x, unique_group, protocol, kip848) as (owner, helper):
        by_owner: set[int] = set()
        by_helper: set[int] = set()
        helper.subscribe([x])

        def both() -> None:
            _slow_owner(owner, by_owner)
            _read(helper, by_helper, 500)
            helper.commit(asynchronous=True) if by_helper else None

        _until(lambda: len(by_helper) >= 2000, both, 60, "the helper read no chunks")
        helper.commit(asynchronous=False)
        helper.subscribe([y])
        after: list[tuple[str, int]] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if call == "consume":
                got = helper.consume(500, 0.05)
            else:
                got = [m for m in (helper.poll(0.05) for _ in range(50)) if m is not None]
            after += [(m.topic(), m.offset()) for m in got if not m.error()]
            _read(owner, by_owner)
        old = [(t, o) for t, o in after if t == x]
        assert old == [], f"{len(old)} records of {x} after subscribe([y]): {old[:5]}"
        _until(lambda: len(by_owner | by_helper) >= BACKLOG,
               lambda: _read(owner, by_owner) and owner.commit(asynchronous=True),
               90, "the backlog did not drain")  # fmt: skip


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_seek_back_to_a_chunk_record_delivers_it_again(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 45: api.md's recipe, commit the last good record and seek() back to the bad one,
    # on a record the helper read for the group raised KafkaException(_UNKNOWN_PARTITION)
    topic = topic_factory(1)
    with _owner_and_helper(kafka_cluster, topic, unique_group, protocol, kip848) as (
        owner,
        helper,
    ):
        by_owner: set[int] = set()
        by_helper: set[int] = set()
        helper.subscribe([topic])
        bad = None
        prev = None
        deadline = time.monotonic() + 60
        while bad is None:
            assert time.monotonic() < deadline, "the helper read no chunk"
            _slow_owner(owner, by_owner)
            for m in [m for m in helper.consume(100, 0.05) if m.error() is None]:
                if (
                    prev is not None
                    and m.offset() == prev.offset() + 1
                    and m.offset() % 1000 == 500
                ):
                    # mid-chunk: the bad record; the one before it was the last good one
                    helper.commit(message=prev, asynchronous=False)
                    helper.seek(TopicPartition(topic, 0, m.offset()))
                    bad = m.offset()
                    break
                by_helper.add(m.offset())
                prev = m
        again: set[int] = set()

        def step() -> None:
            for c in (owner, helper):
                if _read(c, again):
                    c.commit(asynchronous=True)

        _until(lambda: bad in again, step, 60, f"record {bad} was not delivered again")


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_committing_the_offset_after_each_record_moves_the_group_past_the_backlog(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 45: the textbook commit(offsets=[TopicPartition(t, p, m.offset() + 1)]) claimed no
    # record read for the group: the offsets stayed 0/0/0 for 30 s after the drain, until a
    # final bare commit()
    from .helpers import group_offsets

    topic = topic_factory(1)
    with _owner_and_helper(kafka_cluster, topic, unique_group, protocol, kip848) as (
        owner,
        helper,
    ):
        helper.subscribe([topic])
        seen: set[int] = set()

        def step() -> None:
            for c in (owner, helper):
                msgs = _read(c, seen, 500)
                if msgs:
                    last = msgs[-1]
                    c.commit(
                        offsets=[TopicPartition(topic, 0, last.offset() + 1)], asynchronous=True
                    )

        _until(lambda: len(seen) >= BACKLOG, step, 90, lambda: f"{len(seen)} of {BACKLOG}")
        _until(
            lambda: (
                group_offsets(kafka_cluster.bootstrap_servers, unique_group, topic)[0] >= BACKLOG
            ),
            step,
            30,
            lambda: (
                group_offsets(kafka_cluster.bootstrap_servers, unique_group, topic),
                owner.catchup_status(),
                helper.catchup_status(),
            ),
        )


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pausing_the_whole_assignment_stops_a_helpers_chunks(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 45's adversary: pause(assignment()), the usual back-pressure, on a member that
    # helps with a partition it does not own: 4,999-8,828 records of its chunks in 5 s of
    # pause, where a plain consumer so paused hands out nothing
    topic = topic_factory(1)
    with _owner_and_helper(kafka_cluster, topic, unique_group, protocol, kip848) as (
        owner,
        helper,
    ):
        by_owner: set[int] = set()
        by_helper: set[int] = set()
        helper.subscribe([topic])

        both = partial(_turn, owner, helper, by_owner, by_helper)

        _until(lambda: len(by_helper) >= 1000, both, 60, "the helper read no chunks")
        helper.pause(helper.assignment())  # its assignment is empty: it only helps
        paused: set[int] = set()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            _read(helper, paused, 500)
            _slow_owner(owner, by_owner)
        assert not paused, f"{len(paused)} records handed out while paused"
        helper.resume(helper.assignment())
        _until(lambda: len(by_owner | by_helper) >= BACKLOG, both, 90,
               lambda: f"{BACKLOG - len(by_owner | by_helper)} never delivered")  # fmt: skip
