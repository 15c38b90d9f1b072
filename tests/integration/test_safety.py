"""Regression tests for commit-safety violations found in 3de71a6 (fastrebalance's S1/S2 promise).

Each test tells one story in the KIP's terms ("crash with 0 committed, log end 20000") and
checks only what any plain tool sees: the offset Kafka stores for the user's group (read with
a plain confluent-kafka consumer) and what a restarted consumer delivers. The promise under
test (S1/S2): the stored offset never passes a record the application has not processed, and
every record not processed is delivered again after a restart.

"Processed" is what the application declared through commit(): records merely handed to it
by poll()/consume() are not processed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Message
from confluent_kafka import Consumer as PlainConsumer

from fastrebalance import Consumer, KafkaError, KafkaException, TopicPartition

from .helpers import (
    base_conf,
    close_member,
    drain,
    group_metadata,
    group_offsets,
    produce,
    swap_primary,
)

pytestmark = pytest.mark.integration

_REBALANCING = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.STALE_MEMBER_EPOCH,
}


# ----------------------------------------------------------------------------- helpers
def _crash_with_committed(bs: str, group: str, topic: str, committed: dict[int, int]) -> None:
    """A previous incarnation that processed up to ``committed[p]`` on each partition and
    died. Written by an assign()-only consumer before anybody subscribes to ``group``."""
    c = Consumer(base_conf(bs, group))
    tps = [TopicPartition(topic, p, o) for p, o in committed.items()]
    c.assign(tps)
    c.commit(offsets=tps, asynchronous=False)
    c.close()


def _regain(bs: str, group: str, topic: str, log_end: int, committed: int, **extra: Any):
    """Crash with ``committed`` committed, log end ``log_end``: a new Consumer regains
    partition 0 by assign() (the same catch-up planning as a rebalance)."""
    produce(bs, topic, log_end)
    _crash_with_committed(bs, group, topic, {0: committed})
    c = Consumer(base_conf(bs, group, **extra))
    c.assign([TopicPartition(topic, 0)])
    return c


def _first(consumer: Any, offset: int, timeout: float = 30.0) -> Any:
    """poll() until the record at ``offset`` (partition 0) is handed over; return it."""
    got = drain(consumer, lambda ms: any(m.offset() == offset for m in ms), timeout=timeout)
    return next(m for m in got if m.offset() == offset)


def _restart_delivers(
    bs: str, group: str, topic: str, wanted: set[int], partition: int = 0, timeout: float = 60.0
) -> list[int]:
    """A fresh Consumer (mode on) on ``group`` regains ``partition``: the offsets of
    ``wanted`` it does not deliver within ``timeout`` (sorted; empty when all came)."""
    c = Consumer(base_conf(bs, group))
    seen: set[int] = set()
    try:
        c.assign([TopicPartition(topic, partition)])
        deadline = time.monotonic() + timeout
        while not wanted <= seen and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is None and m.partition() == partition:
                    seen.add(m.offset())
    finally:
        c.close()
    return sorted(wanted - seen)


def _assert_safe(bs: str, group: str, topic: str, lowest_unprocessed: int, partition: int = 0):
    stored = group_offsets(bs, group, topic, partition + 1)[partition]
    assert stored <= lowest_unprocessed, (
        f"group offset {stored} passes unprocessed record {lowest_unprocessed}"
    )


def _assert_restart_delivers(bs, group, topic, wanted: set[int], partition: int = 0) -> None:
    missing = _restart_delivers(bs, group, topic, wanted, partition)
    assert not missing, (
        f"restart never delivered {len(missing)} unprocessed records, e.g. {missing[:5]}"
    )


def _wait_group_offset(bs: str, group: str, topic: str, expected: int, timeout: float = 10.0):
    """The stored offset, once it equals ``expected`` or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        stored = group_offsets(bs, group, topic)[0]
        if stored == expected or time.monotonic() > deadline:
            return stored
        time.sleep(0.1)


# ------------------------------------------------ 1. commit after the partition left
@pytest.mark.parametrize("leave", ["unassign", "incremental_unassign"])
def test_commit_after_unassign_keeps_the_backlog(kafka_cluster, topic_factory, unique_group, leave):
    """Crash with 0 committed, log end 20000; one fresh record (20000) arrives and the
    application processes it. The partition leaves the assignment, then the application
    commits that record: the backlog [0, 20000) is still unprocessed and must stay so."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20000)
    _crash_with_committed(bs, unique_group, topic, {0: 0})
    c = Consumer(base_conf(bs, unique_group))
    try:
        if leave == "unassign":
            c.assign([TopicPartition(topic, 0)])
        else:
            c.incremental_assign([TopicPartition(topic, 0)])
        produce(bs, topic, 1, start=20000)
        fresh = _first(c, 20000)  # delivered by the primary, processed by the application
        if leave == "unassign":
            c.unassign()
        else:
            c.incremental_unassign([TopicPartition(topic, 0)])
        c.commit(message=fresh, asynchronous=False)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0)
    finally:
        c.close()
    _assert_restart_delivers(bs, unique_group, topic, set(range(20000)))


@pytest.mark.parametrize("leave", ["unassign", "incremental_unassign"])
def test_commit_after_unassign_of_a_partition_never_committed_keeps_its_log(
    kafka_cluster, topic_factory, unique_group, leave
):
    """The same story for a partition the group never committed, caught up from its log
    start (parallel.rebalance.catchup.uncommitted, earliest): its whole log [0, 20000) is
    the backlog, the primary starts at 20000. The application processes fresh record
    20000, the partition leaves, then it commits that record. The late commit found no
    offset stored and wrote 20001 bare, as if nothing lay below the primary's start: the
    chaos harness's async pipeline saw the group's offset stored past unprocessed records
    this way (seed 2129621139, 112 records below it)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20000)
    conf = base_conf(bs, unique_group, **{"parallel.rebalance.catchup.uncommitted": True})
    c = Consumer(conf)
    try:
        if leave == "unassign":
            c.assign([TopicPartition(topic, 0)])
        else:
            c.incremental_assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((0, 20000),)
        produce(bs, topic, 1, start=20000)
        fresh = _first(c, 20000)  # delivered by the primary, processed by the application
        if leave == "unassign":
            c.unassign()
        else:
            c.incremental_unassign([TopicPartition(topic, 0)])
        assert group_offsets(bs, unique_group, topic) == [OFFSET_INVALID]  # nothing yet
        c.commit(message=fresh, asynchronous=False)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0)
    finally:
        c.close()
    _assert_restart_delivers(bs, unique_group, topic, set(range(20000)))


