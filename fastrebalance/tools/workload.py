"""The restart workload shared by ``fastrebalance demo`` and ``fastrebalance bench``.

Both tell the same story: a group's committed offsets lag the log end by a backlog,
a producer keeps writing fresh timestamped records, and a consumer restarts. The
demo shows one plain and one fastrebalance restart; the benchmark repeats them over
backlog sizes and work per record. Sharing the record format, the producers and,
above all, the measuring loop keeps the two from drifting apart: a number printed by
the demo means what the same number means in docs/benchmarks.md.

Every record carries its produce time, so a record is *fresh* when it was produced
after the restart, and its latency is its delivery time minus its produce time.

Thread ownership: ``FreshProducer``'s handle belongs to its own thread; every other
handle made here belongs to the thread that made it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    "BATCH",
    "CONSUME_TIMEOUT_S",
    "FETCH_WAIT_MS",
    "REQUEST_TIMEOUT_S",
    "SESSION_TIMEOUT_MS",
    "VALUE_BYTES",
    "FreshProducer",
    "Key",
    "RunResult",
    "busy",
    "check_reachable",
    "cleanup",
    "encode_value",
    "format_duration",
    "log_ends",
    "measure_restart",
    "partition_keys",
    "percentile",
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
#: Records asked per consume() call: every measured consumer uses the same loop and batch.
BATCH = 500
#: consume() returns when it has BATCH records *or* this timeout passed: a longer wait
#: would hold each trickle of fresh records back for the whole timeout and be measured
#: as latency. 10 ms matches fetch.wait.max.ms.
CONSUME_TIMEOUT_S = 0.01
#: Session timeout of every group member, as the embedded-cluster facts were measured.
SESSION_TIMEOUT_MS = 6000
#: The mock holds empty fetches for fetch.wait.max.ms; its 500 ms default would dominate
#: every latency measured here (facts file: p50 250-330 ms instead of ~6 ms).
FETCH_WAIT_MS = 10
REQUEST_TIMEOUT_S = 10.0


# ----------------------------------------------------------------- records
def encode_value(kind: str, seq: int, ts: float) -> bytes:
    """A 100-byte value carrying its produce time (``time.time()``, seconds)."""
    head = _HEADER % (ord(kind), seq, ts)
    return head + _FILLER[: VALUE_BYTES - len(head)]


def produce_time(value: bytes) -> float:
    return float(value[_TS_SLICE])


def busy(seconds: float) -> None:
    """Burn CPU like per-record processing would; sleeping would free the GIL and
    flatter whichever consumer does more of its work in librdkafka's threads."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: always a value that was really measured."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def format_duration(seconds: float | None) -> str:
    """A measured time as the demo and the benchmark print it ("-": never happened)."""
    if seconds is None:
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


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


