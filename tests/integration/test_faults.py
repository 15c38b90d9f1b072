"""Faults and bad input: each has one clear outcome, and no record is lost.

* Commit metadata written by another tool, truncated, of an unknown version, or garbage
  (in the group's log or the child's): logged once, the bare offset used, processing goes on.
* Thousands of crash ranges on one partition: the token is coalesced under the broker's
  metadata limit; the gaps are re-read, nothing is skipped.
* Backlog deleted by retention before the child reads it, found when planning and found
  while reading: reported (``error_cb`` and an ERROR log naming topic, partition, offsets),
  the child moves on.
* The broker unreachable at start, or paused mid-run: synchronous commits fail within
  ``socket.timeout.ms`` with the error confluent-kafka uses for timeouts, ``close()``
  returns within twice that, nothing is dropped silently.
* Commits of an unassigned partition, below the committed offset, beyond the log end.
* A topic that disappears (deleted, or recreated shorter) under a pending catch-up.

The mock cluster's retention keeps ~45k uncompressed 100-byte records per partition, which
is what the retention tests lean on (docs: /work/shared/docs/embedded-kafka-facts.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Producer

from fastrebalance import Consumer, TopicPartition
from fastrebalance._ranges import RangeSet
from fastrebalance._retry import call_with_retries
from fastrebalance._token import GroupToken, decode_group_token, encode_group_token
from fastrebalance.testing import OwnCluster, open_own_cluster

from .helpers import (
    base_conf,
    close_member,
    drain,
    group_metadata,
    group_offsets,
    produce,
    recreate_topic,
    swap_primary,
    timed,
)

pytestmark = pytest.mark.integration

OURS = "fastrebalance"


def plain_commit(
    bs: str, group: str, topic: str, offset: int, metadata: str | None, partition: int = 0
) -> None:
    """What another tool (or an older incarnation) leaves in ``group``'s commit log."""
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic, partition, offset)
        if metadata is not None:
            tp = TopicPartition(topic, partition, offset, metadata=metadata)
        # retried as _committed is: a new group's first commit got NOT_COORDINATOR on a
        # loaded Apache Kafka 3.9 (load average ~18, stop 41's CI run beside other work)
        call_with_retries(lambda: c.commit(offsets=[tp], asynchronous=False), attempts=30)
    finally:
        c.close()


def our_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(OURS) and r.levelno == level]


def offsets_of(msgs: list[Any]) -> set[int]:
    return {m.offset() for m in msgs}


def drain_offsets(consumer: Any, wanted: set[int], timeout: float = 60.0) -> list[Any]:
    """poll() until every offset in ``wanted`` was delivered (in linear time: the
    backlogs here are tens of thousands of records)."""
    missing = set(wanted)
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while missing:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s: {len(missing)} offsets never delivered, "
                f"first {sorted(missing)[:10]}"
            )
        m = consumer.poll(0.2)
        if m is None or m.error() is not None:
            continue
        got.append(m)
        missing.discard(m.offset())
    return got


