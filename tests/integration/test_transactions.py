"""Exactly-once read-process-write: both commit logs travel in the producer's transaction.

On librdkafka's mock cluster, transactional offsets are acknowledged and dropped, so these
tests check what this library does (what it sends, what it claims when, what it delivers
again after an abort, that nothing is written outside a transaction) by recording what
reaches the producer. The end-to-end guarantee, output exactly once after crashes, needs a
broker that stores transactional offsets: those tests probe the cluster and skip here.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer

from fastrebalance import Consumer, KafkaError, KafkaException, TopicPartition
from fastrebalance._token import decode_child_checkpoint, decode_group_token, is_ours

from .helpers import base_conf, drain, produce

pytestmark = pytest.mark.integration

EOS = {"parallel.rebalance.transactional": True, "enable.auto.commit": False}


class RecordingProducer(Producer):  # type: ignore[misc]
    """A real transactional producer that remembers what offsets it was given."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.sent: list[list[TopicPartition]] = []

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, *args: Any) -> None:
        self.sent.append(list(offsets))
        super().send_offsets_to_transaction(offsets, metadata, *args)


def _producer(bs: str) -> RecordingProducer:
    p = RecordingProducer({"bootstrap.servers": bs, "transactional.id": uuid.uuid4().hex})
    p.init_transactions(20)
    return p


def _stored(bs: str, group: str, topic: str) -> tuple[int, str | None]:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        c.close()
    return tp.offset, tp.metadata


def _regain(bs: str, group: str, topic: str, **extra: Any) -> Consumer:
    """Crash with 0 committed, log end 3000: a consumer catching up on [0, 3000)."""
    produce(bs, topic, 3000)
    seed = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    seed.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    seed.close()
    c = Consumer(base_conf(bs, group, **EOS, **extra))
    c.assign([TopicPartition(topic, 0)])
    return c


def _fresh_and_backlog(bs: str, c: Consumer, topic: str) -> tuple[Any, Any, list[Any]]:
    """Produce fresh records and poll until one of each stream is in hand."""
    produce(bs, topic, 20, start=3000)
    got = drain(
        c,
        lambda ms: any(m.offset() >= 3000 for m in ms) and any(m.offset() < 3000 for m in ms),
    )
    fresh = min((m for m in got if m.offset() >= 3000), key=lambda m: m.offset())
    backlog = max((m for m in got if m.offset() < 3000), key=lambda m: m.offset())
    return fresh, backlog, got


def _code(exc: pytest.ExceptionInfo[KafkaException]) -> int:
    return int(exc.value.args[0].code())


def test_nothing_is_written_outside_a_transaction(kafka_cluster, topic_factory, unique_group):
    """Catch-up active, records of both streams handed out: commit() and store_offsets()
    refuse, and unassign() and close() write neither log."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic)
    try:
        fresh, backlog, _ = _fresh_and_backlog(bs, c, topic)
        for call in (
            lambda: c.commit(message=fresh),
            lambda: c.commit(),
            lambda: c.commit(offsets=[TopicPartition(topic, 0, 3001)], asynchronous=False),
            lambda: c.store_offsets(message=backlog),
        ):
            with pytest.raises(KafkaException) as info:
                call()
            assert _code(info) == KafkaError._STATE
        c.unassign()
    finally:
        c.close()
    offset, metadata = _stored(bs, unique_group, topic)
    assert offset == 0 and not metadata, "a write outside any transaction reached the group"
    assert _stored(bs, unique_group + ".catchup", topic)[0] == -1001


def test_a_transaction_carries_both_logs_and_claims_only_once_committed(
    kafka_cluster, topic_factory, unique_group
):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic)
    producer = _producer(bs)
    try:
        fresh, backlog, _ = _fresh_and_backlog(bs, c, topic)
        b = backlog.offset()
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, [fresh, backlog])
        group_offsets, child_offsets = producer.sent
        (g,) = group_offsets
        assert is_ours(g.metadata)
        token = decode_group_token(g.metadata)
        assert token is not None
        # the backlog up to b is claimed, [b + 1, 3000) still pending, the primary's
        # stream claimed up to the fresh record
        assert g.offset == b + 1
        assert token.ranges[0] == (b + 1, 3000)
        assert token.position == fresh.offset() + 1
        (cp_tp,) = child_offsets
        cp = decode_child_checkpoint(cp_tp.metadata, cp_tp.offset)
        assert cp is not None and (cp.start, cp.end, cp.offset) == (0, 3000, b + 1)
        # not committed yet: nothing is claimed in the consumer
        assert c.catchup_status()[(topic, 0)].pending_ranges[0] == (0, 3000)
        c.commit_transaction(producer)
        assert c.catchup_status()[(topic, 0)].pending_ranges[0] == (b + 1, 3000)
        # a second transaction builds on the first
        more = drain(c, lambda ms: any(m.offset() > b for m in ms if m.offset() < 3000))
        later = max((m for m in more if m.offset() < 3000), key=lambda m: m.offset())
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, [later])
        assert producer.sent[-2][0].offset == later.offset() + 1
        c.commit_transaction(producer)
    finally:
        c.close()


def test_an_abort_delivers_again_what_the_transaction_held(
    kafka_cluster, topic_factory, unique_group
):
    """Both streams deliver again from the first record no committed transaction
    claims; the next transaction claims them afresh."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic)
    producer = _producer(bs)
    try:
        fresh, backlog, _ = _fresh_and_backlog(bs, c, topic)
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, [fresh, backlog])
        c.abort_transaction(producer)
        assert c.catchup_status()[(topic, 0)].pending_ranges[0] == (0, 3000)
        again = drain(
            c,
            lambda ms: any(m.offset() == fresh.offset() for m in ms)
            and any(m.offset() == 0 for m in ms),
        )
        offsets = {m.offset() for m in again}
        assert fresh.offset() in offsets and 0 in offsets
        redone = [m for m in again if m.offset() in (0, fresh.offset())]
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, redone)
        c.commit_transaction(producer)
        pending = c.catchup_status()[(topic, 0)].pending_ranges
        assert pending and pending[0][0] >= 1
    finally:
        c.close()


