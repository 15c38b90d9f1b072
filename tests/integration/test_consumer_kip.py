"""The KIP-333 examples and the Consumer's merged views, on a real Kafka wire protocol.

These tests use assign() (manual assignment) where the story is about offsets, not
about group membership: regaining a partition by assign() runs the same catch-up
planning as a rebalance, without the mock cluster's join delays. Rebalance-driven
variants live in test_consumer_groups.py.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer as PlainConsumer

from fastrebalance import Consumer, TopicPartition

from .helpers import base_conf, drain, group_metadata, group_offsets, produce

pytestmark = pytest.mark.integration


def _crash_with_committed(bs: str, group: str, topic: str, committed: int) -> None:
    """A previous incarnation that processed up to ``committed`` and then died."""
    c = Consumer(base_conf(bs, group))
    c.assign([TopicPartition(topic, 0, committed)])
    c.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
    c.close()


@pytest.fixture
def regained(kafka_cluster, topic_factory, unique_group):
    """``regain(log_end, committed)``: the previous owner died with ``committed``
    committed; a new Consumer regains the partition when the log ends at ``log_end``.
    Returns (consumer, topic); every consumer is closed at teardown."""
    made: list[Consumer] = []
    bs = kafka_cluster.bootstrap_servers

    def regain(log_end: int, committed: int, **extra) -> tuple[Consumer, str]:
        topic = topic_factory(1)
        produce(bs, topic, log_end)
        _crash_with_committed(bs, unique_group, topic, committed)
        c = Consumer(base_conf(bs, unique_group, **extra))
        made.append(c)
        c.assign([TopicPartition(topic, 0)])
        return c, topic

    yield regain
    for c in made:
        c.close()


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def test_kip_examples_crash_at_100_then_170(kafka_cluster, topic_factory, unique_group):
    """Crash at 100 with 70 committed, end 120: primary at 120, child reads [70, 120)
    and stops there. Second crash at 170 with 140 committed, end 190: the same child
    reads [140, 190); the primary continues at 190."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 100)
    _crash_with_committed(bs, unique_group, topic, 70)
    produce(bs, topic, 20, start=100)  # log end 120 when the partition is regained

    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        status = c.catchup_status()[(topic, 0)]
        assert status.pending_ranges == ((70, 120),)
        assert status.child_position == 70 and status.child_alive
        assert c.child_consumer_is_alive() and c.childConsumerIsAlive()
        produce(bs, topic, 50, start=120)  # fresh records, up to the second crash at 170
        got = drain(c, lambda ms: len(ms) >= 100)
        offsets = [m.offset() for m in got]
        assert sorted(offsets) == list(range(70, 170)), "each record once, none skipped"
        # The child stopped at 120: nothing it delivered lies beyond its range.
        assert c.catchup_status()[(topic, 0)].child_position is None
        # The whole backlog committed by its last record (the child's), 140 by the
        # primary's position: then "crash".
        (last_backlog,) = [m for m in got if m.offset() == 119]
        c.commit(message=last_backlog, asynchronous=False)
        c.commit(offsets=[TopicPartition(topic, 0, 140)], asynchronous=False)  # primary's
        assert group_offsets(bs, unique_group, topic) == [140]
        child_handle = c._child._handle
        c.unassign()
        assert c.child_consumer_is_alive(), "the child stays on standby"

        produce(bs, topic, 20, start=170)  # end 190 when regained
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((140, 190),)
        assert c._child._handle is child_handle and c._child.handles_created == 1
        produce(bs, topic, 10, start=190)
        got = drain(c, lambda ms: len(ms) >= 60)
        assert sorted(m.offset() for m in got) == list(range(140, 200))
    finally:
        c.close()


def test_fresh_records_overtake_a_large_backlog(kafka_cluster, regained):
    c, topic = regained(20000, 0)
    produce(kafka_cluster.bootstrap_servers, topic, 1, start=20000)  # one fresh record
    order = []

    def work(m):
        order.append(m.offset())
        _busy(50e-6)  # 50 µs of "processing" per record

    drain(c, lambda ms: len(ms) >= 20001, timeout=60, on_message=work)
    # A plain consumer would deliver it last (20001st); fresh-first delivers it
    # within the first few hundred even while the child drains the backlog.
    assert order.index(20000) < 2000, order.index(20000)


