"""Every public call returns within its documented bound on a hung broker.

The bounds (docs/design.md, "Time bounds"), with S = socket.timeout.ms:

| call | bound on a hung broker |
|---|---|
| poll(t), consume(n, t) | t + what a rebalance served inside needs (planning: PLAN_BUDGET_S) |
| commit(asynchronous=True) | immediate (not assigned, or unplanned: S, read first) |
| commit(asynchronous=False) | S, then KafkaException(_TIMED_OUT) |
| committed(timeout) | timeout (S without one) |
| assign(), incremental_assign() | PLAN_BUDGET_S |
| unassign(), store_offsets(), seek(), pause(), resume(), position() | immediate |
| close() | 2 S (+ REVOKE_WAIT_S for a subscribed member) |
| send_offsets_to_transaction(timeout) | timeout, both round trips (+ producer socket.timeout.ms) |

The broker, one of these tests' own (``open_own_cluster``), is SIGSTOPped (``pause()``):
connections stay open and nothing is answered, the worst kind of outage for a client. Bounds
are asserted with a generous margin (a loaded machine), and every elapsed time is printed side
by side with its bound.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from fastrebalance import Consumer, TopicPartition
from fastrebalance._child import ChildState
from fastrebalance.testing import OwnCluster, kip848_supported, open_own_cluster

from .helpers import base_conf, drain, produce, timed

pytestmark = pytest.mark.integration

S = 3.0  # socket.timeout.ms of these tests, seconds
SLACK = 3.0  # a loaded machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[OwnCluster]:
    """A cluster of these tests' own: pausing it disturbs nobody else."""
    k = open_own_cluster()
    try:
        yield k
    finally:
        if k.paused:
            k.resume()
        k.close()



def _catching_up(cluster: OwnCluster, group: str, **extra: Any) -> tuple[Consumer, str, Any]:
    """Crash with 0 committed, log end 3000: a consumer catching up, a fresh record and a
    backlog record in hand."""
    bs = cluster.bootstrap_servers
    topic = f"bounds-{group}"
    cluster.create_topic(topic, 1)
    produce(bs, topic, 3000)
    seed = Consumer(base_conf(bs, group))
    seed.assign([TopicPartition(topic, 0, 0)])
    seed.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    seed.close()
    c = Consumer(base_conf(bs, group, **{"socket.timeout.ms": int(S * 1000), **extra}))
    c.assign([TopicPartition(topic, 0)])
    produce(bs, topic, 10, start=3000)
    got = drain(c, lambda ms: any(m.offset() >= 3000 for m in ms) and any(
        m.offset() < 3000 for m in ms))
    return c, topic, got


def test_every_call_is_bounded_on_a_hung_broker(cluster: OwnCluster, unique_group: str):
    c, topic, got = _catching_up(cluster, unique_group, **{"enable.auto.commit": True})
    fresh = max(got, key=lambda m: m.offset())
    backlog = min(got, key=lambda m: m.offset())
    tp = TopicPartition(topic, 0)
    rows: list[tuple[str, float, float, Any]] = []

    def check(name: str, bound: float, fn: Callable[[], Any]) -> Any:
        elapsed, outcome = timed(fn)
        rows.append((name, elapsed, bound, outcome))
        return outcome

    cluster.pause()
    try:
        check("commit(message, async) fresh", 0.5, lambda: c.commit(message=fresh))
        check("commit(message, async) backlog", 0.5, lambda: c.commit(message=backlog))
        sync = check(
            "commit(message, sync)", S,
            lambda: c.commit(message=fresh, asynchronous=False),
        )  # fmt: skip
        assert isinstance(sync, KafkaException) and sync.args[0].code() == KafkaError._TIMED_OUT
        # an abandoned synchronous commit does not hold the handle: the owner goes on
        check("poll(0.5)", 0.5, lambda: c.poll(0.5))
        check("consume(10, 0.5)", 0.5, lambda: c.consume(10, 0.5))
        check("committed(timeout=1)", 1.0, lambda: c.committed([tp], timeout=1))
        check("committed()", S, lambda: c.committed([tp]))
        check("position()", 0.5, lambda: c.position([tp]))
        check("pause()", 0.5, lambda: c.pause([tp]))
        check("resume()", 0.5, lambda: c.resume([tp]))
        check("seek()", 0.5, lambda: c.seek(TopicPartition(topic, 0, 3005)))
        # the child handle's fatal error (simulated: librdkafka raises none on demand),
        # with a checkpoint commit outstanding: its restart must not wait for the old
        # handle's close()
        assert c._child is not None
        c._child._needs_restart = True
        check("poll(0) restarting the child", 0.5, lambda: c.poll(0))
        assert c._child.handles_created == 2
        check("unassign() (auto-commit)", 0.5, c.unassign)
        check("commit(message, async) after unassign", S, lambda: c.commit(message=fresh))
        check("close()", 2 * S, c.close)
    finally:
        cluster.resume()
    table = "\n".join(
        f"{name:40} {elapsed:6.2f}s  (bound {bound:g}s)  {type(outcome).__name__}"
        + (f" {outcome.args[0].str()}" if isinstance(outcome, KafkaException) else "")
        for name, elapsed, bound, outcome in rows
    )
    print("\n" + table)
    late = [(name, round(e, 2), b) for name, e, b, _ in rows if e > b + SLACK]
    assert not late, f"over their bound: {late}\n{table}"


