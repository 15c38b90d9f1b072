"""The records and producers the benchmarks, the demo and the crash harnesses write with,
and the few admin calls they share (log ends, a group's offsets, clean-up).

Every record of ``encode_value`` carries its produce time, so a record is *fresh* when it
was produced after a restart, and its latency is its delivery time minus its produce time.

Thread ownership: a ``PacedProducer``'s handle belongs to its own thread; every other
handle made here belongs to the thread that made it.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_END,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka.admin import AdminClient

__all__ = [
    "REQUEST_TIMEOUT_S",
    "VALUE_BYTES",
    "FreshProducer",
    "Key",
    "PacedProducer",
    "check_reachable",
    "cleanup",
    "encode_value",
    "log_ends",
    "partition_keys",
    "produce_backlog",
    "produce_records",
    "produce_time",
    "set_group_offsets",
    "store_offsets",
    "watermarks",
]

Key = tuple[str, int]  #: (topic, partition)
#: Every record is this many bytes: the size the embedded-cluster facts were measured with.
VALUE_BYTES = 100
#: ``B``/``F`` (backlog/fresh), 12-digit sequence, space, 17-char produce time, space.
#: Bytes %-formatting: twice as fast as str.format + encode, which made writing a
#: million-record backlog take 5 s instead of 3.
_HEADER = b"%c%012d %017.6f "
_TS_SLICE = slice(14, 31)
#: A repeated filler so that lz4 shrinks the backlog well below the mock's ~5 MiB per
#: partition retention (the facts file: ~45k uncompressed records per partition survive).
_FILLER = b"fastrebalance KIP-333 demo payload. " * 3
REQUEST_TIMEOUT_S = 10.0


# ----------------------------------------------------------------- records
def encode_value(kind: str, seq: int, ts: float) -> bytes:
    """A 100-byte value carrying its produce time (``time.time()``, seconds)."""
    head = _HEADER % (ord(kind), seq, ts)
    return head + _FILLER[: VALUE_BYTES - len(head)]


def produce_time(value: bytes) -> float:
    return float(value[_TS_SLICE])


# ---------------------------------------------------------------- producing
def produce_backlog(bootstrap: str, topic: str, partitions: int, count: int) -> int:
    """Write ``count`` records round-robin over the partitions; returns failures."""
    return produce_records(bootstrap, partition_keys(topic, partitions), count)


def produce_records(bootstrap: str, keys: Sequence[Key], count: int) -> int:
    """Write ``count`` backlog records round-robin over ``keys``; returns failures.

    Large lz4 batches of a compressible payload: the only way a million records fit
    the mock cluster's retention, and how a real backlog built up under load looks.
    """
    failures = 0

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    for seq in range(count):
        value = encode_value("B", seq, time.time())
        topic, partition = keys[seq % len(keys)]
        while True:
            try:
                producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if seq % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    return failures + remaining


def partition_keys(topic: str, partitions: int) -> list[Key]:
    return [(topic, p) for p in range(partitions)]


class PacedProducer(abc.ABC):
    """Writes ``record(seq)`` for seq = 0, 1, ... at ``rate`` records per second until
    stopped, catching up on the schedule rather than sleeping a fixed period (the main
    thread's work can hold the GIL for a few ms at a time).

    Thread ownership: the Producer handle is created, used and flushed only by this
    object's thread; other threads read the counters after ``stop()`` joined it.
    """

    def __init__(self, conf: dict[str, Any], rate: float, name: str) -> None:
        self._conf, self._rate = conf, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._flush_s = 10.0
        self.sent = 0
        self.failures = 0  #: failed deliveries, and records still unsent at the end
        self.error: BaseException | None = None  #: why the thread stopped producing

    @abc.abstractmethod
    def record(self, seq: int) -> tuple[str, int, bytes]:
        """The ``seq``-th record: (topic, partition, value); each producer says its own."""

    def on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.failures += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_timeout: float = 10.0) -> int:
        """Stop producing, flush; returns the records still undelivered after the flush."""
        self._flush_s = flush_timeout
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.unflushed

    def _run(self) -> None:
        self.unflushed = 0
        try:
            producer = Producer(self._conf)
            started = time.monotonic()
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self._rate) + 1
                while self.sent < due and not self._stop.is_set():
                    topic, partition, value = self.record(self.sent)
                    try:
                        producer.produce(
                            topic, value, partition=partition, on_delivery=self.on_delivery
                        )
                    except BufferError:
                        producer.poll(0.01)
                        continue
                    self.sent += 1
                producer.poll(0)
                self._stop.wait(max(0.0, started + self.sent / self._rate - time.monotonic()))
            self.unflushed = producer.flush(self._flush_s)
            self.failures += self.unflushed
        except BaseException as exc:  # reported by the owner; a thread cannot raise to it
            self.error = exc


class FreshProducer(PacedProducer):
    """Fresh records (``encode_value("F", ...)``) round-robin over ``keys`` (partitions, of
    one topic or several: ``partition_keys``).

    ``linger_ms`` 0 (the default) sends each record as it is due, for latency benchmarks. A
    harness that runs long on the embedded cluster wants batches: librdkafka's mock finds a
    fetch's offset by walking the partition's message sets one by one, so a log of
    single-record sets reads ever slower the deeper it is (3,000 records at offset 27,000 of
    single-record sets: 2.41 s; of 10-record sets: 0.11 s).
    """

    def __init__(
        self, bootstrap: str, keys: Sequence[Key], rate: float, linger_ms: float = 0
    ) -> None:
        conf = {"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": linger_ms}
        super().__init__(conf, rate, "fresh-producer")
        self._keys = list(keys)

    def record(self, seq: int) -> tuple[str, int, bytes]:
        topic, partition = self._keys[seq % len(self._keys)]
        return topic, partition, encode_value("F", seq, time.time())


# ------------------------------------------------------------------- groups
#: Where librdkafka's own lines about the admin clients below go: Python logging, not
#: stderr. A benchmark's report is printed on the terminal, and librdkafka wrote, for
#: one of these short-lived handles destroyed just after its answers, an INFO line among
#: it ("%6|...|BGQUEUE|rdkafka#producer-6| ... Purging 1 unserved events from background
#: queue", in 3 of 4 ``fastrebalance bench`` runs). With a logger, librdkafka queues its
#: lines for ``poll()``: ``_admin`` polls before letting go, so a warning still shows
#: (``fastrebalance.librdkafka WARNING: ...``); what it says while being destroyed, that
#: line among them, is dropped.
_rdlog = logging.getLogger("fastrebalance.librdkafka")


@contextlib.contextmanager
def _admin(bootstrap: str) -> Iterator[AdminClient]:
    """An admin client for a few requests, owned by the calling thread."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _rdlog}
    admin = AdminClient(conf)
    try:
        yield admin
    finally:
        admin.poll(0)


def check_reachable(bootstrap: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
    """Fail in seconds with the address in the message, rather than after the
    admin client's 30 s topic-creation timeout with a bare TimeoutError."""
    with _admin(bootstrap) as admin:
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise RuntimeError(
                f"no Kafka broker answered at {bootstrap} within {timeout:g} s ({exc})"
            ) from None


def watermarks(probe: PlainConsumer, topic: str, partitions: int) -> list[tuple[int, int]]:
    return [
        probe.get_watermark_offsets(
            TopicPartition(topic, p), timeout=REQUEST_TIMEOUT_S, cached=False
        )
        for p in range(partitions)
    ]


def set_group_offsets(bootstrap: str, topic: str, group: str, offsets: Sequence[int]) -> None:
    """Give the never-used ``group`` these committed offsets of ``topic``'s partitions."""
    store_offsets(bootstrap, group, {(topic, p): off for p, off in enumerate(offsets)})


def store_offsets(bootstrap: str, group: str, offsets: dict[Key, int]) -> None:
    """Give the never-used ``group`` these committed offsets, and check they were stored:
    a restart measured from the wrong offsets would measure the wrong backlog."""
    tps = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
    request = [ConsumerGroupTopicPartitions(group, tps)]
    with _admin(bootstrap) as admin:
        altered = admin.alter_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT_S)
        altered[group].result()
        listed = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in offsets])],
            request_timeout=REQUEST_TIMEOUT_S,
        )[group].result()
    stored = {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}
    if stored != offsets:
        wrong = {k: v for k, v in stored.items() if offsets.get(k) != v}
        raise RuntimeError(f"setting offsets of {group!r} stored {wrong}, not what was asked")


