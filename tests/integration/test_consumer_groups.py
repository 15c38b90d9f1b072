"""Catch-up driven by real group rebalances, under each assignment protocol.

Eager (``range``), ``cooperative-sticky`` and KIP-848 (``group.protocol=consumer``)
deliver partitions through different callbacks (assign/revoke all vs incremental),
so the planning and hand-over paths are exercised under each.
"""

from __future__ import annotations

import time

import pytest

from fastrebalance import Consumer, KafkaError, KafkaException, TopicPartition

from .helpers import base_conf, close_member, group_offsets, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka4]

_REBALANCING = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.STALE_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,
}

PROTOCOLS = {
    "eager-range": {"partition.assignment.strategy": "range"},
    "cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky"},
    "kip848-consumer": {"group.protocol": "consumer"},
}


def _conf(bs: str, group: str, protocol: str) -> dict:
    conf = base_conf(bs, group, **PROTOCOLS[protocol])
    if protocol == "kip848-consumer":  # the client rejects classic-only keys with KIP-848
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key)
    return conf


def _seed_commits(bs: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Offsets a crashed member left behind (written before anyone subscribed)."""
    c = Consumer(base_conf(bs, group))
    tps = [TopicPartition(topic, p, o) for p, o in offsets.items()]
    c.assign(tps)
    c.commit(offsets=tps, asynchronous=False)
    c.close()


def _poll_all(consumers, delivered, seconds, commit=True):
    """Drive every consumer from this thread; each handle stays on this one thread."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, c in consumers.items():
            msgs = c.consume(200, 0.05)
            for m in msgs:
                if m.error() is None:
                    delivered[name].append((m.partition(), m.offset()))
            if msgs and commit:
                try:
                    c.commit(asynchronous=False)
                except KafkaException as exc:  # as with confluent-kafka: mid-rebalance
                    assert exc.args[0].code() in _REBALANCING, exc


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_catchup_on_rebalance_assignment(kafka_cluster, topic_factory, unique_group, protocol):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    for p in (0, 1):
        produce(bs, topic, 3000, partition=p)
    _seed_commits(bs, unique_group, topic, {0: 1000, 1: 2500})
    c = Consumer(_conf(bs, unique_group, protocol))
    assigned = []
    c.subscribe([topic], on_assign=lambda cons, parts: assigned.extend(parts))
    delivered = {"c": []}
    try:
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            m = c.poll(0.1)
            # the call that serves the assignment may return the child's first record
            if m is not None and m.error() is None:
                delivered["c"].append((m.partition(), m.offset()))
        # the user's on_assign sees what confluent-kafka passes ("the committed offset");
        # the plan is applied when the callback returns: the primary starts at the log end
        assert sorted((tp.partition, tp.offset) for tp in assigned) == [(0, -1001), (1, -1001)]
        status = c.catchup_status()
        assert status[(topic, 0)].pending_ranges == ((1000, 3000),)
        assert status[(topic, 1)].pending_ranges == ((2500, 3000),)
        for p in (0, 1):
            produce(bs, topic, 100, partition=p, start=3000)
        deadline = time.monotonic() + 60
        while group_offsets(bs, unique_group, topic, 2) != [3100, 3100]:
            assert time.monotonic() < deadline, group_offsets(bs, unique_group, topic, 2)
            _poll_all({"c": c}, delivered, 0.5)
    finally:
        c.close()
    got = set(delivered["c"])
    expected = {(0, o) for o in range(1000, 3100)} | {(1, o) for o in range(2500, 3100)}
    assert expected <= got


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_partition_moves_to_another_member_mid_catchup(
    kafka_cluster, topic_factory, unique_group, protocol
):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    for p in (0, 1):
        produce(bs, topic, 40000, partition=p)
    _seed_commits(bs, unique_group, topic, {0: 0, 1: 0})
    first = Consumer(_conf(bs, unique_group, protocol))
    first.subscribe([topic])
    delivered: dict[str, list] = {"first": [], "second": []}
    second = None
    try:
        deadline = time.monotonic() + 30
        while len(first.catchup_status()) < 2:
            assert time.monotonic() < deadline
            m = first.poll(0.1)
            if m is not None and m.error() is None:  # a record returned here counts too
                delivered["first"].append((m.partition(), m.offset()))
        # A little of the backlog, committed: the rest is pending when the group changes.
        # (A consume() that came back empty leaves nothing to commit: commit() would raise
        # _NO_OFFSET, as confluent-kafka's does; seen on a loaded machine.)
        for _ in range(5):
            got = [m for m in first.consume(200, 1.0) if m.error() is None]
            delivered["first"] += [(m.partition(), m.offset()) for m in got]
            if got:
                first.commit(asynchronous=False)
        assert first.catchup_status(), "still catching up when the second member joins"
        second = Consumer(_conf(bs, unique_group, protocol))
        second.subscribe([topic])
        consumers = {"first": first, "second": second}
        deadline = time.monotonic() + 90
        while not (first.assignment() and second.assignment()):
            assert time.monotonic() < deadline, "the group never split the partitions"
            _poll_all(consumers, delivered, 0.2)
        for p in (0, 1):
            produce(bs, topic, 50, partition=p, start=40000)
        while group_offsets(bs, unique_group, topic, 2) != [40050, 40050]:
            assert time.monotonic() < deadline, group_offsets(bs, unique_group, topic, 2)
            _poll_all(consumers, delivered, 0.5)
        assert second.child_consumer_is_alive(), "the new owner continued the pending ranges"
    finally:
        first.close()
        if second is not None:
            second.close()
    got = set(delivered["first"]) | set(delivered["second"])
    missing = [(p, o) for p in (0, 1) for o in range(40050) if (p, o) not in got]
    assert not missing, missing[:10]
    assert delivered["second"], "the second member took over a partition"


@pytest.mark.parametrize("protocol", ["eager-range", "kip848-consumer"])
def test_close_commits_on_revoke_promptly(kafka_cluster, topic_factory, unique_group, protocol):
    """Auto-commit's last commit happens inside close()'s revoke callback: it must land,
    and close() must not wait for a timeout to do it."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    for p in (0, 1):
        produce(bs, topic, 1000, partition=p)
    conf = {**_conf(bs, unique_group, protocol), "enable.auto.commit": True}
    c = Consumer(conf)
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < 2000:
        assert time.monotonic() < deadline, got
        got += len([m for m in c.consume(500, 0.2) if m.error() is None])
    began = time.monotonic()
    c.close()
    assert time.monotonic() - began < 10
    assert group_offsets(bs, unique_group, topic, 2) == [1000, 1000]


@pytest.mark.parametrize("call", ["poll", "consume"])
def test_long_timeout_serves_a_catchup_started_inside_it(
    kafka_cluster, topic_factory, unique_group, call
):
    """One poll(60)/consume(100, 60) joins the group, and the assignment delivered inside
    it starts a catch-up. No fresh record ever arrives, so only the backlog can end the
    call: it must come back with backlog records long before the timeout. (A hot path
    that handed the whole timeout to librdkafka would sit out the 60 s.)"""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 500)
    _seed_commits(bs, unique_group, topic, {0: 100})  # [100, 500) pending at the join
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.subscribe([topic])
        started = time.monotonic()
        got = [c.poll(60.0)] if call == "poll" else c.consume(100, 60.0)
        elapsed = time.monotonic() - started
        records = [m for m in got if m is not None and m.error() is None]
        assert records, f"{call}() returned nothing after {elapsed:.1f}s"
        assert all(100 <= m.offset() < 500 for m in records), "backlog records"
        assert elapsed < 30, f"the backlog waited {elapsed:.1f}s of the 60 s timeout"
    finally:
        c.close()


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_commit_inside_on_lost_is_refused(kafka_cluster, topic_factory, unique_group, protocol):
    """The Java ``onPartitionsLost`` pattern: a member stalls past ``max.poll.interval.ms``
    and its ``on_lost`` calls ``commit()``. confluent-kafka raises ``_ASSIGNMENT_LOST``; so
    must we, and the group's offset must stay where it was. Under the consumer protocol
    the broker accepts the stalled member's explicit OffsetCommit (Apache Kafka 4: the
    group offset went 0 -> 50,800 before the fix), so the refusal is the client's."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)
    _seed_commits(bs, unique_group, topic, {0: 0})  # [0, 3000) is the child's backlog
    conf = {**_conf(bs, unique_group, protocol), "max.poll.interval.ms": 2500}
    if "session.timeout.ms" in conf:  # classic: not above max.poll.interval.ms
        conf["session.timeout.ms"] = 2000
    c = Consumer(conf)
    outcomes: list = []

    def on_lost(consumer, partitions):
        for call in (
            lambda: consumer.commit(asynchronous=False),
            lambda: consumer.commit(message=handed[-1], asynchronous=False),
        ):
            try:
                call()
                outcomes.append("written")
            except KafkaException as exc:
                outcomes.append(exc.args[0].code())

    handed: list = []
    c.subscribe([topic], on_lost=on_lost)
    try:
        deadline = time.monotonic() + 30
        while len(handed) < 500:
            assert time.monotonic() < deadline, len(handed)
            handed += [m for m in c.consume(100, 0.2) if m.error() is None]
        time.sleep(4.0)  # the stall itself: past max.poll.interval.ms, the group drops us
        deadline = time.monotonic() + 60
        while not outcomes:
            assert time.monotonic() < deadline, "on_lost never ran"
            c.poll(0.2)
        assert outcomes == [KafkaError._ASSIGNMENT_LOST, KafkaError._ASSIGNMENT_LOST]
        assert group_offsets(bs, unique_group, topic) == [0]
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["cooperative-sticky", "kip848-consumer"])
def test_commit_in_on_revoke_inside_consume_claims_earlier_calls(
    kafka_cluster, topic_factory, unique_group, protocol
):
    """A bare ``commit()`` in ``on_revoke``, served inside a ``consume()`` call, claims every
    record earlier ``consume()`` calls returned, as confluent-kafka's does. (Inside the call
    librdkafka's position also counts the batch being collected, so it cannot say this;
    the next owner re-delivered the last calls' records, 25 per revoke on Kafka 4.) The
    incremental protocols: an eager revoke's commit may meet REBALANCE_IN_PROGRESS, and so
    may a cooperative one's on the embedded cluster under load: then the run is made again
    in a new group (the check needs a commit the broker took)."""
    bs = kafka_cluster.bootstrap_servers
    for attempt in range(3):
        seen = _revoke_during_consume(bs, topic_factory(2), f"{unique_group}-{attempt}", protocol)
        if seen is not None:
            revoked, offsets = seen
            assert revoked and all(offsets[p] == 500 for p in revoked), (revoked, offsets)
            return
    pytest.skip("each on_revoke commit met a rebalance in progress")