def test_asyncio_calls_after_an_abandoned_commit_are_bounded(
    cluster: OwnCluster, unique_group: str
):
    """Adversary round 6: with fastrebalance.aio, a synchronous commit abandoned after S
    on a hung broker kept confluent-kafka's per-handle gate under the identity of the call
    that made it, and the next awaited poll(1.0) waited for the broker (60 s, until it was
    resumed). Every top-level call now presents the consumer's one identity, as the sync
    facade's owner thread does."""
    import asyncio

    from fastrebalance.aio import AIOConsumer

    c, topic, _ = _catching_up(cluster, unique_group)
    c.close()
    rows: list[tuple[str, float, float]] = []

    async def run() -> None:
        a = AIOConsumer(base_conf(cluster.bootstrap_servers, unique_group, **{
            "socket.timeout.ms": int(S * 1000)}))
        try:
            await a.assign([TopicPartition(topic, 0)])
            m = None
            deadline = time.monotonic() + 30
            while m is None or m.error() is not None:
                assert time.monotonic() < deadline, "no record within 30 s"
                m = await a.poll(1.0)
            cluster.pause()
            try:
                for name, bound, call in (
                    ("commit(sync)", S, lambda: a.commit(message=m, asynchronous=False)),
                    ("poll(1.0)", 1.0, lambda: a.poll(1.0)),
                    ("consume(10, 1.0)", 1.0, lambda: a.consume(10, 1.0)),
                    ("commit(async)", 0.5, lambda: a.commit(message=m)),
                ):
                    began = time.monotonic()
                    with contextlib.suppress(KafkaException):
                        await asyncio.wait_for(call(), 60)
                    rows.append((name, time.monotonic() - began, bound))
            finally:
                cluster.resume()
        finally:
            await a.close()

    asyncio.run(run())
    print("\n" + "\n".join(f"{n:20} {e:6.2f}s (bound {b:g}s)" for n, e, b in rows))
    late = [(n, round(e, 2), b) for n, e, b in rows if e > b + SLACK]
    assert not late, f"over their bound: {late}"


def test_planning_on_a_hung_broker_is_bounded(
    cluster: OwnCluster, unique_group: str, monkeypatch: pytest.MonkeyPatch
):
    """assign() plans inside the call (a rebalance: inside poll()): one budget for all of
    its round trips; the partition then resumes at its committed offset, skipping nothing."""
    import fastrebalance._assigning
    import fastrebalance._planner as planner

    monkeypatch.setattr(planner, "PLAN_BUDGET_S", 3.0)  # the message of its error
    monkeypatch.setattr(fastrebalance._assigning, "PLAN_BUDGET_S", 3.0)  # the budget
    monkeypatch.setattr(planner, "REQUEST_TIMEOUT_S", 1.0)
    bs = cluster.bootstrap_servers
    topic = f"bounds-plan-{unique_group}"
    cluster.create_topic(topic, 1)
    produce(bs, topic, 100)
    c = Consumer(base_conf(bs, unique_group, **{"socket.timeout.ms": int(S * 1000)}))
    cluster.pause()
    try:
        elapsed, outcome = timed(lambda: c.assign([TopicPartition(topic, 0)]))
        print(f"\nassign() on a hung broker: {elapsed:.2f}s (bound 3s)")
        assert outcome is None and elapsed < 3.0 + SLACK, (elapsed, outcome)
    finally:
        cluster.resume()
    try:
        got = drain(c, lambda ms: {m.offset() for m in ms} >= set(range(100)))
        assert min(m.offset() for m in got) == 0
    finally:
        c.close()