class FreshProducer:
    """Writes fresh records at a steady rate, round-robin over ``keys`` (partitions, of one
    topic or several: ``partition_keys``), until stopped.

    Thread ownership: the Producer handle is created, used and flushed only by this
    object's thread; other threads read the counters after ``stop()`` joined it.
    """

    def __init__(self, bootstrap: str, keys: Sequence[Key], rate: float) -> None:
        self._conf = {"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 0}
        self._keys = list(keys)
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fresh-producer", daemon=True)
        self.produced = 0
        self.failures = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.failures += 1

    def _run(self) -> None:
        try:
            producer = Producer(self._conf)
            started = time.monotonic()
            seq = 0
            while not self._stop.is_set():
                # Catch up on the schedule rather than sleep a fixed period: the main
                # thread's busy work can hold the GIL for a few ms at a time.
                due = int((time.monotonic() - started) * self._rate) + 1
                while seq < due:
                    value = encode_value("F", seq, time.time())
                    topic, partition = self._keys[seq % len(self._keys)]
                    try:
                        producer.produce(
                            topic, value, partition=partition, on_delivery=self._on_delivery
                        )
                    except BufferError:
                        producer.poll(0.01)
                        continue
                    seq += 1
                producer.poll(0)
                self._stop.wait(max(0.0, started + seq / self._rate - time.monotonic()))
            self.failures += producer.flush(10)
            self.produced = seq
        except BaseException as exc:  # reported by the owner; a thread cannot raise to it
            self.error = exc


# ------------------------------------------------------------------- groups
def check_reachable(bootstrap: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
    """Fail in seconds with the address in the message, rather than after the
    admin client's 30 s topic-creation timeout with a bare TimeoutError."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
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
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
    request = [ConsumerGroupTopicPartitions(group, tps)]
    admin.alter_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT_S)[group].result()
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
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures: list[Any] = list(admin.delete_topics(list(topics), request_timeout=10).values())
    if groups:
        futures += admin.delete_consumer_groups(list(groups), request_timeout=10).values()
    for future in futures:
        with contextlib.suppress(Exception):
            future.result(timeout=15)


# ------------------------------------------------------------- one restart
@dataclass(frozen=True)
class RunResult:
    """One restarted consumer, timed from its construction (the restart).

    Times are seconds; None when the event never happened (e.g. no fresh record
    arrived before the run timeout).

    Attributes:
        label: "plain" or "fastrebalance".
        group_id: the group it joined, holding the prepared offsets at the start.
        backlog: records between the committed offsets and the log end at the restart,
            from the real watermarks.
        joined_s: the group assigned it partitions.
        first_fresh_s: it delivered the first record produced after the restart.
        fresh_p50_s, fresh_p99_s: produce-to-delivery latency of fresh records (those
            produced within ``window_s`` of the restart, when a window was given).
        fresh_records: fresh records delivered (within the window, when given).
        fresh_out_of_order: fresh records delivered after a higher offset of their
            partition. For fastrebalance these are the records produced between the
            restart and the moment it read the log end: they lie below where its
            primary starts, so its child delivers them with the backlog. With few
            fresh records in a run, they decide its p99.
        backlog_done_s: every backlog record had been delivered at least once.
        caught_up_s: every record below the final log end had been delivered.
        delivered: records handed to the application, duplicates included.
        expected: distinct records it had to deliver: committed offsets to final log end.
        duplicates: deliveries of an offset already delivered in this run.
        lost: expected records never delivered.
        timed_out: the run hit its timeout.
        errors: error events returned by poll/consume (first few).
        child_alive: fastrebalance only: its child consumer was alive at the end.
        fresh_max_s: the worst fresh latency (same records as p50/p99).
        records_per_s: deliveries up to the end of the backlog divided by the time from
            the restart to that moment, join included: what the restart costs in total.
        window_s: the fresh-latency window, None for the whole run.
        samples: (delivered at, latency) of each fresh record counted, seconds since the
            restart; only when asked for (plots).
        close_s: how long ``close()`` took at the end (commits, leaving the group).
    """

    label: str
    group_id: str
    backlog: int
    joined_s: float | None
    first_fresh_s: float | None
    fresh_p50_s: float | None
    fresh_p99_s: float | None
    fresh_records: int
    fresh_out_of_order: int
    backlog_done_s: float | None
    caught_up_s: float | None
    delivered: int
    expected: int
    duplicates: int
    lost: int
    timed_out: bool
    errors: tuple[str, ...] = ()
    child_alive: bool | None = None
    fresh_max_s: float | None = None
    records_per_s: float | None = None
    window_s: float | None = None
    samples: tuple[tuple[float, float], ...] = ()
    close_s: float | None = None


def measure_restart(
    label: str,
    make: Callable[[dict[str, Any]], Any],
    *,
    bootstrap: str,
    topic: str,
    group: str,
    start: Sequence[int],
    probe: PlainConsumer,
    work_us: float,
    tail_s: float,
    run_timeout_s: float,
    window_s: float | None = None,
    keep_samples: bool = False,
    progress: Callable[[float, int, int, float | None], None] | None = None,
) -> RunResult:
    """Restart ``group`` with the consumer ``make`` builds and time what it delivers.

    The run ends once the backlog is delivered, ``tail_s`` seconds of fresh traffic
    have followed (and the whole window, when one is given, plus ``tail_s``), and every
    offset below the log end read at that point has been delivered; whatever is still
    missing then, or at ``run_timeout_s``, is *lost*.

    ``window_s`` limits the fresh-latency statistics to records produced within that
    many seconds of the restart, so that runs of different lengths (a plain replay of
    a million records takes far longer than fastrebalance) compare the same records.

    ``progress(elapsed_s, backlog_delivered, backlog, first_fresh_s)`` is called about
    twice a second, for a live display; it must be cheap.
    """
    partitions = len(start)
    backlog_end = [high for _low, high in watermarks(probe, topic, partitions)]
    backlog = sum(max(0, e - s) for s, e in zip(start, backlog_end, strict=True))
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "auto.offset.reset": "earliest",
    }
    work_s = work_us / 1e6
    min_run_s = 0.0 if window_s is None else window_s + tail_s
    # seen[p][i] != 0 once offset start[p] + i was delivered: C-speed scans later.
    seen = [bytearray(max(0, e - s) + 4096) for s, e in zip(start, backlog_end, strict=True)]
    backlog_left = backlog
    latencies: list[float] = []
    samples: list[tuple[float, float]] = []
    delivered = duplicates = out_of_order = 0
    delivered_at_backlog_done: int | None = None
    highest = [-1] * partitions  # highest offset delivered so far, per partition
    errors: list[str] = []
    joined: list[float] = []
    first_fresh_s = backlog_done_s = caught_up_s = None
    final_end: list[int] | None = None
    timed_out = False
    child_alive: bool | None = None

    next_progress = 0.0
    restart_wall = time.time()
    window_end = float("inf") if window_s is None else restart_wall + window_s
    t0 = time.monotonic()
    consumer = make(conf)
    try:

        def on_assign(_consumer: Any, _partitions: list[TopicPartition]) -> None:
            if not joined:
                joined.append(time.monotonic() - t0)

        consumer.subscribe([topic], on_assign=on_assign)
        if backlog == 0:
            backlog_done_s = 0.0
        while True:
            for m in consumer.consume(BATCH, CONSUME_TIMEOUT_S):
                if m.error() is not None:
                    if len(errors) < 10:
                        errors.append(str(m.error()))
                    continue
                now = time.time()
                delivered += 1
                p, off = m.partition(), m.offset()
                behind = off < highest[p]
                if not behind:
                    highest[p] = off
                i = off - start[p]
                if i >= 0:
                    arr = seen[p]
                    if i >= len(arr):
                        arr.extend(bytes(i + 1 - len(arr) + 4096))
                    if arr[i]:
                        duplicates += 1
                    else:
                        arr[i] = 1
                        if off < backlog_end[p]:
                            backlog_left -= 1
                            if backlog_left == 0:
                                backlog_done_s = time.monotonic() - t0
                                delivered_at_backlog_done = delivered
                ts = produce_time(m.value())
                if ts >= restart_wall:
                    if first_fresh_s is None:
                        first_fresh_s = time.monotonic() - t0
                    if ts < window_end:
                        latencies.append(now - ts)
                        out_of_order += behind
                        if keep_samples:
                            samples.append((now - restart_wall, now - ts))
                if work_s:
                    busy(work_s)
            elapsed = time.monotonic() - t0
            if progress is not None and elapsed >= next_progress:
                next_progress = elapsed + 0.5
                progress(elapsed, backlog - backlog_left, backlog, first_fresh_s)
            if (
                backlog_done_s is not None
                and elapsed >= backlog_done_s + tail_s
                and elapsed >= min_run_s
            ):
                if final_end is None:
                    final_end = [high for _low, high in watermarks(probe, topic, partitions)]
                if all(
                    len(arr) >= e - s and arr.find(0, 0, e - s) == -1
                    for arr, s, e in zip(seen, start, final_end, strict=True)
                ):
                    caught_up_s = elapsed
                    break
            if elapsed > run_timeout_s:
                timed_out = True
                break
        alive = getattr(consumer, "child_consumer_is_alive", None)
        child_alive = alive() if alive is not None else None
    finally:
        closing = time.monotonic()
        consumer.close()
        close_s = time.monotonic() - closing

    end = final_end if final_end is not None else backlog_end
    expected = lost = 0
    for arr, s, e in zip(seen, start, end, strict=True):
        n = max(0, e - s)
        expected += n
        lost += n - min(n, len(arr)) + arr.count(0, 0, n)
    rate = None
    if backlog_done_s and delivered_at_backlog_done:
        rate = delivered_at_backlog_done / backlog_done_s
    latencies.sort()
    return RunResult(
        label=label,
        group_id=group,
        backlog=backlog,
        joined_s=joined[0] if joined else None,
        first_fresh_s=first_fresh_s,
        fresh_p50_s=percentile(latencies, 50),
        fresh_p99_s=percentile(latencies, 99),
        fresh_records=len(latencies),
        fresh_out_of_order=out_of_order,
        backlog_done_s=backlog_done_s,
        caught_up_s=caught_up_s,
        delivered=delivered,
        expected=expected,
        duplicates=duplicates,
        lost=lost,
        timed_out=timed_out,
        errors=tuple(errors),
        child_alive=child_alive,
        fresh_max_s=latencies[-1] if latencies else None,
        records_per_s=rate,
        window_s=window_s,
        samples=tuple(samples),
        close_s=close_s,
    )