@pytest.mark.parametrize("before", ["0 committed", "never committed"])
def test_commit_after_revoke_keeps_the_backlog(
    kafka_cluster, topic_factory, unique_group, before
):
    """The same story with a real revoke: crash with 0 committed on two partitions (or
    never committed: the never-committed catch-up, on by default, makes the whole log the
    backlog), log end 5000 each; the first member holds fresh record 5000 of both; a second
    member joins (cooperative-sticky) and one partition is revoked; the first member then
    commits the record it holds of the revoked partition: the chaos harness's
    asynchronous pipeline, whose commits land after its partitions moved."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    for p in (0, 1):
        produce(bs, topic, 5000, partition=p)
    if before == "0 committed":
        _crash_with_committed(bs, unique_group, topic, {0: 0, 1: 0})
    strategy = {"partition.assignment.strategy": "cooperative-sticky"}
    revoked: list[int] = []
    first = Consumer(base_conf(bs, unique_group, **strategy))
    second = None
    try:
        first.subscribe(
            [topic], on_revoke=lambda _c, parts: revoked.extend(tp.partition for tp in parts)
        )
        deadline = time.monotonic() + 30
        while len(first.assignment()) < 2:
            assert time.monotonic() < deadline, "the first member never got both partitions"
            first.poll(0.1)
        for p in (0, 1):
            produce(bs, topic, 1, partition=p, start=5000)
        held: dict[int, Any] = {}
        deadline = time.monotonic() + 30
        while len(held) < 2:
            assert time.monotonic() < deadline, f"fresh records not delivered: {sorted(held)}"
            m = first.poll(0.2)
            if m is not None and m.error() is None and m.offset() == 5000:
                held[m.partition()] = m
        second = PlainConsumer(
            {
                "bootstrap.servers": bs,
                "group.id": unique_group,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                **strategy,
            }
        )
        second.subscribe([topic])
        deadline = time.monotonic() + 60
        while not (revoked and second.assignment()):  # the rebalance is over
            assert time.monotonic() < deadline, "the group never moved a partition"
            first.poll(0.1)
            second.poll(0.1)
        assert len(set(revoked)) == 1, revoked
        p = revoked[0]
        while True:  # as with confluent-kafka, a commit racing a rebalance is retried
            try:
                first.commit(message=held[p], asynchronous=False)
                break
            except KafkaException as exc:
                assert exc.args[0].code() in _REBALANCING, exc
                assert time.monotonic() < deadline, f"commit kept failing: {exc}"
                first.poll(0.2)
                second.poll(0.2)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0, partition=p)
    finally:
        first.close()
        if second is not None:
            close_member(second)
    _assert_restart_delivers(bs, unique_group, topic, set(range(5000)), partition=p)


# ------------------------------------- 2. records of a partition revoked inside consume()
REVOKE_PROTOCOLS = {
    "cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky"},
    "kip848-consumer": {"group.protocol": "consumer"},
}


def _member_conf(bs: str, group: str, protocol: str, **extra: Any) -> dict[str, Any]:
    conf = base_conf(bs, group, **REVOKE_PROTOCOLS[protocol], **extra)
    if protocol == "kip848-consumer":  # the client rejects classic-only keys with KIP-848
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key)
    return conf


def _revoke_inside_a_call(
    bs: str, topic: str, group: str, protocol: str, hold_s: float
) -> dict[str, Any] | None:
    """Crash with 0 committed on two partitions, log end 1000 each, auto-commit on. The
    member drains the backlog but its last 40 records, 730 fresh records arrive, a second
    member joins, and the first member calls consume(800) until a call serves the revoke.

    The revoke must land *inside* a call that has taken records already. Reproduction aid:
    the application's stats_cb is slow (holds the thread up to ``hold_s`` seconds) the first
    time it gets a report that is not the primary's merged one. 3de71a6 hands the child's own
    statistics to stats_cb, served by the child's read between consume()'s two reads of
    the primary: the revoke then arrives after the first read took 700 fresh records. A
    consumer that passes only the primary's statistics never triggers the aid, and the
    checks apply to whichever call serves the revoke.

    Returns what happened in the call that served the revoke; None when the aid fired but
    the revoke came in another call (timing miss: retry with a longer hold)."""
    backlog, fresh_each, keep = 1000, 365, 40
    for p in (0, 1):
        produce(bs, topic, backlog, partition=p)
    _crash_with_committed(bs, group, topic, {0: 0, 1: 0})
    state: dict[str, Any] = {"in_call": False, "revoked_in_call": set(), "armed": False}
    state.update(fired_in_call=False, second=None, second_assigned=False)

    def on_revoke(_c: Any, parts: list[TopicPartition]) -> None:
        if state["in_call"]:
            state["revoked_in_call"] |= {tp.partition for tp in parts}

    def stats_cb(raw: str) -> None:
        if state["armed"] and "fastrebalance" not in json.loads(raw):
            state["armed"] = False
            state["fired_in_call"] = state["in_call"]
            # A slow metrics exporter. While it holds the thread the second member is
            # served, and the hold ends soon after the group has handed out its first
            # assignment (cooperative: the first member's revoke is queued by then).
            end = time.monotonic() + hold_s
            while time.monotonic() < end:
                state["second"].poll(0.05)
                if state["second_assigned"]:
                    end = min(end, time.monotonic() + 0.3)

    # enable.auto.commit: the commit on revoke is the one under test; the periodic one
    # is pushed out of the way.
    conf = _member_conf(
        bs,
        group,
        protocol,
        **{
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 3600000,
            "statistics.interval.ms": 200,
            "stats_cb": stats_cb,
        },
    )
    first = Consumer(conf)
    second = None
    handed: dict[int, set[int]] = {0: set(), 1: set()}

    def take(msgs: list[Any]) -> None:
        for m in msgs:
            if m.error() is None:
                handed[m.partition()].add(m.offset())

    try:
        first.subscribe([topic], on_revoke=on_revoke)
        deadline = time.monotonic() + 60
        while True:  # drain the backlog down to `keep` records, no fresh ones yet
            remaining = 2 * backlog - sum(len(s) for s in handed.values())
            if remaining <= keep:
                break
            assert time.monotonic() < deadline, f"backlog not drained: {remaining} left"
            take(first.consume(min(100, remaining - keep), 0.2))
        assert first.catchup_status(), "precondition: the child has the last 40 records left"
        for p in (0, 1):
            produce(bs, topic, fresh_each, partition=p, start=backlog)
        time.sleep(1.0)  # the primary fetches them
        second = PlainConsumer(
            {k: v for k, v in _member_conf(bs, group, protocol).items() if "parallel" not in k}
        )
        second.subscribe([topic], on_assign=lambda _c, _parts: state.update(second_assigned=True))
        state.update(second=second, armed=True)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "no revoke within 60 s"
            before = {p: set(s) for p, s in handed.items()}
            state["in_call"], state["fired_in_call"] = True, False
            try:
                msgs = first.consume(800, 0.5)
            finally:
                state["in_call"] = False
            if state["revoked_in_call"]:
                break
            if state["fired_in_call"]:
                return None
            take(msgs)
            second.poll(0)
        return {
            "revoked": set(state["revoked_in_call"]),
            "stored": group_offsets(bs, group, topic, 2),  # right after the revoke's commit
            "lowest_unhanded": {
                p: min(o for o in range(backlog + fresh_each + 1) if o not in before[p])
                for p in (0, 1)
            },
            "returned": [(m.partition(), m.offset()) for m in msgs if m.error() is None],
        }
    finally:
        first.close()
        if second is not None:
            close_member(second)


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", list(REVOKE_PROTOCOLS))
def test_revoke_inside_consume_commits_and_returns_only_handed_records(
    kafka_cluster, topic_factory, unique_group, protocol
):
    """(a) the auto-commit on revoke claims only records consume() had returned before
    the call in which the revoke was served; (b) that call returns no record of a
    partition it revoked (confluent-kafka never does)."""
    bs = kafka_cluster.bootstrap_servers
    seen = None
    for attempt, hold_s in enumerate((7.0, 10.0, 14.0)):
        group = f"{unique_group}-{attempt}"
        seen = _revoke_inside_a_call(bs, topic_factory(2), group, protocol, hold_s)
        if seen is not None:
            break
    if seen is None:
        pytest.skip("the revoke never arrived while the slow stats_cb held the consume() call")
    problems = [
        f"(a) the revoke committed partition {p} at {seen['stored'][p]}, past record "
        f"{seen['lowest_unhanded'][p]} that consume() had not returned yet"
        for p in sorted(seen["revoked"])
        if seen["stored"][p] > seen["lowest_unhanded"][p]
    ]
    leaked = [pm for pm in seen["returned"] if pm[0] in seen["revoked"]]
    if leaked:
        problems.append(
            f"(b) consume() returned {len(leaked)} records of partition(s) "
            f"{sorted(seen['revoked'])} revoked inside the same call, e.g. {leaked[:3]}"
        )
    assert not problems, "; ".join(problems)


class _RevokeMidBatch:
    """The primary handle, except that its next consume() serves a revoke of ``partition``
    after collecting the batch, as librdkafka does when the revoke event sits in the queue
    behind fetched records: inside the callback, position() already counts the batch."""

    def __init__(self, inner: Any, consumer: Any, partition: TopicPartition) -> None:
        self._inner = inner
        self._consumer = consumer
        self._partition = partition
        self.armed = True

    def consume(self, num: int, timeout: float) -> list[Any]:
        msgs = self._inner.consume(num, timeout)
        if self.armed and msgs:
            self.armed = False
            self._consumer._assignments.on_revoke(self, [self._partition])
        return msgs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("path", ["hot", "catching-up"])
def test_a_revoke_inside_a_consume_batch_claims_and_returns_nothing_of_it(
    kafka_cluster, topic_factory, unique_group, path
):
    """The same two checks, deterministically: a revoke served inside the primary's
    consume() with records of the revoked partition already collected for the batch.
    Crash with 0 committed, log end 100 (or 1000: no catch-up below the threshold),
    auto-commit on: 50 fresh records handed out, 50 more arrive, the revoke lands in the
    call that collects them."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    log_end = 1000 if path == "catching-up" else 5
    c = _regain(
        bs, unique_group, topic, log_end, 0,
        **{"enable.auto.commit": True, "auto.commit.interval.ms": 3600000},
        **({} if path == "catching-up" else {"parallel.rebalance.lag.threshold": 100}),
    )  # fmt: skip
    try:
        produce(bs, topic, 50, start=log_end)
        handed: set[int] = set()
        deadline = time.monotonic() + 30
        while not set(range(log_end, log_end + 50)) <= handed:
            assert time.monotonic() < deadline, "fresh records never arrived"
            handed |= {m.offset() for m in c.consume(100, 0.2) if m.error() is None}
        produce(bs, topic, 50, start=log_end + 50)
        time.sleep(1.0)  # fetched by the primary: the next batch collects them
        lowest_unhanded = min(o for o in range(log_end + 101) if o not in handed)
        swap_primary(c, _RevokeMidBatch(c._primary, c, TopicPartition(topic, 0)))
        returned: list[Any] = []
        deadline = time.monotonic() + 30
        while c._primary.armed:
            assert time.monotonic() < deadline, "the batch never came"
            returned += c.consume(100, 0.2)
        assert not [m for m in returned if m.error() is None], "records of a revoked partition"
        stored = _wait_group_offset(bs, unique_group, topic, 0, timeout=2.0)
        assert stored <= lowest_unhanded, (stored, lowest_unhanded)
    finally:
        swap_primary(c, getattr(c._primary, "_inner", c._primary))
        c.close()