def test_exactly_once_defers_what_it_cannot_plan_on_a_hung_broker(
    cluster: OwnCluster, unique_group: str
):
    """Exactly-once never starts a partition it could not plan: resuming at the committed
    offset (the safe one, below processed records whose output exists) would write their
    output twice. assign() on a hung broker returns after the short exactly-once budget;
    the partition stays paused and nothing of it is handed out; once the broker answers, a
    later call plans it: fresh records first, the backlog by the child, from where the
    logs say."""
    from fastrebalance._assigning import EOS_PLAN_S

    bs = cluster.bootstrap_servers
    topic = f"bounds-eos-{unique_group}"
    cluster.create_topic(topic, 1)
    produce(bs, topic, 120)
    seed = Consumer(base_conf(bs, unique_group))
    seed.assign([TopicPartition(topic, 0, 70)])
    seed.commit(offsets=[TopicPartition(topic, 0, 70)], asynchronous=False)
    seed.close()
    eos = {
        "parallel.rebalance.transactional": True,
        "isolation.level": "read_committed",
        "socket.timeout.ms": int(S * 1000),
    }
    c = Consumer(base_conf(bs, unique_group, **eos))
    try:
        cluster.pause()
        try:
            elapsed, outcome = timed(lambda: c.assign([TopicPartition(topic, 0)]))
            print(f"\nassign() on a hung broker (exactly-once): {elapsed:.2f}s")
            assert outcome is None and elapsed < EOS_PLAN_S + SLACK, (elapsed, outcome)
            assert (topic, 0) in c._partitions.deferred and c.catchup_status() == {}
            elapsed, outcome = timed(lambda: c.consume(10, 1.0))
            assert outcome == [] and elapsed < 1.0 + 2 + SLACK, (elapsed, outcome)
        finally:
            cluster.resume()
        produce(bs, topic, 10, start=120)
        got = drain(c, lambda ms: {m.offset() for m in ms} >= set(range(70, 130)), timeout=60)
        offsets = [m.offset() for m in got]
        assert min(offsets) == 70 and len(offsets) == len(set(offsets)), offsets
        # planned once the broker answered: the backlog up to the log end then
        ((start, end),) = c.catchup_status()[(topic, 0)].pending_ranges
        assert start == 70 and end >= 120, (start, end)
    finally:
        c.close()


def test_close_of_a_subscribed_member_is_bounded(cluster: OwnCluster, unique_group: str):
    """close() of a group member leaves the group and serves its revoke (which commits)
    before librdkafka's close(): bounded by REVOKE_WAIT_S and twice S on a hung broker."""
    from fastrebalance._assigning import REVOKE_WAIT_S

    bs = cluster.bootstrap_servers
    topic = f"bounds-sub-{unique_group}"
    cluster.create_topic(topic, 1)
    produce(bs, topic, 100)
    conf = {"socket.timeout.ms": int(S * 1000), "enable.auto.commit": True}
    c = Consumer(base_conf(bs, unique_group, **conf))
    c.subscribe([topic])
    drain(c, lambda ms: len(ms) >= 100)
    cluster.pause()
    try:
        elapsed, outcome = timed(c.close)
        print(f"\nclose() of a member on a hung broker: {elapsed:.2f}s")
        assert outcome is None and elapsed < REVOKE_WAIT_S + 2 * S + SLACK, (elapsed, outcome)
        # the child's close was to follow the primary's, still under way: started anyway
        # (before, the child stayed open and went on connecting long after the test)
        assert c._child.state is ChildState.CLOSED
    finally:
        cluster.resume()


