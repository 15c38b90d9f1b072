"""``fastrebalance status`` against a group caught mid catch-up, read from Kafka.

The story is the KIP's: crash with 70 committed, log end 120 when the partition is
regained; the child then commits 80 and 90, the primary 126. The consumer is closed
before status runs: status must work on a group with no live member.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer

from fastrebalance import Consumer, TopicPartition
from fastrebalance._token import GroupToken, encode_group_token
from fastrebalance.testing import KafkaCluster
from fastrebalance.tools.cli import EXIT_CHECK_FAILED, EXIT_OK, main
from fastrebalance.tools.status import (
    GroupStatus,
    ProgressTracker,
    StatusError,
    StatusReader,
)

from .helpers import base_conf, drain, produce

pytestmark = pytest.mark.integration


def _mid_catchup(bs: str, group: str, topic: str, **conf: object) -> None:
    """Leave ``group`` on partition 0 mid catch-up, and partition 1 plain at its log end."""
    produce(bs, topic, 120)
    produce(bs, topic, 500, partition=1)
    parts = [TopicPartition(topic, 0, 70), TopicPartition(topic, 1, 500)]
    with Consumer(base_conf(bs, group, **conf)) as crashed:  # committed 70, then crashed
        crashed.assign(parts)
        crashed.commit(offsets=parts, asynchronous=False)
    c = Consumer(base_conf(bs, group, **conf))
    try:
        c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        # The child's stream waits until fresh record 125 is committed: a commit covers
        # every record handed out before it, and how much of the backlog comes before 125
        # is the machine's doing (the child's own pause, not the application's)
        c._child.pause([(topic, 0)])
        produce(bs, topic, 6, start=120)
        got = drain(c, lambda ms: any(m.partition() == 0 and m.offset() == 125 for m in ms))
        assert all(m.offset() >= 120 for m in got if m.partition() == 0), "backlog came"
        c.commit(message=got[-1], asynchronous=False)  # primary: position 126
        c._child.resume([(topic, 0)])
        got = drain(c, lambda ms: any(m.partition() == 0 and m.offset() == 89 for m in ms))
        by_offset = {m.offset(): m for m in got if m.partition() == 0}
        c.commit(message=by_offset[79], asynchronous=False)  # child: 80
        c.commit(message=by_offset[89], asynchronous=False)  # child: 90
        produce(bs, topic, 4, start=126)  # the log ends at 130; none of these handed out
    finally:
        c.close()


def read_status(bootstrap: str, group: str, **options: Any) -> GroupStatus:
    return StatusReader(bootstrap, group, **options).read()


def _status_argv(cluster: KafkaCluster, group: str, *extra: str) -> list[str]:
    return ["status", "--bootstrap-servers", cluster.bootstrap_servers, "--group", group, *extra]


def test_status_mid_catchup(kafka_cluster, topic_factory, unique_group, capsys) -> None:
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    _mid_catchup(bs, unique_group, topic)

    status = read_status(bs, unique_group)
    p0, p1 = status.partitions
    assert (p0.topic, p0.partition, p1.partition) == (topic, 0, 1)
    assert p0.metadata == "token"
    assert (p0.committed, p0.position, p0.log_end) == (90, 126, 130)
    (r,) = p0.ranges
    assert (r.start, r.end, r.child_committed, r.since) == (90, 120, 90, 80)
    assert p0.lag == 30 + 4 and p0.tool_lag == 40
    assert (p1.metadata, p1.committed, p1.position, p1.lag, p1.ranges) == ("plain", 500, 500, 0, ())
    assert not status.problems

    assert main(_status_argv(kafka_cluster, unique_group)) == EXIT_OK
    text = capsys.readouterr().out
    assert "1 of 2 partitions catching up: 30 backlog records pending" in text
    row = next(line for line in text.splitlines() if line.startswith(f"{topic} [0]"))
    assert row.split()[2:7] == ["90", "126", "130", "34", "1"]
    assert "backlog [90, 120): 30 left" in text and "child committed 90" in text

    assert main(_status_argv(kafka_cluster, unique_group, "--json", "--topic", topic)) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["group"] == unique_group and doc["catchup_group"] == f"{unique_group}.catchup"
    assert doc["catching_up"] is True and doc["pending"] == 30
    first = doc["partitions"][0]
    assert first["ranges"][0]["start"] == 90 and first["child_checkpoint"]["offset"] == 90


def test_watch_measures_the_child_draining(kafka_cluster, topic_factory, unique_group) -> None:
    """Between two refreshes a restarted member commits more of the backlog."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    _mid_catchup(bs, unique_group, topic)
    tracker = ProgressTracker()
    before = tracker.update(read_status(bs, unique_group, topics=[topic]))
    assert before.partitions[0].ranges[0].since == 80

    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((90, 120),)
        got = drain(c, lambda ms: any(m.offset() == 109 for m in ms))
        c.commit(message=next(m for m in got if m.offset() == 109), asynchronous=False)
    finally:
        c.close()

    after = tracker.update(read_status(bs, unique_group, topics=[topic]))
    (r,) = after.partitions[0].ranges
    assert (r.start, r.end, r.since, r.done) == (110, 120, 80, 30)
    assert r.rate is not None and r.rate > 0 and r.eta_s is not None