# ------------------------------------- 3. late commit of a record from an earlier assignment
def test_late_commit_from_an_earlier_assignment_skips_nothing(
    kafka_cluster, topic_factory, unique_group
):
    """Crash with 0 committed, log end 4000. Assignment A: the child reads [0, 4000), the
    primary starts at 4000; fresh records 4000..5099 arrive and the application holds
    record 5000 (the primary's). The partition is revoked and regained when the log ends
    at 7300 (assignment B: the child reads [0, 7300)); B's child goes past 5000. Then the
    application commits record 5000: it claims A's fresh records [4000, 5000], not B's
    backlog [0, 5000]."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, 4000, 0)
    try:
        produce(bs, topic, 1100, start=4000)
        held = _first(c, 5000)
        c.unassign()  # A ends
        produce(bs, topic, 2200, start=5100)  # log end 7300 when regained
        c.assign([TopicPartition(topic, 0)])  # B
        drain(c, lambda ms: any(m.offset() > 5100 for m in ms))  # B's child passed 5000
        c.commit(message=held, asynchronous=False)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0)
    finally:
        c.close()
    unprocessed = set(range(7300)) - set(range(4000, 5001))
    _assert_restart_delivers(bs, unique_group, topic, unprocessed)


@pytest.mark.parametrize("how", ["assign() again", "revoke inside consume()"])
def test_a_held_record_from_an_assignment_of_unknown_position_skips_nothing(
    kafka_cluster, topic_factory, unique_group, how
):
    """Found by the adversarial review of the rewrite. Crash with 0 committed, log end
    20000; the application holds fresh record 20050 (the primary's) and commits nothing.
    The partition gets a new assignment without a position of the primary to trust: assign()
    of a partition still assigned, or a revoke served inside the primary's consume() (whose
    position also counts the records collected for the batch) and a regain. The new child
    reads [0, 20100) past 20050; the held record is committed: it claims [20000, 20050]."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, 20000, 0)
    try:
        produce(bs, topic, 100, start=20000)
        held = _first(c, 20050)
        if how == "revoke inside consume()":
            swap_primary(c, _RevokeMidBatch(c._primary, c, TopicPartition(topic, 0)))
            deadline = time.monotonic() + 90  # the child hands its 20,000 first
            while c._primary.armed:
                assert time.monotonic() < deadline, "the batch never came"
                c.consume(100, 0.2)
            swap_primary(c, c._primary._inner)
        c.assign([TopicPartition(topic, 0)])
        # the new child (a flag, not a scan of every record so far: 20,000 records)
        passed: list[int] = []
        drain(
            c,
            lambda ms: bool(passed),
            timeout=90,
            on_message=lambda m: passed.append(m.offset()) if 20050 < m.offset() < 20100 else None,
        )
        c.commit(message=held, asynchronous=False)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0)
    finally:
        c.close()
    _assert_restart_delivers(bs, unique_group, topic, set(range(20000)))