def test_commit_routing_and_committed_during_and_after(kafka_cluster, regained, unique_group):
    bs = kafka_cluster.bootstrap_servers
    c, topic = regained(120, 70)
    produce(bs, topic, 10, start=120)
    got = drain(c, lambda ms: len(ms) >= 60)
    by_offset = {m.offset(): m for m in got}
    order = [m.offset() for m in got]
    # the backlog records handed out before fresh record 125: [70, k) (the child hands its
    # run out in offset order; how far it got before 125 depends on the machine)
    k = 70 + sum(o < 120 for o in order[: order.index(125)])

    # A fresh (primary) record: the group's token moves; its offset only as far as the
    # backlog handed out before the record (a commit covers what came before it).
    c.commit(message=by_offset[125], asynchronous=False)
    expected = 126 if k == 120 else k
    assert c.committed([TopicPartition(topic, 0)])[0].offset == expected, order
    assert group_offsets(bs, unique_group, topic) == [expected]
    if k < 120:
        offset, metadata = group_metadata(bs, unique_group, topic)
        assert offset == k and metadata.startswith("~fr1:")

    # A backlog (child) record handed out after 125 (if any): routed to the child's log.
    later = [o for o in order[order.index(125) + 1 :] if o < 120]
    if later:
        b = later[0] + 5 if later[0] + 5 < 120 else later[0]
        c.commit(message=by_offset[b], asynchronous=False)
        child_offset, child_meta = group_metadata(bs, unique_group + ".catchup", topic)
        assert child_offset == b + 1 and child_meta.startswith("~frc1:")
        assert c.committed([TopicPartition(topic, 0)])[0].offset == b + 1  # child's progress
        assert group_offsets(bs, unique_group, topic) == [b + 1]

    # Whole backlog processed: committed() is the primary's offset again.
    c.commit(asynchronous=False)
    assert c.committed([TopicPartition(topic, 0)])[0].offset == 130
    assert group_metadata(bs, unique_group, topic) == (130, "")


@pytest.mark.parametrize("how", ["commit", "store"])
def test_commit_by_offset_after_each_record_moves_the_group_past_the_backlog(
    kafka_cluster, regained, unique_group, how
):
    """The textbook commit(offsets=[TopicPartition(t, p, m.offset() + 1)]) after each record
    (or store_offsets(offsets=) and a bare commit). An offset after a backlog record was a
    position of the primary below its start, so a rewind: the group stayed at the backlog's
    start for good and every clean restart read the backlog again, grown by what the last
    rewind left (adversary: 0 / 5000 / 7000 records re-read in three restarts; now 0 / 1 /
    1, the backlog's last record when every fresh record came before it, below)."""
    bs = kafka_cluster.bootstrap_servers
    c, topic = regained(120, 70, **({"enable.auto.offset.store": False} if how == "store" else {}))
    produce(bs, topic, 10, start=120)
    got = drain(c, lambda ms: len(ms) >= 60)
    assert sorted(m.offset() for m in got) == list(range(70, 130))
    for m in got:  # fresh records first, then the backlog: each offset lower than the last
        offsets = [TopicPartition(topic, 0, m.offset() + 1)]
        if how == "commit":
            c.commit(offsets=offsets, asynchronous=False)
        else:
            c.store_offsets(offsets=offsets)
    if how == "store":
        c.commit(asynchronous=False)
    # All but the last backlog record: its offset + 1, 120, is also where the primary
    # started (an application committing position() says 120 too), so it claims nothing;
    # unless a fresh record came after it (on a loaded machine the streams interleave):
    # the offset after that one covers what was handed out before it, 119 included
    order = [m.offset() for m in got]
    covered = any(o >= 120 for o in order[order.index(119) + 1 :])
    assert group_offsets(bs, unique_group, topic) == [130 if covered else 119], order
    if not covered:
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((119, 120),)
    if how == "commit":  # (with store_offsets, a bare commit writes what was stored)
        c.commit(asynchronous=False)
        assert group_offsets(bs, unique_group, topic) == [130]
    c.close()
    with pytest.raises(RuntimeError, match="Consumer closed"):  # as confluent-kafka's
        c.commit(asynchronous=False)