def _revoke_during_consume(bs, topic, group, protocol):
    """500 records per partition returned by consume(), none committed; a second member
    joins while the first calls consume() with nothing left to read, so the revoke is
    served inside one. Returns the revoked partitions and the group's offsets right after
    the revoke's bare commit; None if that commit met a rebalance in progress."""
    first = Consumer(_conf(bs, group, protocol))
    revoked: list = []
    refused: list = []

    def on_revoke(consumer, partitions):
        revoked.extend(t.partition for t in partitions)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            assert exc.args[0].code() in _REBALANCING, exc
            refused.append(exc)

    first.subscribe([topic], on_revoke=on_revoke)
    second = None
    try:
        deadline = time.monotonic() + 30
        while len(first.assignment()) < 2:
            assert time.monotonic() < deadline, "never assigned"
            first.poll(0.1)
        for p in (0, 1):
            produce(bs, topic, 500, partition=p)
        got = 0
        while got < 1000:
            assert time.monotonic() < deadline, got
            got += len([m for m in first.consume(100, 0.2) if m.error() is None])
        second = Consumer(_conf(bs, group, protocol))
        second.subscribe([topic])
        deadline = time.monotonic() + 60
        while not revoked:
            assert time.monotonic() < deadline, "never revoked"
            assert first.consume(100, 0.2) == []
            second.poll(0.05)
        if refused:
            return None
        return revoked, group_offsets(bs, group, topic, 2)
    finally:
        close_member(first, *([second] if second is not None else []), seconds=30.0)