# --------------------------------------------- 4. committing the on_assign offset
def test_commit_of_the_primary_start_offset_keeps_the_backlog(
    kafka_cluster, topic_factory, unique_group
):
    """Crash with 0 committed, log end 3000: the primary starts at 3000. The child hands
    over [0, 3000) (not processed yet); the application commits offset 3000, the one it
    was told the primary starts at. That claims nothing of the backlog."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, 3000, 0)
    try:
        start = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        assert start == 3000
        drain(c, lambda ms: len(ms) >= 3000)  # the whole backlog handed, none processed
        c.commit(offsets=[TopicPartition(topic, 0, start)], asynchronous=False)
        _assert_safe(bs, unique_group, topic, lowest_unprocessed=0)
    finally:
        c.close()
    _assert_restart_delivers(bs, unique_group, topic, set(range(3000)))


# ------------------------------------------------------------------- minor items
def test_user_metadata_that_fits_alone_is_accepted_while_a_range_is_pending(
    kafka_cluster, topic_factory, unique_group
):
    """3,990 bytes of user metadata fit the 4,000-byte limit alone, not with a range
    token. confluent-kafka accepts the commit; so must we (storing the safe offset with
    the user's metadata), and later commits must not be poisoned by it."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    produce(bs, topic, 3000, partition=0)
    produce(bs, topic, 100, partition=1)
    _crash_with_committed(bs, unique_group, topic, {0: 0, 1: 100})  # [0, 3000) pending on 0
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        # the child's stream waits: an offset after a fresh record covers the backlog
        # handed out before it, and the backlog must stay pending here
        c._child.pause([(topic, 0)])
        produce(bs, topic, 10, partition=0, start=3000)
        produce(bs, topic, 5, partition=1, start=100)
        drain(
            c,
            lambda ms: {(m.partition(), m.offset()) for m in ms} >= {(0, 3009), (1, 104)},
        )
        user = "m" * 3990
        c.commit(offsets=[TopicPartition(topic, 0, 3005, metadata=user)], asynchronous=False)
        assert group_offsets(bs, unique_group, topic, 2)[0] <= 0, "the backlog is pending"
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.metadata == user, f"committed() returned {len(tp.metadata or '')} bytes"
        # Later commits of that partition, with another partition in the same request.
        c.commit(
            offsets=[TopicPartition(topic, 0, 3010), TopicPartition(topic, 1, 105)],
            asynchronous=False,
        )
        stored = group_offsets(bs, unique_group, topic, 2)
        assert stored[0] <= 0 and stored[1] == 105, stored
    finally:
        c.close()


def test_unassign_auto_commits_like_confluent_kafka(kafka_cluster, topic_factory, unique_group):
    """enable.auto.commit=true: unassign() commits what was handed over. Side by side:
    a plain consumer reads 1500 records from 0 and unassigns (group offset 1500); ours,
    after a crash with 0 committed and log end 3000, hands over 1500 backlog records and
    unassigns: the same 1500."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 3600000}

    def read_1500_then_unassign(c: Any) -> None:
        got = 0
        deadline = time.monotonic() + 30
        while got < 1500:
            assert time.monotonic() < deadline, got
            got += len([m for m in c.consume(1500 - got, 0.2) if m.error() is None])
        c.unassign()

    plain_group = unique_group + "-plain"
    _crash_with_committed(bs, plain_group, topic, {0: 0})
    plain = PlainConsumer(
        {k: v for k, v in base_conf(bs, plain_group, **auto).items() if "parallel" not in k}
    )
    try:
        plain.assign([TopicPartition(topic, 0)])
        read_1500_then_unassign(plain)
        plain_stored = _wait_group_offset(bs, plain_group, topic, 1500)
    finally:
        plain.close()
    assert plain_stored == 1500  # what confluent-kafka does

    _crash_with_committed(bs, unique_group, topic, {0: 0})
    c = Consumer(base_conf(bs, unique_group, **auto))
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status(), "precondition: catching up [0, 3000)"
        read_1500_then_unassign(c)
        ours = _wait_group_offset(bs, unique_group, topic, plain_stored)
        assert ours == plain_stored, f"unassign() committed {ours}, confluent-kafka {plain_stored}"
    finally:
        c.close()


def test_offsets_commit_below_the_backlog_is_a_rewind(kafka_cluster, topic_factory, unique_group):
    """Crash with 100 committed, log end 3000 ([100, 3000) pending). commit(offsets=50)
    rewinds, as with confluent-kafka (which stores 50): the group offset drops to <= 50."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, 3000, 100)
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 50)], asynchronous=False)
        stored = group_offsets(bs, unique_group, topic)[0]
        assert stored <= 50, f"commit(offsets=50) not honoured as a rewind: group offset {stored}"
    finally:
        c.close()


