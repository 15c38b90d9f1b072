"""Group-wide catch-up: a claims topic belongs to one group (issue 48).

Two groups sharing a claims topic (one config file for two applications) must each
receive every record at or after their own offset; group ids Kafka would take for one
another (``app_1`` and ``app.1``) must each get a claims topic; a claims topic that
cannot be used must leave the backlog to the member's own catch-up consumer, not stall
it. Under both group protocols where the cluster serves them (classic everywhere, the
consumer protocol on the embedded cluster and Kafka 4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance._config import default_claims_topic
from fastrebalance.testing import KafkaCluster
from fastrebalance.testing._groupchaos import prepare

from .helpers import base_conf, group_offsets, produce

BACKLOG = 6_000
PROTOCOLS = ("classic", "consumer")


def _conf(bootstrap: str, group: str, protocol: str, **extra: Any) -> dict[str, Any]:
    conf = base_conf(
        bootstrap,
        group,
        **{
            "parallel.rebalance.group.catchup": True,
            "parallel.rebalance.group.chunk.records": 1000,
            **extra,
        },
    )
    if protocol == "consumer":  # the client refuses classic-only keys under KIP-848
        conf["group.protocol"] = "consumer"
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key)
    return conf


def _skip_unserved(protocol: str, kip848: tuple[bool, str]) -> None:
    if protocol == "consumer" and not kip848[0]:
        pytest.skip(kip848[1])


def _drain_each(
    bootstrap: str, runs: dict[str, tuple[Any, str]], backlog: int, seconds: float = 90
) -> dict[str, set[int]]:
    """Drive every member from this thread (each handle stays on it), committing as it goes,
    until every group's stored offset reached ``backlog``; returns what each received."""
    got: dict[str, set[int]] = {name: set() for name in runs}
    deadline = time.monotonic() + seconds
    while True:
        for name, (c, _topic) in runs.items():
            msgs = [m for m in c.consume(500, 0.05) if m.error() is None]
            got[name] |= {m.offset() for m in msgs}
            if msgs or len(got[name]) >= backlog:
                c.commit(asynchronous=True)
        stored = {
            name: group_offsets(bootstrap, c.group_id, topic)[0]
            for name, (c, topic) in runs.items()
        }
        if all(o >= backlog for o in stored.values()):
            # the group stored the whole backlog: each must have received all of it
            for c, _ in runs.values():  # and what poll() still has is not ours to check
                c.consume(500, 0.05)
            return got
        assert time.monotonic() < deadline, (
            {n: len(g) for n, g in got.items()},
            stored,
        )