# ------------------------------------------------------------------ bad commit metadata
VALID = encode_group_token(GroupToken(120, ((70, 120),)))[0]
BAD_METADATA = {
    "truncated": VALID[: len(VALID) // 2],
    "unknown-version": "~fr9:00000000:3c;1y+1e|",
    "garbage-with-our-prefix": "~fr1:zz:not a token at all",
    "edited": VALID.replace("1y+1e", "1y+1f"),
}
FOREIGN = {
    "another-tool": '{"tool": "kafka-streams", "task": "0_1"}',
    "binary-looking": "\x01\x02\xfe garbage \ufffd",
}


@pytest.mark.parametrize("kind", list(BAD_METADATA))
def test_untrusted_token_is_logged_once_and_the_offset_used(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 200)
    plain_commit(bs, unique_group, topic, 50, BAD_METADATA[kind])
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        warnings = our_records(caplog, logging.WARNING)
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert f"{topic} [0]" in warnings[0].getMessage() and "50" in warnings[0].getMessage()
        # the bare offset is safe by itself: 50..199 is the backlog, read by the child
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((50, 200),)
        produce(bs, topic, 20, start=200)
        got = drain_offsets(c, set(range(50, 220)))
        assert min(offsets_of(got)) == 50
        c.commit(asynchronous=False)
        # our own token replaced the bad one: a new assignment logs nothing more
        c.unassign()
        c.assign([TopicPartition(topic, 0)])
        assert len(our_records(caplog, logging.WARNING)) == 1
    finally:
        c.close()
    assert group_offsets(bs, unique_group, topic) == [220]


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_foreign_metadata_is_kept_as_the_applications(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    """Metadata without our prefix may be the application's own: confluent-kafka returns
    it from committed(), so do we; noted at INFO, not a warning. Like confluent-kafka's,
    each commit then stores the metadata it carries (none for a message), inside our
    token when a backlog is pending."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 200)
    plain_commit(bs, unique_group, topic, 50, FOREIGN[kind])
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        assert our_records(caplog, logging.WARNING) == []
        infos = [r.getMessage() for r in our_records(caplog, logging.INFO)]
        assert sum("not a fastrebalance token" in m for m in infos) == 1, infos
        (tp,) = c.committed([TopicPartition(topic, 0)])
        assert (tp.offset, tp.metadata) == (50, FOREIGN[kind])
        produce(bs, topic, 5, start=200)
        got = drain_offsets(c, set(range(50, 205)))
        first = next(m for m in got if m.offset() == 50)
        # the backlog's first record: it and what came before it in delivery order (fresh
        # records only) are claimed, [51, 200) stays pending, so a token is written
        c.commit(message=first, asynchronous=False)
        _, stored = group_metadata(bs, unique_group, topic)
        token = decode_group_token(stored)
        assert token is not None and token.user_metadata is None  # none given ("" is not)
        # 200, where the primary started, claims nothing more: the token carries the metadata
        c.commit(offsets=[TopicPartition(topic, 0, 200, FOREIGN[kind])], asynchronous=False)
        (tp,) = c.committed([TopicPartition(topic, 0)])
        assert (tp.offset, tp.metadata) == (51, FOREIGN[kind])
    finally:
        c.close()


def test_garbage_child_checkpoint_rereads_the_range(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 120)
    # KIP example: crashed with [70, 120) pending, primary at 120; the child's log is garbage
    plain_commit(bs, unique_group, topic, 70, VALID)
    plain_commit(bs, unique_group + ".catchup", topic, 100, "~frc1:deadbeef:1y:3c")
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        warnings = [r.getMessage() for r in our_records(caplog, logging.WARNING)]
        assert len(warnings) == 1 and "checkpoint" in warnings[0], warnings
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((70, 120),)
        got = drain_offsets(c, set(range(70, 120)))
        assert min(offsets_of(got)) == 70
    finally:
        c.close()


# --------------------------------------------------------------- thousands of ranges
BUDGET = 1000
SMALL_BUDGET = {"parallel.rebalance.metadata.max.bytes": BUDGET}


def test_crash_ranges_beyond_the_budget_coalesce_to_fit(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """900 crash ranges on one partition, stored by an incarnation whose metadata budget
    was the broker's (4000 bytes), restored by one with a budget of 1000: the first commit
    must coalesce them to fit. (A token over the broker's 4096 bytes cannot be stored on
    Apache Kafka, OFFSET_METADATA_TOO_LARGE, so a smaller budget stands in for "more ranges
    than fit".)"""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 30_000)
    ranges = tuple((10 * i, 10 * i + 3) for i in range(900))  # 2700 offsets pending
    pending = RangeSet(ranges)
    text, written = encode_group_token(GroupToken(30_000, ranges))
    assert written.ranges == ranges and BUDGET < len(text) <= 4000
    plain_commit(bs, unique_group, topic, 0, text)
    caplog.set_level(logging.INFO, logger=OURS)

    c = Consumer(base_conf(bs, unique_group, **SMALL_BUDGET))
    delivered: set[int] = set()
    try:
        c.assign([TopicPartition(topic, 0)])
        assert len(c.catchup_status()[(topic, 0)].pending_ranges) == 900
        got = drain(c, lambda ms: len(ms) >= 500)
        delivered |= offsets_of(got)
        c.commit(asynchronous=False)  # the first commit coalesces
        _, stored = group_metadata(bs, unique_group, topic)
        assert len(stored.encode()) <= BUDGET
        token = decode_group_token(stored)
        assert token is not None and 1 < len(token.ranges) < 900
        # coalescing only adds offsets to re-read: every pending offset is still pending
        covered = RangeSet(token.ranges)
        assert all(o in covered for s, e in ranges for o in range(s, e) if o not in delivered)
        assert any("coalesced" in r.getMessage() for r in our_records(caplog, logging.INFO))
        # memory agrees with Kafka
        assert c.catchup_status()[(topic, 0)].pending_ranges == token.ranges
    finally:
        c.close()  # no auto-commit: a crash, as far as the commit logs know

    c = Consumer(base_conf(bs, unique_group, **SMALL_BUDGET))  # restart: drains what is left
    try:
        c.assign([TopicPartition(topic, 0)])
        left = {o for s, e in pending for o in range(s, e)} - delivered
        got = drain_offsets(c, left)
        delivered |= offsets_of(got)
        c.commit(asynchronous=False)
        assert group_offsets(bs, unique_group, topic) == [30_000]
    finally:
        c.close()
    assert {o for s, e in pending for o in range(s, e)} <= delivered, "nothing skipped"


# -------------------------------------------------------------------------- retention
RETENTION_RECORDS = 60_000  # > the ~45k 100-byte records a mock partition keeps


def produce_padded(bs: str, topic: str, count: int, start: int = 0) -> None:
    """Uncompressed 100-byte records: retention on the mock starts deleting at ~45k."""
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5, "compression.type": "none"})
    for i in range(start, start + count):
        p.produce(topic, value=str(i).encode().ljust(100, b"."), partition=0)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def watermarks(bs: str, topic: str) -> tuple[int, int]:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": "watermarks"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def embedded_only(cluster: Any, why: str) -> None:
    if getattr(cluster, "kind", None) != "embedded":
        pytest.skip(f"{why}: needs the embedded mock cluster")