@pytest.mark.parametrize("mode", [False, True], ids=["confluent-kafka", "fastrebalance"])
def test_store_offsets_rewind_and_metadata_are_what_commit_writes(
    kafka_cluster, topic_factory, unique_group, mode
):
    """Repro adv3-03: with enable.auto.offset.store=false, store_offsets(offsets=[80]) then
    store_offsets(offsets=[50, metadata]) is a rewind: the next bare commit() writes 50 and
    that metadata, as librdkafka's stored offset does (both libraries, side by side)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 200)
    conf = base_conf(bs, unique_group, **{"enable.auto.offset.store": False})
    c = Consumer({**conf, "enable.parallel.rebalance": mode})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        drain(c, lambda ms: len(ms) >= 100)
        c.store_offsets(offsets=[TopicPartition(topic, 0, 80)])
        c.store_offsets(offsets=[TopicPartition(topic, 0, 50, metadata="reprocess")])
        c.commit(asynchronous=False)
        assert group_metadata(bs, unique_group, topic) == (50, "reprocess")
    finally:
        c.close()


def test_a_rewind_committed_in_on_assign_is_where_the_assignment_starts(
    kafka_cluster, topic_factory, unique_group
):
    """5000 committed, log end 5100; the application's on_assign rewinds to 1000 (a bug
    fix: reprocess) by commit(offsets=[1000]). confluent-kafka fetches the committed
    offsets after the callback and delivers from 1000: so must we. Reading the logs
    before the callback planned from 5000 and the next commit wrote over the rewind."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 5100)
    _crash_with_committed(bs, unique_group, topic, {0: 5000})

    def rewind(consumer: Any, partitions: list[TopicPartition]) -> None:
        consumer.commit(offsets=[TopicPartition(topic, 0, 1000)], asynchronous=False)

    c = Consumer(base_conf(bs, unique_group, **{"parallel.rebalance.lag.threshold": 1000}))
    try:
        c.subscribe([topic], on_assign=rewind)
        got = drain(c, lambda ms: any(m.offset() == 1000 for m in ms), timeout=30)
        assert any(m.offset() == 1000 for m in got), "the rewound records were not delivered"
        first = min(got, key=lambda m: m.offset())
        c.commit(message=first, asynchronous=False)
        _assert_safe(bs, unique_group, topic, 1001)
    finally:
        c.close()
    _assert_restart_delivers(bs, unique_group, topic, set(range(1001, 5000)))


