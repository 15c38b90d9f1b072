"""Liveness: a catch-up always ends, and nothing blocks or gives up on a broker problem.

* A backlog range whose end is a transaction control record (the commit or abort marker a
  transactional producer leaves, which no consumer ever receives) still finishes: once the
  application has processed and committed what it was handed, the group's offset reaches the
  log end and ``catchup_status()`` is empty, under either isolation level, with explicit
  commits and with auto-commit.
* ``poll()`` returns within its timeout plus a small bound on a hung broker, even when a
  rebalance callback (``unsubscribe()`` -> revoke -> auto-commit) has to commit.
* A child restart during a broker outage neither raises from ``poll()`` nor abandons the
  backlog: the catch-up resumes by itself once the broker is back.

Mock cluster facts these tests lean on (measured, confluent-kafka 2.16.1 / librdkafka 2.16.0):
``init_transactions``, ``begin_transaction``, ``commit_transaction`` and ``abort_transaction``
all work; each ends a transaction with one control record (the log end counts it). The mock
always answers a Fetch with LastStableOffset = high watermark and no aborted-transaction list,
so a read_committed consumer still receives aborted records there (a real broker filters them):
on the mock, the aborted-tail cases exercise the trailing abort marker, not the filtering.
A plain confluent-kafka consumer commits the high watermark (past the marker) after reading
such a log, under either isolation level.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Producer

from fastrebalance import Consumer, TopicPartition
from fastrebalance.testing import OwnCluster, open_own_cluster

from .helpers import base_conf, close_member, group_offsets, produce

pytestmark = pytest.mark.integration


def _crash_with_committed(bs: str, group: str, topic: str, committed: int) -> None:
    """A previous incarnation that processed up to ``committed`` and then died."""
    c = Consumer(base_conf(bs, group))
    c.assign([TopicPartition(topic, 0, committed)])
    c.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
    c.close()


def _high_watermark(bs: str, topic: str) -> int:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": "liveness-watermarks"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        c.close()


# ------------------------------------------------------ transaction markers at range ends
PLAIN, TXN, COMMITTED = 150, 100, 50  # log: 150 plain, 100 transactional, 1 marker


def _transactional_tail(bs: str, topic: str, count: int, outcome: str) -> None:
    """``count`` records in one transaction, then its commit or abort marker."""
    p = Producer({"bootstrap.servers": bs, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(count):
        p.produce(topic, value=f"tx{i}".encode(), partition=0)
    # Into the log before the outcome: abort_transaction() purges what is still unsent.
    assert p.flush(30) == 0
    if outcome == "commit":
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


@pytest.mark.parametrize("commit_mode", ["commit-sync", "auto-commit"])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
@pytest.mark.parametrize("tail", ["commit", "abort"])
def test_catchup_ending_in_a_transaction_marker_ends(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    tail: str,
    isolation: str,
    commit_mode: str,
) -> None:
    """Crash with 50 committed; the log then ends with a transaction and its marker, on a
    quiet partition. The child reads [50, 251) and receives records up to 249 at most: the
    marker at 250 is never delivered to anyone. The catch-up must still end."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, PLAIN)
    _transactional_tail(bs, topic, TXN, tail)
    # The coordinator writes the marker after EndTxn has answered: until then a
    # read_committed watermark is the last stable offset, 150 (seen once on Kafka 3.9 under
    # load). Wait for the marker rather than race it.
    deadline = time.monotonic() + 30
    while (high := _high_watermark(bs, topic)) < PLAIN + TXN + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert high == PLAIN + TXN + 1, "one control record ends the transaction"
    _crash_with_committed(bs, unique_group, topic, COMMITTED)

    # What must be handed over: every plain record of the backlog, and the transaction's
    # records unless a real broker would filter them (aborted, read_committed; the mock
    # does not filter, so they may come too).
    must = set(range(COMMITTED, PLAIN))
    if not (tail == "abort" and isolation == "read_committed"):
        must |= set(range(PLAIN, PLAIN + TXN))

    extra: dict[str, Any] = {"isolation.level": isolation}
    if commit_mode == "auto-commit":
        extra.update({"enable.auto.commit": True, "auto.commit.interval.ms": 200})
    c = Consumer(base_conf(bs, unique_group, **extra))
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((COMMITTED, high),)
        delivered: set[int] = set()
        stored: list[int] = []
        last_commit = 0.0
        deadline = time.monotonic() + 30
        while True:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                delivered.add(m.offset())
            now = time.monotonic()
            if now - last_commit < 0.5:
                continue
            last_commit = now
            if commit_mode == "commit-sync":
                # the application commits what it was handed, on a timer
                try:
                    c.commit(asynchronous=False)
                except KafkaException as exc:  # nothing handed yet
                    assert exc.args[0].code() == KafkaError._NO_OFFSET, exc
            status = c.catchup_status()
            if must <= delivered and not status:
                stored = group_offsets(bs, unique_group, topic)
                if stored == [high]:
                    break
            if now > deadline:
                pytest.fail(
                    f"catch-up never ended within 30s: catchup_status()={status}, "
                    f"group offset {group_offsets(bs, unique_group, topic)} (log end {high}), "
                    f"{len(must - delivered)} required records undelivered, "
                    f"child alive={c.child_consumer_is_alive()}"
                )
        assert delivered <= set(range(COMMITTED, PLAIN + TXN)), "nothing beyond the data"
        assert c.child_consumer_is_alive(), "the child stays on standby"
    finally:
        c.close()
    # and the finished catch-up survives the close: nothing left pending for a restart
    assert group_offsets(bs, unique_group, topic) == [high]


