"""fastrebalance.aio.AIOConsumer: the KIP-333 story, commit routing, a crash and restart,
cancelled polls, and parity with confluent_kafka.aio.AIOConsumer with the mode off.

Each test runs its own event loop (asyncio.run): no plugin is needed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.aio import AIOConsumer as PlainAIOConsumer

from fastrebalance import TopicPartition
from fastrebalance.aio import AIOConsumer

from .helpers import base_conf, group_offsets, produce

pytestmark = pytest.mark.integration


def _crash_with_committed(bs: str, group: str, topic: str, committed: int) -> None:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
    c.close()


async def _drain(
    c: Any, wanted: set[int], timeout: float = 30.0, got: list[Any] | None = None
) -> list[Any]:
    got = [] if got is None else got
    deadline = time.monotonic() + timeout
    while not wanted <= {m.offset() for m in got}:
        missing = sorted(wanted - {m.offset() for m in got})
        assert time.monotonic() < deadline, f"missing {missing[:5]}"
        got += [m for m in await c.consume(100, 0.2) if m.error() is None]
    return got


def test_kip_example_crash_at_100_committed_70_end_120(kafka_cluster, topic_factory, unique_group):
    """Crash at 100 with 70 committed, log end 120: fresh records first, [70, 120) caught
    up by the child, on_assign a coroutine that assign()s (re-entrant)."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 120)
    _crash_with_committed(bs, unique_group, topic, 70)

    async def run() -> None:
        seen: list[list[TopicPartition]] = []

        async def on_assign(consumer: Any, partitions: list[TopicPartition]) -> None:
            seen.append(partitions)
            await consumer.assign(partitions)

        c = AIOConsumer(base_conf(bs, unique_group))
        try:
            await c.subscribe([topic], on_assign=on_assign)
            deadline = time.monotonic() + 30
            early = []  # the call that serves the assignment may return a record too
            while not await c.catchup_status():
                assert time.monotonic() < deadline, "no catch-up"
                m = await c.poll(0.1)
                if m is not None and m.error() is None:
                    early.append(m)
            status = (await c.catchup_status())[(topic, 0)]
            assert status.pending_ranges == ((70, 120),)
            assert await c.child_consumer_is_alive() and await c.childConsumerIsAlive()
            assert [tp.offset for tp in seen[0]] == [-1001]
            produce(bs, topic, 10, start=120)
            got = await _drain(c, set(range(70, 130)), got=early)
            assert sorted({m.offset() for m in got}) == list(range(70, 130))
            last_backlog = max((m for m in got if m.offset() < 120), key=lambda m: m.offset())
            await c.commit(message=last_backlog, asynchronous=False)  # the child's stream
            assert group_offsets(bs, unique_group, topic) == [120]  # the fresh ones pending
            await c.commit(asynchronous=False)  # everything handed out
            assert group_offsets(bs, unique_group, topic) == [130]
        finally:
            await c.close()

    asyncio.run(run())