def test_on_assign_gets_the_offsets_confluent_kafka_passes(
    kafka_cluster, topic_factory, unique_group
):
    """Crash with 1000 committed, log end 3000; subscribe(on_assign=...). confluent-kafka
    passes OFFSET_INVALID (-1001: the committed offset applies), not the planned start."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)

    def assigned_offsets(cls: Any, group: str, conf: dict[str, Any]) -> list[tuple[int, int]]:
        _crash_with_committed(bs, group, topic, {0: 1000})
        got: list[tuple[int, int]] = []
        c = cls(conf)
        try:
            c.subscribe(
                [topic], on_assign=lambda _c, ps: got.extend((p.partition, p.offset) for p in ps)
            )
            deadline = time.monotonic() + 30
            while not got:
                assert time.monotonic() < deadline, "never assigned"
                c.poll(0.1)
        finally:
            close_member(c)  # a plain member's close() right after a rebalance: see helpers
        return got

    plain_group = unique_group + "-plain"
    plain_conf = {k: v for k, v in base_conf(bs, plain_group).items() if "parallel" not in k}
    plain = assigned_offsets(PlainConsumer, plain_group, plain_conf)
    assert plain == [(0, OFFSET_INVALID)]
    ours = assigned_offsets(Consumer, unique_group, base_conf(bs, unique_group))
    assert ours == plain, f"on_assign got {ours}, confluent-kafka passes {plain}"


@pytest.mark.parametrize("backlog", [False, True], ids=["no-backlog", "backlog-pending"])
def test_user_metadata_starting_with_fr_round_trips(
    kafka_cluster, topic_factory, unique_group, backlog
):
    """Metadata is the application's string: "~fr-user-data" comes back from committed()
    as confluent-kafka returns it, whatever it starts with."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    if backlog:  # crash with 0 committed, log end 3000
        c = _regain(bs, unique_group, topic, 3000, 0)
        offset = 3000
    else:  # never committed, read in order (no catch-up from the log start)
        produce(bs, topic, 100)
        c = Consumer(
            base_conf(bs, unique_group, **{"parallel.rebalance.catchup.uncommitted": False})
        )
        c.assign([TopicPartition(topic, 0)])
        offset = 50
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset, "~fr-user-data")], asynchronous=False)
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.metadata == "~fr-user-data", f"committed() returned metadata {tp.metadata!r}"
        assert tp.offset == (0 if backlog else 50)
    finally:
        c.close()