@pytest.mark.parametrize("mode", [True, False], ids=["mode-on", "mode-off"])
def test_an_abort_in_a_group_that_never_committed_delivers_the_batch_again(
    kafka_cluster, topic_factory, unique_group, mode
):
    """Repro adv4-01: a new pipeline (its group never committed) aborts its first
    transaction: the aborted records come again, and the next transaction's offset for
    the group does not pass them. Mode on: back to this assignment's first record; mode
    off: back to the beginning, as Apache Kafka's exactly-once example does."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20)
    conf = base_conf(bs, unique_group, **EOS, **{"enable.parallel.rebalance": mode})
    c = Consumer(conf)
    producer = _producer(bs)
    try:
        c.subscribe([topic])
        first = drain(c, lambda ms: len(ms) >= 10)[:10]
        assert [m.offset() for m in first] == list(range(10))
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, first)
        c.abort_transaction(producer)
        again = drain(c, lambda ms: len(ms) >= 10)[:10]
        assert [m.offset() for m in again] == list(range(10)), "the aborted batch is lost"
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, again)
        c.commit_transaction(producer)
        assert [(tp.partition, tp.offset) for tp in producer.sent[-1]] == [(0, 10)]
    finally:
        c.close()


def test_partitions_that_left_and_a_mode_without_transactions_are_refused(
    kafka_cluster, topic_factory, unique_group
):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic)
    producer = _producer(bs)
    try:
        fresh, _, _ = _fresh_and_backlog(bs, c, topic)
        c.unassign()
        producer.begin_transaction()
        with pytest.raises(KafkaException) as info:
            c.send_offsets_to_transaction(producer, [fresh])
        assert _code(info) == KafkaError._STATE
        assert producer.sent == []
        producer.abort_transaction(10)
    finally:
        c.close()
    plain_mode = Consumer(base_conf(bs, unique_group + "-x"))
    try:
        with pytest.raises(KafkaException) as info:
            plain_mode.send_offsets_to_transaction(producer, [fresh])
        assert _code(info) == KafkaError._STATE
    finally:
        plain_mode.close()


def test_with_the_mode_off_it_is_confluent_kafkas_loop(kafka_cluster, topic_factory, unique_group):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 10)
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": unique_group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = _producer(bs)
    try:
        c.assign([TopicPartition(topic, 0)])
        got = drain(c, lambda ms: len(ms) >= 5)
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, got[:5])
        c.commit_transaction(producer)
        assert [(tp.partition, tp.offset) for tp in producer.sent[0]] == [(0, 5)]
    finally:
        c.close()


def test_committed_transactions_are_what_a_restart_resumes_from(
    transactional_cluster, topic_factory, unique_group
):
    """On a broker that stores transactional offsets: a committed transaction's claims
    are what the group and the catch-up group hold; a restart delivers exactly the
    records no committed transaction claimed."""
    bs, topic = transactional_cluster.bootstrap_servers, topic_factory(1)
    c = _regain(bs, unique_group, topic, **{"isolation.level": "read_committed"})
    producer = _producer(bs)
    try:
        fresh, backlog, _ = _fresh_and_backlog(bs, c, topic)
        producer.begin_transaction()
        c.send_offsets_to_transaction(producer, [fresh, backlog])
        c.commit_transaction(producer)
    finally:
        c.close()
    offset, metadata = _stored(bs, unique_group, topic)
    assert offset == backlog.offset() + 1 and metadata is not None and is_ours(metadata)
    restarted = Consumer(base_conf(bs, unique_group, **EOS))
    try:
        restarted.assign([TopicPartition(topic, 0)])
        got = drain(restarted, lambda ms: any(m.offset() == 2999 for m in ms), timeout=60)
        offsets = {m.offset() for m in got}
        assert backlog.offset() not in offsets and fresh.offset() not in offsets
        assert backlog.offset() + 1 in offsets
    finally:
        restarted.close()


def test_a_zombie_cannot_commit_after_its_partitions_moved(
    transactional_cluster, topic_factory, unique_group
):
    """A member that stops polling past max.poll.interval.ms is out of the group; its
    partition goes to another member. Its transaction, sent with its old generation,
    must fail (KIP-447 fencing), so neither log nor its output becomes visible."""
    bs, topic = transactional_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 100)
    conf = base_conf(
        bs, unique_group, **EOS, **{"max.poll.interval.ms": 6000, "session.timeout.ms": 6000}
    )
    zombie = Consumer(conf)
    successor = Consumer(conf)
    producer = _producer(bs)
    try:
        zombie.subscribe([topic])
        held = drain(zombie, lambda ms: len(ms) >= 10, timeout=60)
        successor.subscribe([topic])
        deadline = time.monotonic() + 60
        while not successor.assignment():  # the zombie does not poll meanwhile
            assert time.monotonic() < deadline, "the partition never moved"
            successor.poll(0.2)
        producer.begin_transaction()
        with pytest.raises(KafkaException):
            zombie.send_offsets_to_transaction(producer, held)
            zombie.commit_transaction(producer)
        zombie.abort_transaction(producer)
    finally:
        for c in (zombie, successor):
            c.close()
    offset, _ = _stored(bs, unique_group, topic)
    assert offset < held[-1].offset() + 1, "the zombie's transaction committed"