def test_user_metadata_survives_the_token(kafka_cluster, regained):
    c, topic = regained(120, 70)
    produce(kafka_cluster.bootstrap_servers, topic, 5, start=120)
    drain(c, lambda ms: any(m.offset() >= 120 for m in ms))
    # 120, where the primary started, claims nothing: the backlog stays pending, whatever
    # the child handed out before (121, after a fresh record, would cover that too)
    c.commit(offsets=[TopicPartition(topic, 0, 120, "app-state-42")], asynchronous=False)
    (tp,) = c.committed([TopicPartition(topic, 0)])
    assert tp.offset == 70 and tp.metadata == "app-state-42"


def test_child_crash_resumes_from_what_was_committed(regained):
    c, _topic = regained(5000, 1000)
    got = drain(c, lambda ms: any(m.offset() >= 3000 for m in ms))
    (child_1999,) = [m for m in got if m.offset() == 1999]
    c.commit(message=child_1999, asynchronous=False)  # the child's stream up to 2000
    assert c._child.handles_created == 1
    c._child._handle.close()  # the child dies without a word
    after = drain(c, lambda ms: len(ms) >= 1)
    assert after[0].offset() == 2000, "resumed from what was committed, not from 1000"
    assert c._child.handles_created == 2 and c.child_consumer_is_alive()
    rest = drain(c, lambda ms: len(ms) >= 3000 - 1)
    assert set(range(1000, 5000)) <= {m.offset() for m in got + after + rest}


def test_plain_consumer_sees_a_safe_group_offset_throughout(kafka_cluster, regained, unique_group):
    """Invariant 2: what Kafka stores for the group never passes an unprocessed record."""
    bs = kafka_cluster.bootstrap_servers
    c, topic = regained(3000, 500, **{"enable.auto.commit": True, "auto.commit.interval.ms": 100})
    processed: set[int] = set()
    samples: list[tuple[int, set[int]]] = []
    produce(bs, topic, 200, start=3000)
    deadline = time.monotonic() + 30
    while len(processed) < 2700 and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            processed.add(m.offset())
        if len(processed) % 250 == 0:
            samples.append((group_offsets(bs, unique_group, topic)[0], set(processed)))
    c.commit(asynchronous=False)
    assert group_offsets(bs, unique_group, topic)[0] == 3200
    assert len(samples) >= 5
    for stored, done in samples:
        missing = [o for o in range(500, stored) if o not in done]
        assert not missing, f"group offset {stored} passed unprocessed {missing[:5]}"


def test_rollback_to_plain_consumer_rereads_never_skips(kafka_cluster, regained, unique_group):
    bs = kafka_cluster.bootstrap_servers
    c, topic = regained(2000, 100)
    produce(bs, topic, 100, start=2000)
    got = drain(c, lambda ms: sum(m.offset() >= 2000 for m in ms) >= 100)
    processed = {m.offset() for m in got}
    c.commit(message=max(got, key=lambda m: m.offset()), asynchronous=False)  # fresh only
    c.close()
    lowest_unprocessed = min(o for o in range(100, 2100) if o not in processed)
    # Roll back: a plain confluent-kafka consumer on the same group.
    plain = PlainConsumer(
        {
            "bootstrap.servers": bs,
            "group.id": unique_group,
            "fetch.wait.max.ms": 10,
            "enable.auto.commit": False,
        }
    )
    try:
        plain.assign([TopicPartition(topic, 0)])
        first = drain(plain, lambda ms: len(ms) >= 1)[0].offset()
        assert first <= lowest_unprocessed, "the rolled-back consumer would skip records"
    finally:
        plain.close()


def test_disabled_mode_is_confluent_kafka(kafka_cluster, topic_factory, unique_group):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)
    conf = {
        "bootstrap.servers": bs,
        "group.id": unique_group,
        "fetch.wait.max.ms": 10,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    runs = []
    for cls in (PlainConsumer, Consumer):
        c = cls(conf)
        c.assign([TopicPartition(topic, 0)])
        runs.append([(m.offset(), m.value()) for m in drain(c, lambda ms: len(ms) >= 3000)])
        c.close()
    assert runs[0] == runs[1]
    off = Consumer(conf)
    try:
        # poll()/consume() go straight to the primary's own methods (one Python frame)
        assert off._reader is off._primary and not off.child_consumer_is_alive()
        assert off.catchup_status() == {}
    finally:
        off.close()


def test_threshold_skips_small_lags(regained):
    c, _topic = regained(100, 95, **{"parallel.rebalance.lag.threshold": 5})
    assert c.catchup_status() == {} and not c.child_consumer_is_alive()
    got = drain(c, lambda ms: len(ms) >= 5)
    assert [m.offset() for m in got] == [95, 96, 97, 98, 99]


def test_no_committed_offset_follows_auto_offset_reset_when_asked(
    kafka_cluster, topic_factory, unique_group
):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 500)
    conf = base_conf(bs, unique_group, **{"parallel.rebalance.lag.threshold": 0})
    conf["parallel.rebalance.catchup.uncommitted"] = False
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status() == {}
        got = drain(c, lambda ms: len(ms) >= 500)
        assert [m.offset() for m in got] == list(range(500))
    finally:
        c.close()