# ----------------------------------------------------------- hung or unreachable broker
@pytest.fixture(scope="module")
def own_cluster() -> Iterator[OwnCluster]:
    """A cluster these tests may pause and take down without disturbing the others."""
    cluster = open_own_cluster()
    try:
        yield cluster
    finally:
        if cluster.paused:
            cluster.resume()
        cluster.close()


@pytest.fixture
def broker(own_cluster: OwnCluster) -> Iterator[OwnCluster]:
    try:
        yield own_cluster
    finally:  # whatever the test did, hand the next one a healthy broker
        if own_cluster.paused:
            own_cluster.resume()
        own_cluster.broker_up(-1)


class _Timed(threading.Thread):
    """Runs ``fn`` on a daemon thread, so that a call that hangs fails the test instead of
    hanging the suite. The consumer is only touched by this thread while it runs."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        super().__init__(name=f"liveness-{name}", daemon=True)
        self._fn = fn
        self.elapsed: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            self._fn()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.elapsed = time.monotonic() - started


HUNG_POLL_BOUND_S = 10.0  # target: poll(1.0) returns within a few seconds
HUNG_WAIT_S = 30.0  # how long the test waits before calling it a hang


def test_poll_returns_on_a_hung_broker_after_unsubscribe(
    broker: OwnCluster, unique_group: str
) -> None:
    """unsubscribe() with the broker hung: the next poll(1.0) runs on_revoke, whose
    auto-commit must not hold it (confluent-kafka's own poll(1.0) returns in ~1 s)."""
    bs = broker.bootstrap_servers
    topic = f"hung-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, 3000)
    _crash_with_committed(bs, unique_group, topic, 0)  # a 3000-record catch-up on assignment
    ours = Consumer(base_conf(bs, unique_group, **{"enable.auto.commit": True}))
    plain = PlainConsumer(
        {
            "bootstrap.servers": bs,
            "group.id": unique_group + "-plain",
            "enable.auto.commit": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    threads: list[_Timed] = []
    try:
        ours.subscribe([topic])
        plain.subscribe([topic])
        got = {"ours": 0, "plain": 0}
        deadline = time.monotonic() + 30
        while got["ours"] < 50 or got["plain"] < 50:
            assert time.monotonic() < deadline, f"no assignment/records within 30s: {got}"
            for name, c in (("ours", ours), ("plain", plain)):
                m = c.poll(0.05)
                if m is not None and m.error() is None:
                    got[name] += 1
        status = ours.catchup_status()
        assert status.get((topic, 0)) is not None, "a catch-up is under way"

        broker.pause()
        try:
            timings: dict[str, float | None] = {}

            def steps(c: Any, name: str) -> Callable[[], None]:
                def run() -> None:
                    started = time.monotonic()
                    c.unsubscribe()
                    timings[name + " unsubscribe"] = time.monotonic() - started
                    started = time.monotonic()
                    c.poll(1.0)
                    timings[name] = time.monotonic() - started

                return run

            threads = [_Timed("ours", steps(ours, "ours")), _Timed("plain", steps(plain, "plain"))]
            give_up = time.monotonic() + HUNG_WAIT_S
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(give_up - time.monotonic(), 0.1))
            print(f"hung broker, unsubscribe() then poll(1.0), seconds: {timings}")
            for t in threads:
                assert t.error is None, (t.name, t.error)
            assert timings.get("plain") is not None and timings["plain"] < HUNG_POLL_BOUND_S
            assert timings.get("ours unsubscribe", HUNG_WAIT_S) < HUNG_POLL_BOUND_S, timings
            assert timings.get("ours") is not None, (
                f"poll(1.0) still blocked after {HUNG_WAIT_S:g}s on a hung broker "
                f"(confluent-kafka's returned in {timings['plain']:.1f}s)"
            )
            assert timings["ours"] < HUNG_POLL_BOUND_S, timings
        finally:
            broker.resume()
    finally:
        # A call still blocked finishes once the broker answers; never close a consumer
        # another thread is still inside (leave it to the garbage collector instead).
        for t in threads:
            t.join(60)
        if not any(t.is_alive() for t in threads):
            ours.close()
            close_member(plain)  # after a hung broker: a plain close() can wait for ever


def _simulate_child_crash(consumer: Consumer) -> None:
    """Stands for a fatal error of the child's librdkafka handle (its error_cb flags the
    child for a restart, which the next poll() carries out). A user cannot crash the child
    directly; this is the single internal hook the tests use for it: re-point it here if
    the internals change."""
    child = consumer._child
    # fail loudly if the hook moved: a silent no-op would let the test pass without a crash
    assert child is not None and hasattr(child, "_needs_restart"), "re-point this hook"
    child._needs_restart = True


BACKLOG = 5000


def test_child_restart_during_a_broker_outage_resumes_the_catchup(
    broker: OwnCluster, unique_group: str
) -> None:
    """Manual assignment, 5000-record backlog, the child reading; the broker goes away and
    the child crashes. poll() must not raise meanwhile, and once the broker is back the
    whole backlog is delivered (nothing else would ever restart it under assign())."""
    bs = broker.bootstrap_servers
    topic = f"restart-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, BACKLOG)
    _crash_with_committed(bs, unique_group, topic, 0)
    c = Consumer(base_conf(bs, unique_group))
    raised: list[str] = []
    delivered: set[int] = set()
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((0, BACKLOG),)
        deadline = time.monotonic() + 30
        while len(delivered) < 100:
            assert time.monotonic() < deadline, f"only {len(delivered)} records within 30s"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                delivered.add(m.offset())

        broker.broker_down(-1)
        try:
            _simulate_child_crash(c)
            outage_end = time.monotonic() + 15
            longest = 0.0
            while time.monotonic() < outage_end:
                started = time.monotonic()
                try:
                    m = c.poll(0.5)
                except KafkaException as exc:
                    raised.append(f"during the outage: {exc}")
                    continue
                finally:
                    longest = max(longest, time.monotonic() - started)
                if m is not None and m.error() is None:
                    delivered.add(m.offset())
            print(f"broker down, child restarting: longest poll(0.5) took {longest:.1f}s")
        finally:
            broker.broker_up(-1)

        deadline = time.monotonic() + 60
        while len(delivered) < BACKLOG and time.monotonic() < deadline:
            try:
                m = c.poll(0.2)
            except KafkaException as exc:
                raised.append(f"after the outage: {exc}")
                continue
            if m is not None and m.error() is None:
                delivered.add(m.offset())
        missing = set(range(BACKLOG)) - delivered
        assert not raised and not missing, (
            f"poll() raised {len(raised)} times {raised[:3]}; {len(missing)} of {BACKLOG} "
            f"backlog records never delivered within 60s of the broker's return; "
            f"catchup_status()={c.catchup_status()}"
        )
    finally:
        c.close()