def test_watch_with_count_prints_json_lines(kafka_cluster, topic_factory, unique_group, capsys):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    _mid_catchup(bs, unique_group, topic)
    argv = _status_argv(kafka_cluster, unique_group, "--watch", "--count", "2", "--json")
    assert main([*argv, "--interval", "0.1"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    docs = [json.loads(line) for line in lines]
    # nobody is consuming: the range does not move
    assert all(d["partitions"][0]["ranges"][0]["rate"] == 0.0 for d in docs[1:])


def test_custom_catchup_group(kafka_cluster, topic_factory, unique_group) -> None:
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    child_group = f"{unique_group}-kids"
    _mid_catchup(bs, unique_group, topic, **{"parallel.rebalance.catchup.group.id": child_group})
    default = read_status(bs, unique_group).partitions[0].ranges[0]
    assert default.child_committed is None, "nothing in <group>.catchup"
    named = read_status(bs, unique_group, catchup_group=child_group).partitions[0].ranges[0]
    assert named.child_committed == 90 and named.since == 80


def test_unknown_group_and_topic_exit_1(kafka_cluster, topic_factory, unique_group, capsys):
    topic = topic_factory(1)
    with pytest.raises(StatusError) as raised:
        read_status(kafka_cluster.bootstrap_servers, unique_group)
    assert raised.value.kind == "group_not_found"
    assert main(_status_argv(kafka_cluster, unique_group)) == EXIT_CHECK_FAILED
    err = capsys.readouterr().err
    assert f"group {unique_group!r} has no committed offsets" in err

    assert main(_status_argv(kafka_cluster, unique_group, "--topic", topic)) == EXIT_CHECK_FAILED
    assert f"no committed offsets on topic {topic!r}" in capsys.readouterr().err

    assert main(_status_argv(kafka_cluster, unique_group, "-t", "no-such-topic", "--json")) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["error"] == "topic_not_found"
    assert "topic 'no-such-topic' not found" in err


def _plain_commit(bs: str, group: str, topic: str, offset: int, metadata: str) -> None:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    try:
        tp = TopicPartition(topic, 0, offset, metadata=metadata)
        c.commit(offsets=[tp], asynchronous=False)
    finally:
        c.close()


def test_foreign_metadata_is_shown_and_safe(kafka_cluster, topic_factory, unique_group, capsys):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 10)
    _plain_commit(bs, unique_group, topic, 7, "written-by-another-tool")
    assert main(_status_argv(kafka_cluster, unique_group)) == EXIT_OK
    out = capsys.readouterr().out
    assert "metadata not written by fastrebalance" in out
    assert "'written-by-another-tool': the offset stands alone" in out


def test_untrustworthy_token_exits_1(kafka_cluster, topic_factory, unique_group, capsys):
    """A token whose offset was moved by a tool (safe offset 90, stored with 100)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 130)
    text, _ = encode_group_token(GroupToken(126, ((90, 120),)))
    _plain_commit(bs, unique_group, topic, 100, text)
    assert main(_status_argv(kafka_cluster, unique_group)) == EXIT_CHECK_FAILED
    out = capsys.readouterr().out
    assert "ignored by a restart" in out and "moved by another tool" in out


def test_chunks_of_a_group_whose_members_all_died_show_expired(
    kafka_cluster, topic_factory, unique_group, capsys
) -> None:
    """The claims log's time is its newest record's: with every member dead nobody writes,
    so it judged a holder silent for a minute (or a day) live. Found by an adversary:
    "held" 47 minutes after the holder was SIGKILLed."""
    from confluent_kafka import Producer

    from fastrebalance._claims import ClaimRecord, Scope, encode_record
    from fastrebalance._config import default_claims_topic

    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 10)
    _plain_commit(bs, unique_group, topic, 5, "")
    claims = default_claims_topic(unique_group)
    kafka_cluster.create_topic(claims, 1)
    minute_ago = int(time.time() * 1000) - 60_000
    p = Producer({"bootstrap.servers": bs})
    scope = Scope(unique_group, p.list_topics(claims, timeout=10).cluster_id or "")
    for rec in (
        ClaimRecord("offer", "owner", topic, 0, ((5, 8), (8, 10))),
        ClaimRecord("claim", "dead-member", topic, 0, ((5, 8),)),
    ):
        p.produce(claims, encode_record(rec, scope), partition=0, timestamp=minute_ago)
    assert p.flush(10) == 0
    chunks = read_status(bs, unique_group).chunks
    assert chunks is not None
    states = {(c["start"], c["end"]): (c["holder"], c["state"]) for c in chunks}
    assert states == {(5, 8): ("dead-member", "expired"), (8, 10): (None, "free")}
    # The group's commit is a plain offset (the owner died before its plan's token), so no
    # range is pending: status said "no catch-up pending" above these chunks, unexplained.
    assert [c["in_commit"] for c in chunks] == [False, False]
    assert main(_status_argv(kafka_cluster, unique_group)) == EXIT_OK
    out = capsys.readouterr().out
    assert "2 of them in no pending range of the group's commit" in out
    text, _ = encode_group_token(GroupToken(10, ((5, 10),)))  # the owner's plan, committed
    _plain_commit(bs, unique_group, topic, 5, text)
    assert [c["in_commit"] for c in read_status(bs, unique_group).chunks or ()] == [True, True]