class _Member:
    """A Consumer that remembers its group id (group_offsets reads it back)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        from fastrebalance import Consumer

        self.group_id = conf["group.id"]
        self.consumer = Consumer(conf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_groups_sharing_a_claims_topic_each_receive_their_whole_backlog(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 48: G1 and G2 read X and name one claims topic (one shared config file). Each
    # member was handed only the chunks it claimed (15,000 of 30,000) while both groups'
    # offsets reached 30,000: each stored an offset past records it never processed.
    _skip_unserved(protocol, kip848)
    bootstrap, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    shared = f"{unique_group}-shared-claims"
    groups = (f"{unique_group}-G1", f"{unique_group}-G2")
    for g in groups:
        prepare(bootstrap, topic, g, 0)
    prepare(bootstrap, topic, groups[0], BACKLOG)  # the records arrive once, for both
    members = {
        g: _Member(
            _conf(bootstrap, g, protocol, **{"parallel.rebalance.group.claims.topic": shared})
        )
        for g in groups
    }
    try:
        for m in members.values():
            m.subscribe([topic])
        got = _drain_each(bootstrap, {g: (m, topic) for g, m in members.items()}, BACKLOG)
    finally:
        for m in members.values():
            m.close()
    for g in groups:
        missing = set(range(BACKLOG)) - got[g]
        assert not missing, f"{g} stored {BACKLOG} but never received {len(missing)} records"


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_group_ids_kafka_takes_for_one_another_both_drain_their_backlogs(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    # issue 48: app_1 drained its backlog, then app.1's default claims topic
    # (app.1.catchup.claims) was refused as colliding with app_1.catchup.claims: 0 of its
    # 20,000 records in 20 s, a WARNING every 2 s for ever. The default names differ now;
    # and two names a user chose that collide leave the second group to its own
    # catch-up consumers (checked where topics collide: a real broker).
    _skip_unserved(protocol, kip848)
    bootstrap = kafka_cluster.bootstrap_servers
    runs = [
        (f"{unique_group}_1", {}),
        (f"{unique_group}.1", {}),
        (f"{unique_group}_2", {"parallel.rebalance.group.claims.topic": f"{unique_group}_c"}),
        (f"{unique_group}.2", {"parallel.rebalance.group.claims.topic": f"{unique_group}.c"}),
    ]
    for group, extra in runs:  # one after the other, as two applications started apart
        topic = topic_factory(1)
        prepare(bootstrap, topic, group, BACKLOG)
        member = _Member(_conf(bootstrap, group, protocol, **extra))
        try:
            member.subscribe([topic])
            got = _drain_each(bootstrap, {group: (member, topic)}, BACKLOG)
            status = member.metrics_snapshot()["group"]
        finally:
            member.close()
        assert got[group] >= set(range(BACKLOG)), group
        if group.endswith(".2") and kafka_cluster.kind != "embedded":
            # the one whose chosen name collides: its own catch-up consumer read it all
            assert status["unusable"] and "collides" in status["unusable"], status["unusable"]
        else:
            assert status["unusable"] is None, status["unusable"]


@pytest.mark.kafka4
def test_a_claims_topic_the_member_reads_leaves_the_backlog_to_its_child(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claims topic that is also one the application subscribes to (a config mistake) is
    never written or read as a claims log: its records would reach the application's code.
    The member says so once, as an ERROR naming the key, and its own catch-up consumer
    reads the backlog, as with group-wide catch-up off."""
    bootstrap, topic, other = kafka_cluster.bootstrap_servers, topic_factory(1), topic_factory(1)
    prepare(bootstrap, topic, unique_group, BACKLOG)
    conf = _conf(
        bootstrap, unique_group, "classic", **{"parallel.rebalance.group.claims.topic": other}
    )
    member = _Member(conf)
    try:
        with caplog.at_level("ERROR", logger="fastrebalance.group"):
            member.subscribe([topic, other])
            got = _drain_each(bootstrap, {unique_group: (member, topic)}, BACKLOG)
            status = member.metrics_snapshot()["group"]
    finally:
        member.close()
    assert got[unique_group] >= set(range(BACKLOG))
    assert status["unusable"] and "subscribes to" in status["unusable"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "parallel.rebalance.group.claims.topic" in errors[0], errors


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_group_reset_to_the_start_receives_its_whole_backlog_again(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    unique_group: str,
    kip848: tuple[bool, str],
    protocol: str,
) -> None:
    """A ``done`` record is true of the backlog it was written for, not of the same
    offsets read again: after an operator reset the group's offset to 0 (the way
    kafka-consumer-groups --reset-offsets writes it: offset 0, no metadata), the chunks the
    claims log says were done before are read again, not absorbed unread."""
    _skip_unserved(protocol, kip848)
    bootstrap, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    prepare(bootstrap, topic, unique_group, BACKLOG)
    # the embedded cluster refuses a commit from outside a group that ever had a subscribed
    # member (UNKNOWN_MEMBER_ID, for good): its members assign() there, and the reset works
    join = kafka_cluster.kind != "embedded"
    if not join:
        # ... and auto-creates the claims topic with 4 partitions, which the next member
        # then refuses (falling back to its own catch-up consumer): made first, as a
        # broker's CreateTopics would make it
        kafka_cluster.create_topic(default_claims_topic(unique_group), 1)
    first = _Member(_conf(bootstrap, unique_group, protocol))
    try:
        _read(first, topic, join)
        got = _drain_each(bootstrap, {"first": (first, topic)}, BACKLOG)
    finally:
        first.close()
    assert got["first"] >= set(range(BACKLOG))
    # the operator resets the (empty) group to the earliest offset; more records arrive
    _reset_to_zero(bootstrap, unique_group, topic)
    assert group_offsets(bootstrap, unique_group, topic) == [0]
    more = 2_000
    produce(bootstrap, topic, more, start=BACKLOG)
    second = _Member(_conf(bootstrap, unique_group, protocol))
    try:
        _read(second, topic, join)
        again = _drain_each(bootstrap, {"second": (second, topic)}, BACKLOG + more)
    finally:
        second.close()
    missing = set(range(BACKLOG + more)) - again["second"]
    assert not missing, (
        f"the group's offset passed {len(missing)} records never delivered after the reset "
        f"(first {min(missing)})"
    )


def _read(member: _Member, topic: str, join: bool) -> None:
    if join:
        member.subscribe([topic])
    else:
        member.assign([TopicPartition(topic, 0)])


def _reset_to_zero(bootstrap: str, group: str, topic: str, seconds: float = 30.0) -> None:
    """What ``kafka-consumer-groups --reset-offsets --to-earliest`` writes: offset 0, no
    metadata, from outside the group; retried while the broker still counts the member
    that just left."""
    reset = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                reset.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
                return
            except KafkaException as exc:
                if time.monotonic() > deadline or exc.args[0].code() not in (
                    KafkaError.UNKNOWN_MEMBER_ID,
                    KafkaError.REBALANCE_IN_PROGRESS,
                    KafkaError.ILLEGAL_GENERATION,
                    KafkaError.STALE_MEMBER_EPOCH,
                ):
                    raise
                time.sleep(0.5)
    finally:
        reset.close()
