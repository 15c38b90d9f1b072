"""commit(message=m), commit(offsets=[m.offset() + 1]) and store_offsets(message=m) with the
auto-commit cover every record of m's partition handed out before m, whichever stream
handed it out (issue 45, point 5): the everyday loop of a plain consumer, committing the
last record it processed while fresh records keep arriving, moves the group's offset to
the end of what it processed, with group-wide catch-up on and off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from fastrebalance.testing import KafkaCluster
from fastrebalance.testing._groupchaos import prepare

from .helpers import base_conf, group_offsets

BACKLOG = 6_000
STYLES = ("message", "offsets", "store")


def _conf(
    bootstrap: str, group: str, style: str, group_catchup: bool, protocol: str = "classic"
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "parallel.rebalance.lag.threshold": 500,
        "parallel.rebalance.group.catchup": group_catchup,
        "parallel.rebalance.group.chunk.records": 1000,
    }
    if style == "store":
        extra.update(
            {
                "enable.auto.commit": True,
                "enable.auto.offset.store": False,
                "auto.commit.interval.ms": 200,
            }
        )
    conf = base_conf(bootstrap, group, **extra)
    if protocol == "consumer":  # the client refuses classic-only keys under KIP-848
        conf["group.protocol"] = "consumer"
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key)
    return conf


@contextmanager
def _fresh_records(
    bootstrap: str, topic: str, partitions: int = 1
) -> Iterator[threading.Event]:
    """About 50 fresh records a second per partition until the event is set."""
    stop = threading.Event()

    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while not stop.wait(0.02):
            for partition in range(partitions):
                p.produce(topic, value=b"fresh", partition=partition)
            p.poll(0)
        p.flush(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield stop
    finally:
        stop.set()
        t.join(60)


def _stored(bootstrap: str, group: str, topic: str) -> int:
    return group_offsets(bootstrap, group, topic)[0]


def _first_gap(seen: set[int]) -> int:
    n = 0
    while n in seen:
        n += 1
    return n


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("group_catchup", [False, True], ids=["core", "group"])
@pytest.mark.parametrize("style", STYLES)
def test_committing_the_last_record_covers_every_stream(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    style: str,
    group_catchup: bool,
    protocol: str,
) -> None:
    from fastrebalance import Consumer

    if protocol == "consumer" and not kip848[0]:
        pytest.skip(kip848[1])
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(1)
    prepare(bootstrap, topic, unique_group, BACKLOG)
    c = Consumer(_conf(bootstrap, unique_group, style, group_catchup, protocol))
    seen: set[int] = set()
    last: list[Any] = []
    since = 0

    def commit() -> None:
        m = last[0]
        if style == "message":
            c.commit(message=m, asynchronous=True)
        elif style == "offsets":
            c.commit(offsets=[TopicPartition(topic, 0, m.offset() + 1)], asynchronous=True)
        else:
            c.store_offsets(message=m)

    def step() -> None:
        nonlocal since
        m = c.poll(0.1)
        if m is None or m.error() is not None:
            if last:
                commit()
            return
        seen.add(m.offset())
        last[:] = [m]
        since += 1
        if since >= 500:
            since = 0
            commit()

    def check_safe(stored: int) -> None:
        assert stored <= _first_gap(seen), (stored, _first_gap(seen))

    try:
        c.subscribe([topic])
        with _fresh_records(bootstrap, topic):
            deadline = time.monotonic() + 120
            while not all(o in seen for o in range(BACKLOG)):
                assert time.monotonic() < deadline, f"{len(seen)} records read"
                step()
            for _ in range(20):  # some fresh records after the backlog
                step()
        # the producer stopped: every record read; the offset must reach their end
        end = _first_gap(seen)
        deadline = time.monotonic() + 15
        checked = 0.0
        stored = -1
        while True:
            step()
            end = _first_gap(seen)
            if time.monotonic() >= checked + 0.5:
                checked = time.monotonic()
                stored = _stored(bootstrap, unique_group, topic)
                check_safe(stored)
                if stored >= end and end == max(seen) + 1:
                    break
            assert time.monotonic() < deadline, (
                f"stored {stored}, processed up to {end} (max {max(seen)})",
                c.catchup_status() if group_catchup else None,
            )
    finally:
        c.close()
    stored = _stored(bootstrap, unique_group, topic)
    check_safe(stored)
    assert stored == max(seen) + 1, (stored, max(seen) + 1)


@contextmanager
def _catching_up(cluster: KafkaCluster, topic: str, group: str) -> Iterator[Any]:
    """A member reading a 6,000-record backlog (offsets below BACKLOG) while fresh records
    arrive (BACKLOG and above)."""
    from fastrebalance import Consumer

    bootstrap = cluster.bootstrap_servers
    prepare(bootstrap, topic, group, BACKLOG)
    c = Consumer(_conf(bootstrap, group, "message", group_catchup=False))
    try:
        c.subscribe([topic])
        with _fresh_records(bootstrap, topic):
            yield c
    finally:
        c.close()


def test_a_batch_commit_leaves_the_backlog_records_after_the_committed_one(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str], unique_group: str
) -> None:
    # consume() returns the fresh records first, then the child's: committing the last
    # fresh record claims the backlog of earlier calls, and none of this batch's
    topic = topic_factory(1)
    with _catching_up(kafka_cluster, topic, unique_group) as c:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "no batch held fresh records, then backlog"
            time.sleep(0.05)  # processing: fresh records queue up meanwhile
            batch = [m for m in c.consume(50, 0.5) if m.error() is None]
            fresh = [i for i, m in enumerate(batch) if m.offset() >= BACKLOG]
            if fresh and fresh[0] > 0:
                continue  # backlog first: not the case looked for
            backlog = [m.offset() for m in batch[fresh[-1] + 1 :]] if fresh else []
            if backlog and backlog[0] > 0:
                break
        c.commit(message=batch[fresh[-1]], asynchronous=False)
        assert _stored(kafka_cluster.bootstrap_servers, unique_group, topic) == backlog[0]


def test_committing_an_older_record_claims_nothing_handed_out_after_it(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str], unique_group: str
) -> None:
    # the seek-back recipe commits an older record: the backlog handed out since is not
    # claimed by it (commit(message=), nor commit(offsets=) after it)
    topic = topic_factory(1)
    bootstrap = kafka_cluster.bootstrap_servers
    with _catching_up(kafka_cluster, topic, unique_group) as c:
        backlog: set[int] = set()
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "no fresh record after backlog records"
            assert len(backlog) < BACKLOG - 200, "the backlog went by before a fresh record"
            time.sleep(0.001)  # processing: fresh records arrive between backlog records
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            if m.offset() < BACKLOG:
                backlog.add(m.offset())
            elif len(backlog) >= 10:
                break
        c.commit(message=m, asynchronous=False)
        first = _stored(bootstrap, unique_group, topic)
        assert first == _first_gap(backlog)  # the backlog before m, claimed with it
        more = len(backlog) + 50
        while len(backlog) < more:
            assert time.monotonic() < deadline, f"{len(backlog)} backlog records read"
            time.sleep(0.001)
            n = c.poll(0.5)
            if n is not None and n.error() is None and n.offset() < BACKLOG:
                backlog.add(n.offset())
        c.commit(message=m, asynchronous=False)
        assert _stored(bootstrap, unique_group, topic) == first
        c.commit(offsets=[TopicPartition(topic, 0, m.offset() + 1)], asynchronous=False)
        assert _stored(bootstrap, unique_group, topic) == first


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("group_catchup", [False, True], ids=["core", "group"])
def test_committing_each_partitions_last_record_covers_every_stream(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    group_catchup: bool,
    protocol: str,
) -> None:
    # poll() hands out one record a call: the last record of each partition is mostly
    # not the latest call's, and its commit still covers the other streams before it
    from fastrebalance import Consumer

    if protocol == "consumer" and not kip848[0]:
        pytest.skip(kip848[1])
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(2)
    half = BACKLOG // 2
    for partition in (0, 1):
        prepare(bootstrap, topic, unique_group, half, partition)
    c = Consumer(_conf(bootstrap, unique_group, "message", group_catchup, protocol))
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    last: dict[int, Any] = {}
    since = 0

    def commit() -> None:
        for m in last.values():
            c.commit(message=m, asynchronous=True)

    def step() -> None:
        nonlocal since
        m = c.poll(0.1)
        if m is None or m.error() is not None:
            commit()
            return
        seen[m.partition()].add(m.offset())
        last[m.partition()] = m
        since += 1
        if since >= 500:
            since = 0
            commit()

    def stored() -> list[int]:
        got = group_offsets(bootstrap, unique_group, topic, 2)
        for partition in (0, 1):
            assert got[partition] <= _first_gap(seen[partition]), (partition, got)
        return got

    def done() -> bool:
        return all(
            _first_gap(seen[p]) == max(seen[p]) + 1 == got
            for p, got in zip((0, 1), stored(), strict=True)
        )

    try:
        c.subscribe([topic])
        with _fresh_records(bootstrap, topic, partitions=2):
            deadline = time.monotonic() + 120
            while not all(all(o in seen[p] for o in range(half)) for p in (0, 1)):
                assert time.monotonic() < deadline, [len(seen[p]) for p in (0, 1)]
                step()
            for _ in range(20):
                step()
        deadline = time.monotonic() + 15
        checked = 0.0
        while True:
            step()
            if time.monotonic() >= checked + 0.5:
                checked = time.monotonic()
                if done():
                    break
            assert time.monotonic() < deadline, (
                stored(),
                [max(seen[p]) + 1 for p in (0, 1)],
                c.catchup_status() if group_catchup else None,
            )
    finally:
        c.close()
    assert stored() == [max(seen[p]) + 1 for p in (0, 1)]