def test_a_partition_never_committed_catches_up_from_its_start(
    kafka_cluster, topic_factory, unique_group
):
    # issue 47: a new service whose first member crashed before its first commit restarted
    # (auto.offset.reset=earliest) with its whole log in order: the first fresh record came
    # after the whole log (18.9 s at p50). Now the log is its backlog: fresh records first,
    # every record delivered, and the group stores no offset past an unprocessed record.
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20000)
    c = Consumer(base_conf(bs, unique_group))  # the default
    try:
        c.subscribe([topic])
        drain(c, lambda ms: bool(c.catchup_status()), timeout=30)  # planned: a backlog
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((0, 20000),)
        produce(bs, topic, 1, start=20000)  # one fresh record
        order: list[int] = []

        def work(m):
            order.append(m.offset())
            _busy(50e-6)

        drain(c, lambda ms: 20000 in order and len(set(order)) >= 20001, timeout=60,
              on_message=work)  # fmt: skip
        assert order.index(20000) < 2000, order.index(20000)
        assert group_offsets(bs, unique_group, topic)[0] in (-1001, 0)  # nothing committed
        c.commit(asynchronous=False)
        assert group_offsets(bs, unique_group, topic)[0] == 20001
    finally:
        c.close()


def test_stats_cb_carries_catchup_metrics(regained):
    reports: list[dict] = []
    c, topic = regained(
        5000,
        1000,
        **{"statistics.interval.ms": 100, "stats_cb": lambda raw: reports.append(json.loads(raw))},
    )
    # Poll (almost) nothing for a moment so that a report is taken mid catch-up.
    deadline = time.monotonic() + 10
    early = 0
    while not any(r.get("fastrebalance", {}).get("records_remaining") for r in reports):
        assert time.monotonic() < deadline, "no stats report mid catch-up"
        early += c.poll(0) is not None  # serves callbacks; may return a backlog record
        time.sleep(0.02)
    mid = next(r["fastrebalance"] for r in reports if r["fastrebalance"]["records_remaining"])
    assert mid["child_state"] == "active" and mid["child_alive"]
    assert mid["partitions"][topic]["0"]["pending_ranges"] == [[1000, 5000]]
    assert "topics" in reports[0], "librdkafka's own statistics are kept"
    drain(c, lambda ms: len(ms) >= 4000 - early)
    c.commit(asynchronous=False)
    reports.clear()
    deadline = time.monotonic() + 10
    while not reports:
        assert time.monotonic() < deadline
        c.poll(0.05)
    last = reports[-1]["fastrebalance"]
    assert last["records_remaining"] == 0 and last["child_state"] == "standby"
    assert last["backlog_records_delivered"] >= 4000


@pytest.mark.parametrize("call", ["poll", "consume"])
def test_auto_commit_keeps_its_schedule_on_the_hot_path(
    kafka_cluster, topic_factory, unique_group, call
):
    """No backlog: every poll()/consume() is the hot path, which reads no clock; the
    auto-commit's timer still sends one call in each interval down the slow path, which
    commits what earlier calls returned."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 200)
    extra = {"enable.auto.commit": True, "auto.commit.interval.ms": 300}
    c = Consumer(base_conf(bs, unique_group, **extra))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        handed = 0
        deadline = time.monotonic() + 30
        while handed < 200 or group_offsets(bs, unique_group, topic) != [200]:
            assert time.monotonic() < deadline, (handed, group_offsets(bs, unique_group, topic))
            for _ in range(20):
                got = [c.poll(0.05)] if call == "poll" else c.consume(10, 0.05)
                handed += len([m for m in got if m is not None and m.error() is None])
        assert not c.catchup_status()
    finally:
        c.close()