def test_retention_before_planning_is_reported_and_skipped(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    embedded_only(kafka_cluster, "relies on the mock's small retention")
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce_padded(bs, topic, 200)
    plain_commit(bs, unique_group, topic, 100, None)  # crashed at 100
    produce_padded(bs, topic, RETENTION_RECORDS, start=200)
    low, high = watermarks(bs, topic)
    assert low > 100, "retention did not delete the committed offset's record"
    errors: list[KafkaError] = []
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append))
    try:
        c.assign([TopicPartition(topic, 0)])
        reported = [e for e in errors if e.code() == KafkaError.OFFSET_OUT_OF_RANGE]
        assert len(reported) == 1
        text = reported[0].str()
        assert f"{topic} [0]" in text and f"[100, {low})" in text and "retention" in text
        assert any(f"[100, {low})" in r.getMessage() for r in our_records(caplog, logging.ERROR))
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((low, high),)
        got = drain_offsets(c, set(range(low, high)))
        assert min(offsets_of(got)) == low
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert group_offsets(bs, unique_group, topic) == [high]


def test_retention_while_the_child_reads_is_reported_and_skipped(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    embedded_only(kafka_cluster, "relies on the mock's small retention")
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce_padded(bs, topic, 20_000)
    plain_commit(bs, unique_group, topic, 0, None)  # crashed at 0, end 20000
    errors: list[KafkaError] = []
    # a short prefetch queue: the child must not have fetched the whole range already
    # (the mock answers every fetch with ~1 MB whatever fetch.max.bytes says). The
    # primary gets it too, and the retention reset sends it ~47k records back: with
    # librdkafka's 1 s backoff on a full queue that read took 27 s alone and over 60 s
    # in a loaded CI run, so the backoff is the child's 10 ms (0.7 s).
    small = {
        "queued.max.messages.kbytes": 1,
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": 10,
    }
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append, **small))
    try:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((0, 20_000),)
        first = drain(c, lambda ms: len(ms) >= 100)
        assert max(offsets_of(first)) < 1000
        produce_padded(bs, topic, RETENTION_RECORDS, start=20_000)  # the range is deleted
        low, high = watermarks(bs, topic)
        assert low > 20_000

        def reported() -> list[KafkaError]:
            return [e for e in errors if e.code() == KafkaError.OFFSET_OUT_OF_RANGE]

        deadline = time.monotonic() + 30
        while not reported() and time.monotonic() < deadline:
            c.poll(0.2)
        assert len(reported()) == 1, errors
        text = reported()[0].str()
        assert f"{topic} [0]" in text and ", 20000)" in text and "retention" in text
        assert any("retention" in r.getMessage() for r in our_records(caplog, logging.ERROR))
        # the child moved on: nothing left to read, and processing goes on
        assert (topic, 0) not in c.catchup_status()
        produce(bs, topic, 5, start=high)
        drain_offsets(c, set(range(high, high + 5)))
    finally:
        c.close()