def log_ends(probe: PlainConsumer, keys: Sequence[Key]) -> dict[Key, int]:
    """Every partition's log end in one ListOffsets request (a partition without an
    answer is asked alone): many partitions, one round trip."""
    ask = [TopicPartition(t, p, OFFSET_END) for t, p in keys]
    ends: dict[Key, int] = {}
    with contextlib.suppress(KafkaException):
        for tp in probe.offsets_for_times(ask, timeout=REQUEST_TIMEOUT_S):
            if tp.error is None and tp.offset >= 0:
                ends[(tp.topic, tp.partition)] = tp.offset
    for key in keys:
        if key not in ends:
            _low, high = probe.get_watermark_offsets(
                TopicPartition(*key), timeout=REQUEST_TIMEOUT_S, cached=False
            )
            ends[key] = high
    return ends


def cleanup(bootstrap: str, topics: Sequence[str], groups: Sequence[str]) -> None:
    """Best effort: leave a cluster the user named as we found it; a leftover topic
    is harmless, so failures pass silently. (An embedded cluster dies with us.)"""
    with _admin(bootstrap) as admin:
        futures: list[Any] = list(admin.delete_topics(list(topics), request_timeout=10).values())
        if groups:
            futures += admin.delete_consumer_groups(list(groups), request_timeout=10).values()
        for future in futures:
            with contextlib.suppress(Exception):
                future.result(timeout=15)