def test_an_unplanned_partition_claims_only_what_its_primary_handed_out(
    cluster: OwnCluster, unique_group: str, monkeypatch: pytest.MonkeyPatch
):
    """Repro adv3-01: a partition assigned at the application's own logical start while
    the broker hangs past the planning budget cannot be planned (its token cannot be read).
    It is deferred, then planned once the broker answers: a commit of its first record
    must not claim, and so erase, the backlog still pending in the group's token."""
    import fastrebalance._assigning
    import fastrebalance._planner as planner
    from fastrebalance._planning import restore

    from .helpers import group_metadata

    monkeypatch.setattr(planner, "PLAN_BUDGET_S", 3.0)  # the message of its error
    monkeypatch.setattr(fastrebalance._assigning, "PLAN_BUDGET_S", 3.0)  # the budget
    monkeypatch.setattr(planner, "REQUEST_TIMEOUT_S", 1.0)
    bs = cluster.bootstrap_servers
    a, topic, _ = _catching_up(cluster, unique_group)
    a.commit(asynchronous=False)  # what was handed out: the fresh records, some backlog
    a.close()
    offset, metadata = group_metadata(bs, unique_group, topic)
    pending = restore(offset, metadata, -1001, "").ledger().ranges.as_tuple()
    assert pending, "the test needs a backlog left pending"
    b = Consumer(base_conf(bs, unique_group, **{"socket.timeout.ms": int(S * 1000)}))
    try:
        cluster.pause()
        try:
            elapsed, outcome = timed(lambda: b.assign([TopicPartition(topic, 0, -1)]))  # END
            assert outcome is None and elapsed < 3.0 + SLACK, (elapsed, outcome)
        finally:
            cluster.resume()
        deadline = time.monotonic() + 30
        # what these polls hand out counts as handed out before m: the child's first
        # fetch can land inside the poll that plans the partition (2 of 8 runs)
        got: list[Any] = []
        while not b.catchup_status():  # planned: the child reads the pending backlog
            assert time.monotonic() < deadline, "never planned after the broker answered"
            early = b.poll(0.2)
            if early is not None and early.error() is None:
                got.append(early)
        time.sleep(1.0)  # the primary resolves the log end before these are appended
        produce(bs, topic, 5, start=3010)
        got += drain(b, lambda ms: any(m.offset() >= 3010 for m in ms))
        m = next(m for m in got if m.offset() >= 3010)
        b.commit(message=m, asynchronous=False)
        offset, metadata = group_metadata(bs, unique_group, topic)
        ledger = restore(offset, metadata, -1001, "").ledger()
        print(f"\npending before {pending}; after committing {m.offset()}: "
              f"offset {offset}, pending {ledger.ranges.as_tuple()}")
        # the backlog records handed out before m are claimed with it (a commit covers
        # every record of the partition handed out before the committed one); no other
        before = {x.offset() for x in got[: next(i for i, x in enumerate(got) if x is m)]}
        lost = [
            o
            for s, e in pending
            for o in range(s, e)
            if not ledger.unprocessed(o) and o not in before
        ]
        assert not lost, f"{len(lost)} pending backlog records claimed: {lost[:5]}..."
    finally:
        b.close()


@pytest.mark.kafka4
def test_close_does_not_plan_an_assignment_it_is_leaving(cluster: OwnCluster):
    """Repro adv3-02: under KIP-848 an assignment reaches a member that is not polling
    (another member left); close() serves it while leaving and must not spend the
    planning budget on a hung broker for partitions it gives back at once."""
    from fastrebalance._assigning import REVOKE_WAIT_S

    supported, why = kip848_supported(cluster)
    if not supported:
        pytest.skip(why)
    bs = cluster.bootstrap_servers
    group = f"g-close-plan-{time.monotonic_ns()}"
    topic = f"bounds-close-plan-{group}"
    cluster.create_topic(topic, 2)
    produce(bs, topic, 50, partition=0)
    produce(bs, topic, 50, partition=1)
    conf = {"socket.timeout.ms": int(S * 1000), "group.protocol": "consumer"}
    for key in ("session.timeout.ms", "heartbeat.interval.ms"):
        conf[key] = None
    members = []
    served: list[tuple[str, list[int]]] = []
    for _ in range(2):
        settings = {k: v for k, v in base_conf(bs, group, **conf).items() if v is not None}
        c = Consumer(settings)
        c.subscribe(
            [topic],
            on_assign=lambda _c, ps: served.append(("assign", [p.partition for p in ps])),
            on_revoke=lambda _c, ps: served.append(("revoke", [p.partition for p in ps])),
        )
        members.append(c)
    a, b = members
    deadline = time.monotonic() + 60
    while not (len(a.assignment()) == 1 and len(b.assignment()) == 1):
        assert time.monotonic() < deadline, (a.assignment(), b.assignment())
        a.poll(0.05)
        b.poll(0.05)
    a_first = a.assignment()[0].partition
    b.close()  # its partition goes back to a, which is not polling
    time.sleep(10)  # KIP-848 heartbeats hand a the partition in the background
    del served[:]
    cluster.pause()
    try:
        elapsed, outcome = timed(a.close)
        bound = REVOKE_WAIT_S + 2 * S
        print(f"\nclose() with an assignment queued, hung broker: {elapsed:.2f}s (bound {bound}s)"
              f", served inside: {served}")
        assert ("assign", [1 - a_first]) in served, "the test needs an assignment queued"
        assert outcome is None and elapsed < bound + SLACK, (elapsed, outcome)
    finally:
        cluster.resume()