# ------------------------------------------------------------- broker paused / down
SOCKET_TIMEOUT_MS = 3000  # bounds our synchronous commits; close() gets twice that
COMMIT_BOUND_S = 2 * SOCKET_TIMEOUT_MS / 1000 + 2  # the child's commit, then the group's
CLOSE_BOUND_S = 2 * SOCKET_TIMEOUT_MS / 1000 + 2


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
        own_cluster.broker_up(1)


def test_broker_paused_commit_fails_in_bounded_time_and_close_returns(
    broker: OwnCluster, unique_group: str, caplog: pytest.LogCaptureFixture
) -> None:
    bs = broker.bootstrap_servers
    topic = f"paused-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, 200)
    plain_commit(bs, unique_group, topic, 50, None)
    conf = base_conf(bs, unique_group, **{"socket.timeout.ms": SOCKET_TIMEOUT_MS})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, 0)])
    produce(bs, topic, 10, start=200)
    got = drain_offsets(c, set(range(50, 210)))
    done = max((m for m in got if m.offset() < 200), key=lambda m: m.offset())
    c.commit(message=done, asynchronous=False)  # the whole backlog, not the fresh ones
    assert group_offsets(bs, unique_group, topic) == [200]

    broker.pause()
    try:
        fresh = max(got, key=lambda m: m.offset())
        elapsed, outcome = timed(lambda: c.commit(message=fresh, asynchronous=False))
        assert isinstance(outcome, KafkaException), outcome
        assert outcome.args[0].code() == KafkaError._TIMED_OUT
        assert elapsed < COMMIT_BOUND_S
        # The abandoned commit still occupies the handle (confluent-kafka serializes the
        # calls on a handle: poll() would now wait for the broker, as a plain consumer's
        # commit itself would have). close() is the way out, and it is bounded.
        caplog.set_level(logging.ERROR, logger=OURS)
        elapsed, outcome = timed(c.close)
        assert outcome is None and elapsed < CLOSE_BOUND_S, (elapsed, outcome)
        assert any("close() gave up" in r.getMessage() for r in our_records(caplog, logging.ERROR))
    finally:
        broker.resume()
    # nothing was claimed that was not processed: a restart re-reads from 200 at worst
    assert group_offsets(bs, unique_group, topic)[0] in (200, 210)


def test_broker_paused_close_of_a_subscribed_member_returns(
    broker: OwnCluster, unique_group: str
) -> None:
    """close() of a group member runs on_revoke, which commits: bounded too."""
    bs = broker.bootstrap_servers
    topic = f"paused-sub-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, 100)
    conf = base_conf(
        bs, unique_group, **{"socket.timeout.ms": SOCKET_TIMEOUT_MS, "enable.auto.commit": True}
    )
    c = Consumer(conf)
    c.subscribe([topic])
    drain_offsets(c, set(range(100)))
    broker.pause()
    try:
        elapsed, outcome = timed(c.close)
        assert outcome is None and elapsed < CLOSE_BOUND_S, (elapsed, outcome)
    finally:
        broker.resume()