@pytest.mark.parametrize("protocol", ["eager-range", "cooperative-sticky", "kip848-consumer"])
def test_close_serves_a_queued_assignment_before_librdkafka_closes(
    kafka_cluster, topic_factory, unique_group, protocol, monkeypatch
):
    """A member that joined and was not polled since holds an assignment librdkafka has
    queued for it. close() serves it, and the revoke after it, before librdkafka's own
    close(): served inside that close(), the revoke can come after the group terminated,
    and librdkafka 2.16 never answers the callback's assign, with the GIL held (seen
    freezing a whole process: 3 of 149 closes of this kind on the embedded cluster).
    librdkafka does not always deliver that assignment (no callback at all, 2 runs in about
    25; my reading, not checked: an unsubscribe that overtakes the SyncGroup answer drops
    it): then the run is made again in a new group."""
    from fastrebalance import _assigning

    bs = kafka_cluster.bootstrap_servers
    leave = _assigning.Assignments.leave
    watched: list = []
    at_close: list = []
    events: list = []

    def spy(self):
        error = leave(self)
        if watched and self is watched[0]:  # what the second member served before close()
            at_close.extend(e for e in events if e[0] == "second")
        return error

    monkeypatch.setattr(_assigning.Assignments, "leave", spy)
    for attempt in range(5):
        for held in (watched, at_close, events):
            held.clear()
        served = _close_with_a_queued_assignment(
            bs, topic_factory(2), f"{unique_group}-{attempt}", protocol, events, watched
        )
        if served:
            # every callback the second member got came before librdkafka's close(): the
            # queued assignment (of no partition, a cooperative first round), and the
            # revoke of what it held
            assert at_close == served and served[0][1] == "assign", events
            assert [e[1] for e in served] == (
                ["assign", "revoke"] if served[0][2] else ["assign"]
            )
            return
    pytest.fail(f"no assignment reached the second member in 5 runs: {events}")