def test_stats_cb_gets_the_primary_statistics_only(kafka_cluster, topic_factory, unique_group):
    """Crash with 1000 committed, log end 5000, statistics every 100 ms: every report the
    application's stats_cb receives is the primary's (client.id "safety-app", with the
    "fastrebalance" object), never the child's own ("safety-app-catchup")."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    reports: list[dict[str, Any]] = []
    c = _regain(
        bs,
        unique_group,
        topic,
        5000,
        1000,
        **{
            "client.id": "safety-app",
            "statistics.interval.ms": 100,
            "stats_cb": lambda raw: reports.append(json.loads(raw)),
        },
    )
    try:
        assert c.child_consumer_is_alive()
        deadline = time.monotonic() + 1.5  # a dozen intervals, child alive throughout
        while time.monotonic() < deadline:
            c.poll(0.05)
    finally:
        c.close()
    assert reports, "no statistics"
    clients = sorted({r.get("client_id") for r in reports})
    assert clients == ["safety-app"], f"stats_cb received statistics of {clients}"
    assert all("fastrebalance" in r for r in reports)


# ------------------------------------------------ adversary round 4
def test_a_bare_commit_right_after_a_reassignment_claims_nothing_of_the_backlog(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv4-02: right after assign() of a partition already assigned, librdkafka's
    position() sometimes still reports the previous assignment's position. A bare commit
    at that moment must not credit the new assignment (started at OFFSET_BEGINNING) with
    it: that claimed the child's unread backlog. A race: repeated for up to 25 rounds
    (before the fix it hit within about 10)."""
    from confluent_kafka import OFFSET_BEGINNING

    from fastrebalance._planning import restore

    from .helpers import group_metadata

    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)
    _crash_with_committed(bs, unique_group, topic, {0: 0})
    c = Consumer(base_conf(bs, unique_group))
    produced, handed = 3000, set()
    deadline = time.monotonic() + 25
    try:
        for _ in range(25):
            if time.monotonic() > deadline:
                break
            c.assign([TopicPartition(topic, 0)])  # plans: primary at the end, child from 0
            start = produced
            produce(bs, topic, 300, start=produced)
            produced += 300
            got = drain(c, lambda ms, s=start: sum(m.offset() >= s for m in ms) >= 50)
            handed |= {m.offset() for m in got}
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            try:
                c.commit(asynchronous=False)  # nothing of this assignment was handed out
            except KafkaException as exc:
                assert exc.args[0].code() == KafkaError._NO_OFFSET, exc
                continue
            offset, metadata = group_metadata(bs, unique_group, topic)
            ledger = restore(offset, metadata, -1001, "").ledger()
            wrong = [o for o in range(start) if not ledger.unprocessed(o) and o not in handed]
            assert not wrong, f"{len(wrong)} records never handed out claimed: {wrong[:5]}"
    finally:
        c.close()