def test_broker_down_at_start_then_up_loses_nothing(broker: OwnCluster, unique_group: str) -> None:
    bs = broker.bootstrap_servers
    topic = f"down-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, 300)
    plain_commit(bs, unique_group, topic, 100, None)  # crashed at 100
    broker.broker_down(1)
    errors: list[KafkaError] = []
    conf = base_conf(
        bs, unique_group, error_cb=errors.append, **{"socket.timeout.ms": SOCKET_TIMEOUT_MS}
    )
    c = Consumer(conf)
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert c.poll(0.2) is None
        # the same errors a plain consumer reports, none fatal
        assert errors and not any(e.fatal() for e in errors)
        assert {e.code() for e in errors} <= {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
        with pytest.raises(KafkaException) as info:  # nothing consumed: nothing to commit
            c.commit(asynchronous=False)
        assert info.value.args[0].code() == KafkaError._NO_OFFSET
        broker.broker_up(1)
        got = drain_offsets(c, set(range(100, 300)))
        assert min(offsets_of(got)) == 100
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert group_offsets(bs, unique_group, topic) == [300]


def test_assign_while_the_broker_is_down_is_bounded(
    broker: OwnCluster,
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without committed offsets there is nothing to plan: assign() gives up after bounded
    retries and lets librdkafka resume from the committed offset itself, as a plain
    consumer does. Nothing is skipped; there is simply no catch-up this time."""
    import fastrebalance._planner as planner_module

    monkeypatch.setattr(planner_module, "REQUEST_TIMEOUT_S", 1.0)
    bs = broker.bootstrap_servers
    topic = f"down-assign-{unique_group}"
    broker.create_topic(topic, 1)
    produce(bs, topic, 300)
    plain_commit(bs, unique_group, topic, 100, None)
    broker.broker_down(1)
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group, **{"socket.timeout.ms": SOCKET_TIMEOUT_MS}))
    try:
        elapsed, outcome = timed(lambda: c.assign([TopicPartition(topic, 0)]))
        assert outcome is None and elapsed < 40, (elapsed, outcome)
        assert any(
            "cannot read committed offsets" in r.getMessage()
            for r in our_records(caplog, logging.ERROR)
        )
        assert c.catchup_status() == {}
        broker.broker_up(1)
        got = drain_offsets(c, set(range(100, 300)))
        assert min(offsets_of(got)) == 100, "resumed from the committed offset"
    finally:
        c.close()


# ------------------------------------------------------------------ commit semantics
def test_commit_of_an_unassigned_partition_is_passed_through(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """As confluent-kafka: stored as given (no token: we know nothing of that partition)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(2)
    produce(bs, topic, 50, partition=0)
    produce(bs, topic, 50, partition=1)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        drain_offsets(c, set(range(50)))
        c.commit(offsets=[TopicPartition(topic, 1, 7)], asynchronous=False)
        assert group_metadata(bs, unique_group, topic, partition=1) == (7, "")
        assert group_offsets(bs, unique_group, topic, partitions=2)[0] < 0  # untouched
    finally:
        c.close()


def test_commit_below_the_committed_offset(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """A rewind, as confluent-kafka stores it, wherever it lands: re-reading is always
    safe. (An offset is a position of the primary's stream: it never claims backlog.)"""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 105)
    plain_commit(bs, unique_group, topic, 100, None)  # lag 5: no catch-up, the start is 100
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        drain_offsets(c, set(range(100, 105)))
        c.commit(offsets=[TopicPartition(topic, 0, 105)], asynchronous=False)
        c.commit(offsets=[TopicPartition(topic, 0, 102)], asynchronous=False)
        assert group_offsets(bs, unique_group, topic) == [102], "a rewind, as confluent-kafka"
        c.commit(offsets=[TopicPartition(topic, 0, 50)], asynchronous=False)
        assert group_offsets(bs, unique_group, topic) == [50], "below the start: a rewind too"
        assert c.committed([TopicPartition(topic, 0)])[0].offset == 50
    finally:
        c.close()


def test_commit_beyond_the_log_end(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stored as given, as confluent-kafka does. The next owner starts there, is reset by
    auto.offset.reset (earliest: everything again, duplicates, nothing skipped), and is
    warned that the committed offset is beyond the log end."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 100)
    # never committed: read in order, as confluent-kafka reads it (no backlog to keep)
    in_order = {"parallel.rebalance.catchup.uncommitted": False}
    c = Consumer(base_conf(bs, unique_group, **in_order))
    try:
        c.assign([TopicPartition(topic, 0)])
        drain_offsets(c, set(range(100)))
        c.commit(offsets=[TopicPartition(topic, 0, 1000)], asynchronous=False)
        assert group_offsets(bs, unique_group, topic) == [1000]
    finally:
        c.close()
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.assign([TopicPartition(topic, 0)])
        warnings = [r.getMessage() for r in our_records(caplog, logging.WARNING)]
        assert any("beyond the log end" in w for w in warnings), warnings
        got = drain_offsets(c, set(range(100)))
        assert min(offsets_of(got)) == 0
    finally:
        c.close()


def test_offset_reset_by_an_operator_is_honoured_after_a_catchup(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator resets the group (kafka-consumer-groups --reset-offsets: our token is
    dropped, the catch-up group is left alone) to reprocess from 50, and nothing is
    produced meanwhile, so the new catch-up range ends where the old one did. The old
    child checkpoint must not apply to it: the records it names are reprocessed."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 120)
    plain_commit(bs, unique_group, topic, 70, None)  # the crashed owner left 70
    first = Consumer(base_conf(bs, unique_group))
    try:
        first.assign([TopicPartition(topic, 0)])
        got = drain_offsets(first, set(range(70, 100)))
        (child_99,) = [m for m in got if m.offset() == 99]
        first.commit(message=child_99, asynchronous=False)
    finally:
        first.close()  # the child's log: [70, 120) processed up to 100
    plain_commit(bs, unique_group, topic, 50, None)  # the operator's reset
    caplog.set_level(logging.INFO, logger=OURS)
    second = Consumer(base_conf(bs, unique_group))
    try:
        second.assign([TopicPartition(topic, 0)])  # plans [50, 120), primary at 120
        # its child's stream waits: a commit of 120 covers the backlog handed out before it
        second._child.pause([(topic, 0)])
        assert any("predates an offset reset" in r.getMessage() for r in caplog.records)
        produce(bs, topic, 1, start=120)
        fresh = next(m for m in drain_offsets(second, {120}) if m.offset() == 120)
        second.commit(message=fresh, asynchronous=False)  # the token, then a crash
    finally:
        second.close()
    third = Consumer(base_conf(bs, unique_group))
    try:
        third.assign([TopicPartition(topic, 0)])
        assert third.catchup_status()[(topic, 0)].pending_ranges == ((50, 120),)
        assert offsets_of(drain_offsets(third, set(range(50, 120)))) >= set(range(50, 120))
    finally:
        third.close()


# ------------------------------------------------------------------------ topic gone
def test_backlog_beyond_the_log_end_is_reported_and_not_retried_forever(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a topic deleted and recreated (or a log truncated) under a pending catch-up
    looks like to the child: its range [500, 1000) lies beyond the new log end (100). It
    reports that once and stops; the range stays pending while the old log is all it
    knows. Once the primary, reset by librdkafka to the new log's start, has handed out
    the new log, a commit sees the reset (its position went back with no seek): the old
    log's offsets are gone, the new log counts from its start, and the commit stores what
    it processed of the new log, as confluent-kafka would (storing 500 made a restart skip
    the new log's records from 100 to 500 once they existed)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 100)
    text, _ = encode_group_token(GroupToken(1000, ((500, 1000),)))
    plain_commit(bs, unique_group, topic, 500, text)
    errors: list[KafkaError] = []
    caplog.set_level(logging.INFO, logger=OURS)
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append))
    try:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 3
        got = []
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.append(m)
        reported = [e for e in errors if e.code() == KafkaError.OFFSET_OUT_OF_RANGE]
        assert len(reported) == 1, errors
        assert f"{topic} [0] offsets [500, 1000) are beyond the log end 100" in reported[0].str()
        starts = [r for r in our_records(caplog, logging.INFO) if "catch-up of" in r.getMessage()]
        assert len(starts) == 1, "the child must not restart in a loop"
        status = c.catchup_status()[(topic, 0)]
        assert status.pending_ranges == ((500, 1000),) and status.child_position is None
        assert got, "the primary reads the new log"
        c.commit(message=got[-1], asynchronous=False)
    finally:
        c.close()
    assert group_offsets(bs, unique_group, topic) == [got[-1].offset() + 1]


class _UnknownPartitionPrimary:
    """The primary handle, except that the partition has vanished from the metadata."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> Any:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Unknown partition"))

    def offsets_for_times(self, partitions: list[TopicPartition], **_: Any) -> Any:
        # what librdkafka answers per partition (TopicPartition() cannot be given an error)
        unknown = KafkaError(KafkaError._UNKNOWN_PARTITION, "Unknown partition")
        return [
            SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1, error=unknown)
            for tp in partitions
        ]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_unknown_partition_with_a_pending_backlog_is_reported(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """Planning a partition the cluster no longer knows (the mock cannot delete topics:
    the unknown-partition answer is injected at the handle)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 120)
    plain_commit(bs, unique_group, topic, 70, VALID)  # [70, 120) pending
    errors: list[KafkaError] = []
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append))
    try:
        swap_primary(c, _UnknownPartitionPrimary(c._primary))
        c.assign([TopicPartition(topic, 0)])
        reported = [e for e in errors if e.code() == KafkaError._UNKNOWN_PARTITION]
        assert len(reported) == 1 and f"{topic} [0] is unknown" in reported[0].str()
        # nothing is dropped: the backlog stays pending, the group offset stays at 70
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((70, 120),)
    finally:
        swap_primary(c, c._primary._inner)
        c.close()
    assert group_offsets(bs, unique_group, topic) == [70]


def test_topic_deleted_while_catching_up(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """On a real broker: delete the topic under a subscribed member mid catch-up. The child
    stops reading what cannot be read any more and says so, the backlog stays pending (never
    claimed processed), every call stays bounded. The assignment itself is librdkafka's: a
    plain confluent-kafka member keeps a deleted topic's partition assigned too (measured on
    Apache Kafka 3.9: still assigned 40 s after the deletion)."""
    if getattr(kafka_cluster, "kind", None) == "embedded":
        pytest.skip(
            "the mock cluster cannot delete topics (AdminClient.delete_topics "
            "times out): covered by the beyond-log-end and unknown-partition tests"
        )
    from confluent_kafka.admin import AdminClient

    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20_000)
    plain_commit(bs, unique_group, topic, 0, None)
    errors: list[KafkaError] = []
    # librdkafka takes a topic for gone only after topic.metadata.propagation.max.ms (30 s by
    # default), as it would for a plain consumer: shortened here to keep the test short
    conf = {
        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        "topic.metadata.propagation.max.ms": 1000,
        "error_cb": errors.append,
        # small prefetch, so that most of the backlog is still on the broker when it goes
        "queued.min.messages": 100,
        "fetch.max.bytes": 1_000_000,
        "message.max.bytes": 1_000_000,
        "max.partition.fetch.bytes": 2000,
    }
    c = Consumer(base_conf(bs, unique_group, **conf))
    try:
        c.subscribe([topic])
        got = drain(c, lambda ms: len(ms) >= 10, timeout=60)
        admin = AdminClient({"bootstrap.servers": bs})  # kept: a dropped client fails its futures
        admin.delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + 30
        slowest = 0.0
        while time.monotonic() < deadline:
            elapsed, _ = timed(lambda: c.poll(0.2))
            slowest = max(slowest, elapsed)
            status = c.catchup_status().get((topic, 0))
            if status is None or status.child_position is None:
                break
        assert slowest < 0.2 + 10, f"a poll(0.2) took {slowest:.1f}s after the deletion"
        status = c.catchup_status().get((topic, 0))
        assert status is None or status.child_position is None, "the child stopped reading"
        if status is not None:  # still assigned: what was not processed is still pending
            delivered = {m.offset() for m in got}
            pending = {o for s, e in status.pending_ranges for o in range(s, e)}
            assert set(range(20_000)) - delivered <= pending
        assert any(topic in e.str() for e in errors), [e.str() for e in errors]
    finally:
        elapsed, outcome = timed(c.close)
    assert outcome is None and elapsed < CLOSE_BOUND_S


@pytest.mark.parametrize("style", ["message", "bare"])
def test_topic_recreated_under_a_live_consumer_skips_nothing(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str, style: str
) -> None:
    """Adversary round 6: a topic deleted and recreated while a member catches up. The
    member hands out the old records it had fetched, then librdkafka resets the primary to
    the new log's start. Commits used to keep the old log's position (400 stored on a log
    ending at 100), so a restart skipped the next 300 records; plain confluent-kafka stores
    what it is given and loses none. The reset is now seen (the position went back with no
    seek): the new log is unprocessed from its start, nothing of it is skipped. A bare
    commit claimed the old log's backlog the child had handed out ([50, 400)) until the
    reset began a new epoch."""
    if getattr(kafka_cluster, "kind", None) == "embedded":
        pytest.skip("the mock cluster cannot delete topics")
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 400)
    plain_commit(bs, unique_group, topic, 50, None)
    conf = {"topic.metadata.propagation.max.ms": 1000, "topic.metadata.refresh.interval.ms": 2000}

    def take(c: Consumer, idle: float = 8.0) -> list[int]:
        got, last = [], time.monotonic()
        while time.monotonic() - last < idle:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            got.append(m.offset())
            if style == "bare":
                c.commit(asynchronous=False)
            else:
                c.commit(message=m, asynchronous=False)
            last = time.monotonic()
        return got

    c = Consumer(base_conf(bs, unique_group, **conf))
    try:
        c.subscribe([topic])
        drain(c, lambda ms: len(ms) >= 20, timeout=60)
        recreate_topic(kafka_cluster, topic, 1)
        produce(bs, topic, 100)
        take(c)
    finally:
        c.close()
    stored = group_offsets(bs, unique_group, topic)[0]
    assert stored <= 100, f"{stored} stored for a log that ends at 100"
    produce(bs, topic, 300, start=100)
    c = Consumer(base_conf(bs, unique_group, **conf))
    try:
        c.subscribe([topic])
        got = set(take(c))
    finally:
        c.close()
    assert set(range(100, 400)) <= got, f"{len(set(range(100, 400)) - got)} records skipped"