def _close_with_a_queued_assignment(bs, topic, group, protocol, events, watched):
    """The second member joins and is not polled; once the first holds one partition it is
    closed. Returns the rebalance callbacks it got, in order."""
    first = Consumer(_conf(bs, group, protocol))
    first.subscribe(
        [topic],
        on_assign=lambda _c, p: events.append(("first", "assign")),
        on_revoke=lambda _c, p: events.append(("first", "revoke")),
    )
    second = Consumer(_conf(bs, group, protocol))
    watched.append(second._assignments)
    try:
        deadline = time.monotonic() + 30
        while len(first.assignment()) < 2:
            assert time.monotonic() < deadline, "never assigned"
            first.poll(0.1)
        second.subscribe(
            [topic],
            on_assign=lambda _c, p: events.append(("second", "assign", len(p))),
            on_revoke=lambda _c, p: events.append(("second", "revoke", len(p))),
        )
        # the first member serves the rebalance(s) the second one's joining starts, until
        # it holds one partition: the other is then queued for the second member, unserved
        deadline = time.monotonic() + 60
        while len(first.assignment()) != 1:
            assert time.monotonic() < deadline, events
            first.poll(0.05)
        # the second member's SyncGroup answer (its share of that round) reaches its queue
        # meanwhile: 0.5 s was too short at the load of a CI run (3 runs of 3 without it)
        time.sleep(2.0)
        assert not any(e[0] == "second" for e in events), events
        closed, second = second, None
        closed.close()
        return [e for e in events if e[0] == "second"]
    finally:
        close_member(first, *([second] if second is not None else []))


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("raising", ["on_assign", "on_revoke"])
def test_a_rebalance_callback_that_raises_as_confluent_kafka(
    kafka_cluster, topic_factory, unique_group, raising, parallel
):
    """As confluent-kafka's: on_assign's exception comes out of poll(), the partitions
    assigned all the same (and read, and committed); on_revoke's out of close(), once
    everything is closed (it came out before librdkafka's handle was closed)."""
    bs = kafka_cluster.bootstrap_servers
    topic = topic_factory(2)
    for p in (0, 1):
        produce(bs, topic, 10, partition=p)
    c = Consumer(_conf(bs, unique_group, "eager-range") | {"enable.parallel.rebalance": parallel})

    def boom(_consumer, _partitions):
        raise ValueError(f"boom in {raising}")

    c.subscribe([topic], **{raising: boom})
    got = 0
    try:
        deadline = time.monotonic() + 60  # the join and 20 records, on a loaded machine
        if raising == "on_assign":
            with pytest.raises(ValueError, match="boom in on_assign"):
                while time.monotonic() < deadline:
                    c.poll(0.1)
        while got < 20:
            assert time.monotonic() < deadline, got
            m = c.poll(0.1)
            got += m is not None and m.error() is None
        c.commit(asynchronous=False)
        assert group_offsets(bs, unique_group, topic, 2) == [10, 10]
    finally:
        if raising == "on_revoke":
            with pytest.raises(ValueError, match="boom in on_revoke"):
                c.close()
        else:
            c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.poll(0)
    if parallel:  # librdkafka's handle itself is closed (it was left open)
        with pytest.raises(RuntimeError, match="closed"):
            c._primary.poll(0)