class _HangsOnSecondCall:
    """A transactional producer whose broker hangs as the second send_offsets_to_transaction
    of one call starts (the catch-up group's): a fault at that precise point, every run.
    The timeouts the consumer passed are kept."""

    def __init__(self, producer: Any, cluster: OwnCluster) -> None:
        self._producer, self._cluster = producer, cluster
        self.timeouts: list[float] = []

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.timeouts.append(timeout)
        if len(self.timeouts) == 2:
            self._cluster.pause()
        self._producer.send_offsets_to_transaction(offsets, metadata, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def test_send_offsets_to_transaction_shares_one_deadline(cluster: OwnCluster, unique_group: str):
    """Repro eosbound: send_offsets_to_transaction(timeout=T) writes both commit logs, one
    producer round trip each, and gave each the full T: on a broker hung through both the
    call took up to twice T and more (16 s for T=10 on Apache Kafka 3.9,
    benchmarks/send_offsets_bound.py). One deadline now: the broker hangs for most of T
    during the first round trip, then again as the second starts; the call ends within T
    plus what librdkafka's own call overruns (an in-flight request keeps the producer's
    socket.timeout.ms), raises, claims nothing, and the transaction aborts: its records
    come again."""
    import threading

    from confluent_kafka import Producer

    T, S_P, FIRST_HANG = 10.0, 2.0, 7.0
    c, topic, got = _catching_up(
        cluster, unique_group,
        **{"parallel.rebalance.transactional": True, "isolation.level": "read_committed"},
    )  # fmt: skip
    assert any(m.offset() < 3000 for m in got), "the test needs backlog records in hand"
    producer = Producer({
        "bootstrap.servers": cluster.bootstrap_servers,
        "transactional.id": f"bounds-{unique_group}",
        "transaction.timeout.ms": 60_000,  # librdkafka caps T with it; the broker's abort too
        "socket.timeout.ms": int(S_P * 1000),
    })  # fmt: skip
    producer.init_transactions(30)
    producer.begin_transaction()
    proxy = _HangsOnSecondCall(producer, cluster)
    cluster.pause()
    resumed = threading.Timer(FIRST_HANG, cluster.resume)
    resumed.start()
    try:
        elapsed, outcome = timed(lambda: c.send_offsets_to_transaction(proxy, got, timeout=T))
    finally:
        cluster.resume()
        resumed.cancel()
        resumed.join()
    print(f"\nsend_offsets_to_transaction(timeout={T:g}) on a broker hung twice: {elapsed:.2f}s "
          f"(bound {T + S_P:g}s), producer timeouts {[round(t, 2) for t in proxy.timeouts]}, "
          f"{type(outcome).__name__}")
    try:
        assert len(proxy.timeouts) == 2, "the test needs both round trips made"
        assert proxy.timeouts[1] <= T - FIRST_HANG + 0.5, proxy.timeouts  # what was left
        assert elapsed < T + S_P + SLACK, (elapsed, outcome)
        # the second round trip could not finish on the hung broker: nothing claimed
        assert isinstance(outcome, KafkaException), outcome
        assert not c._committer.in_open_txn((topic, 0))
        c.abort_transaction(producer, 30)
        again = drain(c, lambda ms: {m.offset() for m in ms} >= {m.offset() for m in got},
                      timeout=60)  # fmt: skip
        assert again
    finally:
        c.close()