# ------------------------------------------------------------ the catch-up group's name
def test_a_catchup_group_with_offsets_of_its_own_is_reported(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """``<group.id>.catchup`` is also the name of another application's group (it has
    committed offsets on the topic): its offsets would be overwritten by our checkpoints.
    That is reported through error_cb (once), naming the setting that fixes it."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 300)
    plain_commit(bs, f"{unique_group}.catchup", topic, 250, None)  # the other application
    plain_commit(bs, unique_group, topic, 100, None)
    errors: list[KafkaError] = []
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append))
    try:
        c.assign([TopicPartition(topic, 0)])  # plans [100, 300): reads the catch-up log
        conflicts = [e for e in errors if e.code() == KafkaError._CONFLICT]
        assert len(conflicts) == 1, errors
        assert "parallel.rebalance.catchup.group.id" in conflicts[0].str()
        drain_offsets(c, set(range(100, 300)))  # the catch-up itself is unaffected
    finally:
        c.close()


def test_a_catchup_group_with_live_members_is_reported(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    """Another application's members subscribe with ``<group.id>.catchup``: the child's
    checkpoint commits are rejected by the group coordinator. Reported through error_cb;
    nothing is lost (the user's group carries the same progress in its token)."""
    bs, topic, theirs = kafka_cluster.bootstrap_servers, topic_factory(1), topic_factory(1)
    produce(bs, topic, 300)
    member = PlainConsumer(
        {"bootstrap.servers": bs, "group.id": f"{unique_group}.catchup", "session.timeout.ms": 6000}
    )
    member.subscribe([theirs])
    deadline = time.monotonic() + 30
    while not member.assignment():
        assert time.monotonic() < deadline, "the other application's member never joined"
        member.poll(0.2)
    plain_commit(bs, unique_group, topic, 100, None)
    errors: list[KafkaError] = []
    c = Consumer(base_conf(bs, unique_group, error_cb=errors.append))
    try:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while not any(e.code() == KafkaError._CONFLICT for e in errors):
            assert time.monotonic() < deadline, errors
            m = c.poll(0.2)
            if m is not None and m.error() is None and m.offset() < 300:
                c.commit(message=m)
        assert sum(e.code() == KafkaError._CONFLICT for e in errors) == 1
    finally:
        c.close()
        close_member(member)
    assert group_offsets(bs, unique_group, topic)[0] >= 100