def test_a_refused_incremental_assign_or_unassign_changes_nothing(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv4-04: librdkafka refuses incremental_assign() of a partition already
    assigned (and incremental_unassign() of one that is not) and keeps its assignment; so
    must we, with the same error, before retiring anything: the catch-up goes on."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    produce(bs, topic, 3000)
    _crash_with_committed(bs, unique_group, topic, {0: 0})
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.incremental_assign([TopicPartition(topic, 0)])
        assert c.catchup_status(), "precondition: a catch-up of [0, 3000)"
        with pytest.raises(KafkaException) as refused:
            c.incremental_assign([TopicPartition(topic, 1), TopicPartition(topic, 0)])
        assert refused.value.args[0].code() == KafkaError._CONFLICT
        with pytest.raises(KafkaException) as refused:
            c.incremental_unassign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        assert refused.value.args[0].code() == KafkaError._INVALID_ARG
        assert [(tp.topic, tp.partition) for tp in c.assignment()] == [(topic, 0)]
        got = drain(c, lambda ms: len({m.offset() for m in ms}) >= 3000)
        assert {m.offset() for m in got} == set(range(3000)), "the catch-up stopped"
        c.commit(asynchronous=False)
        assert group_offsets(bs, unique_group, topic)[0] == 3000
    finally:
        c.close()


def test_auto_commit_interval_zero_disables_the_periodic_commit(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv4-03: auto.commit.interval.ms=0 is librdkafka's "0 = disable": no commit
    while polling, as confluent-kafka; close() still commits what was handed out."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 200)
    conf = {"enable.auto.commit": True, "auto.commit.interval.ms": 0}
    c = Consumer(base_conf(bs, unique_group, **conf))
    c.assign([TopicPartition(topic, 0, 0)])
    drain(c, lambda ms: len(ms) >= 200)
    for _ in range(10):
        c.poll(0.05)
    assert group_offsets(bs, unique_group, topic)[0] == OFFSET_INVALID
    c.close()
    assert group_offsets(bs, unique_group, topic)[0] == 200


# ------------------------------------------------ adversary round 5
def OFFSET_TAIL(n: int) -> int:  # librdkafka's RD_KAFKA_OFFSET_TAIL(n)
    return -2000 - n


def _group_ledger(bs: str, group: str, topic: str) -> Any:
    from fastrebalance._planning import restore

    from .helpers import group_metadata

    offset, metadata = group_metadata(bs, group, topic)
    child, child_metadata = group_metadata(bs, group + ".catchup", topic)
    return restore(offset, metadata, child, child_metadata).ledger()


def test_a_seek_to_offset_tail_claims_from_where_the_primary_landed(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv5-01: during a catch-up of [0, 3000), with backlog records handed out but
    not processed, seek(OFFSET_TAIL(n)) lands the primary at 1000. Its run was recorded at
    F (3000), so committing the primary's copy of 1100 claimed [0, 1100]. It starts at its
    first record now: [1000, 1100] is claimed, nothing below."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, 3000, 0)
    try:
        produce(bs, topic, 100, start=3000)
        drain(c, lambda ms: sum(m.offset() < 3000 for m in ms) >= 1500)  # held, unprocessed
        c.seek(TopicPartition(topic, 0, OFFSET_TAIL(3100 - 1000)))
        got = drain(c, lambda ms: any(m.offset() == 1100 for m in ms))
        mine = [m for m in got if 1000 <= m.offset() <= 1100]
        assert min(m.offset() for m in mine) == 1000
        # The record named by its offset alone (a Message built again): both streams
        # handed 1100 out, so which delivery is meant is not known and the commit claims
        # only what both streams' claims agree on. (The primary's own copy, the object
        # poll() returned, also claims the backlog the child handed out before it: a
        # commit covers every record of the partition handed out before the committed one.)
        assert any(m.offset() == 1100 for m in mine)
        c.commit(message=Message(topic=topic, partition=0, offset=1100), asynchronous=False)
        ledger = _group_ledger(bs, unique_group, topic)
        wrong = [o for o in range(1000) if not ledger.unprocessed(o)]
        assert not wrong, f"{len(wrong)} unprocessed records claimed: {wrong[:5]}"
    finally:
        c.close()


def _leave_a_pending_backlog(bs: str, group: str, topic: str) -> set[int]:
    """The group's token holds a pending backlog below 3000, 150 fresh records above it: a
    member skipped the backlog, committed a fresh record and left (3150 records in the
    log). The offsets still pending: the backlog records its child handed out before
    that fresh record are claimed with it (on a loaded machine, a few hundred)."""
    a = _regain(bs, group, topic, 3000, 0)
    produce(bs, topic, 150, start=3000)
    got = drain(a, lambda ms: any(m.offset() >= 3000 for m in ms))
    a.commit(message=next(m for m in got if m.offset() >= 3000), asynchronous=False)
    a.close()  # a fresh record committed: the token holds the backlog below it
    ledger = _group_ledger(bs, group, topic)
    pending = {o for o in range(3000) if ledger.unprocessed(o)}
    assert pending, "precondition: a pending backlog"
    return pending


def test_assign_at_offset_tail_keeps_the_pending_backlog(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv5-02: a pending backlog [0, n) in the token; the application assigns
    OFFSET_TAIL(20). It was planned as an absolute start (0): the child was not started
    and the first bare commit claimed the whole backlog. Now the backlog stays pending and
    the child reads it, as with OFFSET_END."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    pending = _leave_a_pending_backlog(bs, unique_group, topic)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_TAIL(20))])
        got = drain(c, lambda ms: sum(m.offset() >= 3130 for m in ms) >= 20)
        handed = {m.offset() for m in got}
        c.commit(asynchronous=False)  # claims what was handed out
        ledger = _group_ledger(bs, unique_group, topic)
        wrong = sorted(o for o in pending if not ledger.unprocessed(o) and o not in handed)
        assert not wrong, f"{len(wrong)} backlog records never delivered claimed: {wrong[:5]}"
        assert any(o < 3000 for o in handed) or c.catchup_status(), "the child never started"
    finally:
        c.close()


def test_committed_reports_unknown_partitions_as_confluent_kafka(
    kafka_cluster, topic_factory, unique_group
):
    """Repro adv5-04: committed() of a topic or partition the cluster does not know
    answers exactly as confluent-kafka does, side by side: -1001 with UNKNOWN_TOPIC_OR_PART
    on the mock (the fastrebalance answer was error=None there), -1001 with no error on
    Apache Kafka, whose OffsetFetch does not check that the partition exists."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    asked = [TopicPartition(f"{topic}-missing", 0), TopicPartition(topic, 7)]
    answers = []
    for mode in (False, True):
        c = Consumer({**base_conf(bs, unique_group), "enable.parallel.rebalance": mode})
        try:
            got = c.committed(asked, timeout=10)
        finally:
            c.close()
        answers.append([(tp.offset, tp.error and tp.error.code()) for tp in got])
    assert answers[1] == answers[0], answers
    assert all(offset == -1001 for offset, _ in answers[0]), answers
    codes = {code for _, code in answers[0]}
    expected = KafkaError.UNKNOWN_TOPIC_OR_PART if kafka_cluster.kind == "embedded" else None
    assert codes == {expected}, answers


def test_first_record_of_a_run_begun_inside_a_hot_path_call_places_the_run(
    kafka_cluster, topic_factory, unique_group
):
    """The hot path hands the primary's record straight back. When a rebalance callback
    inside that very call begins a run whose start is unknown (OFFSET_TAIL here), the
    record it returns is the run's first: it must still say where the run starts, or
    the run is placed one record late and that record is never credited (a commit of it
    claims nothing; the group redelivers it after every restart)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    pending = _leave_a_pending_backlog(bs, unique_group, topic)
    c = Consumer(base_conf(bs, unique_group))
    raw_poll = c._delivery._primary_poll
    calls = 0

    def poll_with_a_rebalance_inside(timeout: float) -> Any:
        # what librdkafka does when the group's assignment arrives inside poll(): the
        # rebalance callback runs on this thread, then the same call returns a record
        nonlocal calls
        calls += 1
        if calls == 1:
            c.assign([TopicPartition(topic, 0, OFFSET_TAIL(20))])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                m = raw_poll(1.0)
                if m is not None and m.error() is None:
                    return m
            raise AssertionError("no record after the assignment")
        return raw_poll(timeout)

    c._delivery._primary_poll = poll_with_a_rebalance_inside
    try:
        assert c._delivery.steady, "precondition: the call takes the hot path"
        first = c.poll(1.0)
        assert first is not None and first.offset() == 3130, first
        c.commit(message=first, asynchronous=False)
        ledger = _group_ledger(bs, unique_group, topic)
        assert not ledger.unprocessed(3130), "the run's first record, committed, not credited"
        claimed = sorted(o for o in pending if not ledger.unprocessed(o))
        assert not claimed, f"backlog never handed out claimed: {claimed[:5]}"
    finally:
        c.close()