def test_crash_and_restart_loses_nothing(kafka_cluster, topic_factory, unique_group):
    """Crash with 0 committed, log end 3000; the first consumer processes and commits part
    of both streams, then dies without a word (closed with nothing more committed); the
    second delivers everything that was not committed."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 3000)
    _crash_with_committed(bs, unique_group, topic, 0)

    async def run() -> tuple[set[int], set[int]]:
        c = AIOConsumer(base_conf(bs, unique_group))
        await c.assign([TopicPartition(topic, 0)])
        produce(bs, topic, 100, start=3000)
        got = await _drain(c, {3000, 500})
        last = max(got, key=lambda m: m.offset())
        done = [m for m in got if m.offset() == 500] + [last]
        for m in done:
            await c.commit(message=m, asynchronous=False)
        await c.close()
        # the last fresh record also claims what was handed out before it, from either
        # stream, if the latest call returned it (as confluent-kafka's commit claims
        # every record delivered before it); the rest must come again
        before = {m.offset() for m in got[: next(i for i, m in enumerate(got) if m is last)]}
        claimed = set(range(0, 501)) | set(range(3000, last.offset() + 1)) | before
        c = AIOConsumer(base_conf(bs, unique_group))
        try:
            await c.assign([TopicPartition(topic, 0)])
            again = await _drain(c, set(range(3100)) - claimed, timeout=60)
            return {m.offset() for m in again}, claimed
        finally:
            await c.close()

    redelivered, claimed = asyncio.run(run())
    assert set(range(501, 3000)) - claimed <= redelivered


def test_a_cancelled_poll_loses_nothing_and_sticks_nothing(
    kafka_cluster, topic_factory, unique_group
):
    """Polls cancelled by asyncio.wait_for while a catch-up runs: the records their calls
    return come with the next calls, every record arrives, and a bare commit() never claims
    a record the application was not handed."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 2000)
    _crash_with_committed(bs, unique_group, topic, 0)

    async def run() -> None:
        c = AIOConsumer(base_conf(bs, unique_group))
        handed: set[int] = set()
        cancelled = calls = committed_at = 0
        try:
            await c.assign([TopicPartition(topic, 0)])
            produce(bs, topic, 200, start=2000)
            deadline = time.monotonic() + 60
            while not set(range(2200)) <= handed:
                assert time.monotonic() < deadline, f"{len(handed)} of 2200, stuck?"
                calls += 1
                # three calls in four are cancelled: before they start, or mid-flight
                wait = (5.0, 0, 0.0003, 0.001)[calls % 4]
                try:
                    if calls % 2:
                        got = await asyncio.wait_for(c.consume(5, 0.5), wait)
                    else:
                        got = [await asyncio.wait_for(c.poll(0.5), wait)]
                except asyncio.TimeoutError:
                    cancelled += 1
                    got = []
                handed |= {m.offset() for m in got if m is not None and m.error() is None}
                # as librdkafka's, a bare commit with nothing handed out since the last one
                # raises _NO_OFFSET (under load 25 calls in a row can come back empty)
                if len(handed) > committed_at and calls % 25 == 0:
                    committed_at = len(handed)
                    try:
                        await c.commit(asynchronous=False)
                    except KafkaException as e:
                        # Seen once (Kafka 3.9, stop 41's CI): _NO_OFFSET although this test
                        # had received records since its last commit, perhaps ones the
                        # consumer handed out earlier into a cancelled call's stash; the
                        # cause is not found (stop 41's note). A commit that claims less is
                        # allowed; what must hold is checked below either way.
                        if e.args[0].code() != KafkaError._NO_OFFSET:
                            raise
                    stored = group_offsets(bs, unique_group, topic)[0]
                    unhanded = min(o for o in range(2201) if o not in handed)
                    assert stored <= unhanded, (stored, unhanded)
            kept_for_later = c._stash
            assert not kept_for_later, "every record was handed out in the end"
            assert cancelled > 10, "the test did not cancel anything"
        finally:
            await c.close()

    asyncio.run(run())


def test_the_record_of_a_cancelled_poll_comes_with_the_next(
    kafka_cluster, topic_factory, unique_group
):
    """A poll() waits for a record; its caller is cancelled; the record arrives and the
    call returns it to nobody. It is not lost: a bare commit() meanwhile does not claim
    it, and the next poll() returns it."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 10)
    _crash_with_committed(bs, unique_group, topic, 10)  # nothing to catch up

    async def run() -> None:
        c = AIOConsumer(base_conf(bs, unique_group))
        try:
            await c.assign([TopicPartition(topic, 0)])
            produce(bs, topic, 1, start=10)
            first = await c.poll(10)
            assert first is not None and first.offset() == 10
            await c.commit(asynchronous=False)
            waiting = asyncio.ensure_future(c.poll(10))
            await asyncio.sleep(0.5)  # the call waits in librdkafka for a record
            waiting.cancel()
            produce(bs, topic, 1, start=11)  # ... which arrives after the cancellation
            deadline = time.monotonic() + 10
            while not c._stash:  # the cancelled call has returned it: kept
                assert time.monotonic() < deadline, "the cancelled call never returned"
                await asyncio.sleep(0.05)
            await c.commit(asynchronous=False)
            assert group_offsets(bs, unique_group, topic) == [11], "11 was not handed out"
            kept = await c.poll(0)
            assert kept is not None and kept.offset() == 11
            await c.commit(asynchronous=False)
            assert group_offsets(bs, unique_group, topic) == [12]
        finally:
            await c.close()

    asyncio.run(run())


def test_mode_off_is_confluent_kafka_s_aio_consumer(kafka_cluster, topic_factory, unique_group):
    """Same records, same order, as confluent_kafka.aio.AIOConsumer."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 500)

    async def read(cls: Any, group: str) -> list[tuple[int, int]]:
        conf = {"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": False, "fetch.wait.max.ms": 10}  # fmt: skip
        c = cls(conf)
        got: list[tuple[int, int]] = []
        try:
            await c.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 30
            while len(got) < 500:
                assert time.monotonic() < deadline
                got += [(m.partition(), m.offset()) for m in await c.consume(64, 0.2)]
            await c.commit(asynchronous=False)
        finally:
            await c.close()
        return got

    ours = asyncio.run(read(AIOConsumer, unique_group + "-ours"))
    theirs = asyncio.run(read(PlainAIOConsumer, unique_group + "-theirs"))
    assert ours == theirs
    assert group_offsets(bs, unique_group + "-ours", topic) == [500]
