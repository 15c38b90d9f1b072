"""``fastrebalance demo``: a crash, a backlog, and two restarts compared side by side.

The story follows KIP-333's own example ("crash at 100, committed 70, end 120"): a
consumer committed at the start of a backlog and crashed; while it was down the log
grew and a producer keeps writing fresh records. We then restart the same group
twice, one run after the other so that the timings are comparable:

(a) a plain ``confluent_kafka.Consumer``, which must replay the whole backlog before
    it reaches a single fresh record;
(b) ``fastrebalance.Consumer`` with ``enable.parallel.rebalance=True``, whose primary
    starts at the log end while the child reads the backlog in parallel.

Both runs start from the same committed offsets: the crashed group's offsets are
copied into two fresh group ids, because a restarted consumer moves its group's
offsets and the second run would otherwise start where the first one ended.

Every record carries its produce time, so a record is *fresh* when it was produced
after the restart, and its latency is its delivery time minus its produce time. A
run ends once the backlog is delivered, ``tail_s`` seconds of steady fresh traffic
have followed, and every offset below the log end read at that point has been
delivered; whatever is still missing then (or at the run timeout) is *lost*.

Thread ownership: the fresh producer's handle belongs to its own thread; every
other handle (cluster admin, watermark probe, the consumers) belongs to the thread
that calls ``run_demo()``.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from ._config import DEFAULT_LAG_THRESHOLD
from ._consumer import Consumer as FastConsumer
from .testing import EmbeddedKafka, ExternalKafka, KafkaCluster

__all__ = ["DemoResult", "DemoSettings", "RunResult", "format_results", "run_demo"]

Out = Callable[[str], None]

#: Every record is this many bytes: the size the embedded-cluster facts were measured with.
VALUE_BYTES = 100
#: ``B``/``F`` (backlog/fresh), 12-digit sequence, space, 17-char produce time, space.
_HEADER = "{kind}{seq:012d} {ts:017.6f} "
_TS_SLICE = slice(14, 31)
#: A repeated filler so that lz4 shrinks the backlog well below the mock's ~5 MiB per
#: partition retention (the facts file: ~45k uncompressed records per partition survive).
_FILLER = b"fastrebalance KIP-333 demo payload. " * 3
#: Records asked per consume() call: both runs use the same loop and batch size.
_BATCH = 500
#: consume() returns when it has _BATCH records *or* this timeout passed: a longer wait
#: would hold each trickle of fresh records back for the whole timeout and be measured
#: as latency. 10 ms matches fetch.wait.max.ms.
_CONSUME_TIMEOUT_S = 0.01
#: Session timeout of every group member in the demo, as the brief and the facts use.
_SESSION_TIMEOUT_MS = 6000
#: The mock holds empty fetches for fetch.wait.max.ms; its 500 ms default would dominate
#: every latency measured here (facts file: p50 250-330 ms instead of ~6 ms).
_FETCH_WAIT_MS = 10
#: Records the crashed consumer reads past its last commit before it dies.
_READ_BEFORE_CRASH = 1000
_REQUEST_TIMEOUT_S = 10.0
#: Printed lines wrap here; step details are indented under their step.
_WIDTH = 92
_INDENT = "      "


@dataclass(frozen=True)
class DemoSettings:
    """What to run. Defaults finish in about 20 s on the embedded cluster.

    Attributes:
        backlog: records produced before the restart, spread evenly over the partitions.
        partitions: partitions of the demo topic.
        rate: fresh records per second written during both runs.
        work_us: simulated busy work per delivered record, microseconds.
        bootstrap_servers: an existing cluster; None starts an embedded one.
        tail_s: seconds of fresh traffic each run keeps reading after its backlog is
            delivered, so both report steady-state latencies too.
        run_timeout_s: a run that has not delivered everything by then stops, and
            whatever it has not delivered counts as lost.
    """

    backlog: int = 200_000
    partitions: int = 4
    rate: float = 100.0
    work_us: float = 20.0
    bootstrap_servers: str | None = None
    tail_s: float = 2.0
    run_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backlog < 0:
            raise ValueError(f"backlog={self.backlog} is invalid: expected records >= 0")
        if self.partitions < 1:
            raise ValueError(f"partitions={self.partitions} is invalid: expected >= 1")
        if not self.rate > 0:
            raise ValueError(f"rate={self.rate} is invalid: expected records/s > 0")
        if self.work_us < 0 or self.tail_s < 0:
            raise ValueError("work_us and tail_s must be >= 0")
        if not self.run_timeout_s > 0:
            raise ValueError(f"run_timeout_s={self.run_timeout_s} is invalid: expected > 0")


@dataclass(frozen=True)
class RunResult:
    """One restarted consumer, timed from its construction (the restart).

    Times are seconds; None when the event never happened (e.g. no fresh record
    arrived before the run timeout).

    Attributes:
        label: "plain" or "fastrebalance".
        group_id: the group it joined, holding the copied offsets at the start.
        backlog: records between the committed offsets and the log end at the restart,
            from the real watermarks.
        joined_s: the group assigned it partitions.
        first_fresh_s: it delivered the first record produced after the restart.
        fresh_p50_s, fresh_p99_s: produce-to-delivery latency of fresh records.
        fresh_records: fresh records delivered.
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
        timed_out: the run hit ``run_timeout_s``.
        errors: error events returned by poll/consume (first few).
        child_alive: fastrebalance only: its child consumer was alive at the end.
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


@dataclass(frozen=True)
class DemoResult:
    """Everything ``run_demo()`` measured; ``lost`` is what the CLI's exit code checks."""

    settings: DemoSettings
    cluster: str
    topic: str
    crashed_group: str
    #: Records in the log after the backlog was produced, from the watermarks.
    log_backlog: int
    plain: RunResult
    fast: RunResult
    fresh_produced: int
    produce_failures: int
    wall_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def lost(self) -> int:
        return self.plain.lost + self.fast.lost

    @property
    def ok(self) -> bool:
        return self.lost == 0


# ----------------------------------------------------------------- records
def encode_value(kind: str, seq: int, ts: float) -> bytes:
    """A 100-byte value carrying its produce time (``time.time()``, seconds)."""
    head = _HEADER.format(kind=kind, seq=seq, ts=ts).encode()
    return head + _FILLER[: VALUE_BYTES - len(head)]


def produce_time(value: bytes) -> float:
    return float(value[_TS_SLICE])


def _busy(seconds: float) -> None:
    """Burn CPU like per-record processing would; sleeping would free the GIL and
    flatter whichever consumer does more of its work in librdkafka's threads."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: always a value that was really measured."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


# ---------------------------------------------------------------- producing
def _produce_backlog(bootstrap: str, topic: str, partitions: int, count: int) -> int:
    """Write ``count`` records round-robin over the partitions; returns failures."""
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
        while True:
            try:
                producer.produce(topic, value, partition=seq % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if seq % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    return failures + remaining


class _FreshProducer:
    """Writes fresh records at a steady rate until stopped.

    Thread ownership: the Producer handle is created, used and flushed only by this
    object's thread; other threads read the counters after ``stop()`` joined it.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        self._conf = {"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 0}
        self._topic = topic
        self._partitions = partitions
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-fresh-producer", daemon=True)
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
                    try:
                        producer.produce(
                            self._topic,
                            value,
                            partition=seq % self._partitions,
                            on_delivery=self._on_delivery,
                        )
                    except BufferError:
                        producer.poll(0.01)
                        continue
                    seq += 1
                producer.poll(0)
                self._stop.wait(max(0.0, started + seq / self._rate - time.monotonic()))
            self.failures += producer.flush(10)
            self.produced = seq
        except BaseException as exc:  # reported by run_demo; a thread cannot raise to it
            self.error = exc


# ------------------------------------------------------------------- groups
def _check_reachable(bootstrap: str, timeout: float = _REQUEST_TIMEOUT_S) -> None:
    """Fail in seconds with the address in the message, rather than after the
    admin client's 30 s topic-creation timeout with a bare TimeoutError."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise RuntimeError(
            f"no Kafka broker answered at {bootstrap} within {timeout:g} s ({exc})"
        ) from None


def _watermarks(probe: PlainConsumer, topic: str, partitions: int) -> list[tuple[int, int]]:
    return [
        probe.get_watermark_offsets(
            TopicPartition(topic, p), timeout=_REQUEST_TIMEOUT_S, cached=False
        )
        for p in range(partitions)
    ]


def _crash(
    bootstrap: str, topic: str, group: str, start: list[int], read: int
) -> tuple[list[int], int]:
    """A member of ``group`` commits ``start`` and reads ``read`` records, then dies.

    It dies without committing what it read, so those records are replayed: the
    at-least-once situation of the KIP. ``close()`` stands in for the crash; it is
    cheap and only ever leaves ``group``, whose offsets are copied elsewhere.

    Returns:
        The offsets ``group`` holds after the crash, and the records read uncommitted.
    """
    consumer = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": _SESSION_TIMEOUT_MS,
            "fetch.wait.max.ms": _FETCH_WAIT_MS,
        }
    )
    try:
        assigned: list[TopicPartition] = []
        consumer.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
        deadline = time.monotonic() + 30.0
        committed = False
        seen = 0
        while not committed or seen < read:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the crashing consumer got no partitions of {topic!r} within 30 s"
                    if not assigned
                    else f"the crashing consumer read only {seen} of {read} records in 30 s"
                )
            seen += sum(1 for m in consumer.consume(_BATCH, 0.1) if m.error() is None)
            if assigned and not committed:
                offsets = [TopicPartition(topic, p, off) for p, off in enumerate(start)]
                consumer.commit(offsets=offsets, asynchronous=False)
                committed = True
        got = consumer.committed(
            [TopicPartition(topic, p) for p in range(len(start))], timeout=_REQUEST_TIMEOUT_S
        )
        return [tp.offset for tp in sorted(got, key=lambda tp: tp.partition)], seen
    finally:
        consumer.close()


def _copy_group(bootstrap: str, topic: str, group: str, offsets: list[int]) -> None:
    """Give the never-used ``group`` the crashed group's committed offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(topic, p, off) for p, off in enumerate(offsets)]
    request = [ConsumerGroupTopicPartitions(group, tps)]
    admin.alter_consumer_group_offsets(request, request_timeout=_REQUEST_TIMEOUT_S)[group].result()
    listed = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(len(tps))])],
        request_timeout=_REQUEST_TIMEOUT_S,
    )[group].result()
    stored = {tp.partition: tp.offset for tp in listed.topic_partitions}
    if stored != dict(enumerate(offsets)):
        raise RuntimeError(f"copying offsets into {group!r} stored {stored}, not {offsets}")


# ------------------------------------------------------------------ one run
def _measure(
    label: str,
    make: Callable[[dict[str, Any]], Any],
    *,
    bootstrap: str,
    topic: str,
    group: str,
    start: list[int],
    probe: PlainConsumer,
    settings: DemoSettings,
) -> RunResult:
    """Restart ``group`` with the consumer ``make`` builds and time what it delivers."""
    partitions = len(start)
    backlog_end = [high for _low, high in _watermarks(probe, topic, partitions)]
    backlog = sum(max(0, e - s) for s, e in zip(start, backlog_end, strict=True))
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": _SESSION_TIMEOUT_MS,
        "fetch.wait.max.ms": _FETCH_WAIT_MS,
        "auto.offset.reset": "earliest",
    }
    work_s = settings.work_us / 1e6
    # seen[p][i] != 0 once offset start[p] + i was delivered: C-speed scans later.
    seen = [bytearray(max(0, e - s) + 4096) for s, e in zip(start, backlog_end, strict=True)]
    backlog_left = backlog
    latencies: list[float] = []
    delivered = duplicates = out_of_order = 0
    highest = [-1] * partitions  # highest offset delivered so far, per partition
    errors: list[str] = []
    joined: list[float] = []
    first_fresh_s = backlog_done_s = caught_up_s = None
    final_end: list[int] | None = None
    timed_out = False
    child_alive: bool | None = None

    restart_wall = time.time()
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
            for m in consumer.consume(_BATCH, _CONSUME_TIMEOUT_S):
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
                ts = produce_time(m.value())
                if ts >= restart_wall:
                    if first_fresh_s is None:
                        first_fresh_s = time.monotonic() - t0
                    latencies.append(now - ts)
                    out_of_order += behind
                if work_s:
                    _busy(work_s)
            elapsed = time.monotonic() - t0
            if backlog_done_s is not None and elapsed >= backlog_done_s + settings.tail_s:
                if final_end is None:
                    final_end = [high for _low, high in _watermarks(probe, topic, partitions)]
                if all(
                    len(arr) >= e - s and arr.find(0, 0, e - s) == -1
                    for arr, s, e in zip(seen, start, final_end, strict=True)
                ):
                    caught_up_s = elapsed
                    break
            if elapsed > settings.run_timeout_s:
                timed_out = True
                break
        alive = getattr(consumer, "child_consumer_is_alive", None)
        child_alive = alive() if alive is not None else None
    finally:
        consumer.close()

    end = final_end if final_end is not None else backlog_end
    expected = lost = 0
    for arr, s, e in zip(seen, start, end, strict=True):
        n = max(0, e - s)
        expected += n
        lost += n - min(n, len(arr)) + arr.count(0, 0, n)
    latencies.sort()
    return RunResult(
        label=label,
        group_id=group,
        backlog=backlog,
        joined_s=joined[0] if joined else None,
        first_fresh_s=first_fresh_s,
        fresh_p50_s=_percentile(latencies, 50),
        fresh_p99_s=_percentile(latencies, 99),
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
    )


# ------------------------------------------------------------------ the demo
def _quiet(_line: str) -> None:
    pass


def run_demo(
    settings: DemoSettings | None = None,
    *,
    cluster: KafkaCluster | None = None,
    out: Out | None = print,
) -> DemoResult:
    """Run the whole story and return what was measured.

    Args:
        settings: what to run; ``DemoSettings()`` when None.
        cluster: a running cluster to use (tests pass their session cluster); when
            None, ``settings.bootstrap_servers`` names an existing one, or an
            embedded cluster is started and stopped around the demo.
        out: receives the story line by line; None prints nothing.

    Raises:
        RuntimeError, KafkaException: the cluster did not do what the demo needs
            (unreachable, a timeout); a lost record is *not* an error but ``lost``.
    """
    s = settings or DemoSettings()
    emit = out or _quiet

    def say(text: str) -> None:
        indent = _INDENT if text.startswith("[") or text.startswith(_INDENT) else ""
        emit(textwrap.fill(text, _WIDTH, subsequent_indent=indent, break_on_hyphens=False))

    began = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    topic = f"fastrebalance-demo-{run_id}"
    group = f"fastrebalance-demo-{run_id}"
    notes: list[str] = []

    with ExitStack() as stack:
        steps = 7
        owns_external = cluster is None and bool(s.bootstrap_servers)
        if cluster is None:
            if s.bootstrap_servers:
                say(f"[1/{steps}] Using the Kafka cluster at {s.bootstrap_servers}")
                cluster = stack.enter_context(ExternalKafka(s.bootstrap_servers))
            else:
                say(f"[1/{steps}] Starting an embedded Kafka (librdkafka's mock cluster)...")
                embedded = stack.enter_context(EmbeddedKafka())
                cluster = embedded
                say(
                    f"{_INDENT}ready at {embedded.bootstrap_servers}"
                    f" in {embedded.startup_seconds:.1f} s"
                )
        else:
            say(
                f"[1/{steps}] Using the {cluster.kind} Kafka cluster at {cluster.bootstrap_servers}"
            )
        bootstrap = cluster.bootstrap_servers
        cluster_desc = f"{cluster.kind} cluster at {bootstrap}"

        _check_reachable(bootstrap)
        cluster.create_topic(topic, s.partitions)
        say(f"[2/{steps}] Created topic {topic} with {s.partitions} partitions")

        # Closed (callback stack: last in, first out) before the cluster stops.
        probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-probe"})
        stack.callback(probe.close)

        t = time.monotonic()
        failures = _produce_backlog(bootstrap, topic, s.partitions, s.backlog)
        marks = _watermarks(probe, topic, s.partitions)
        low = [lo for lo, _hi in marks]
        log_backlog = sum(hi - lo for lo, hi in marks)
        say(
            f"[3/{steps}] Produced a backlog of {s.backlog:,} records ({VALUE_BYTES} bytes, lz4)"
            f" in {time.monotonic() - t:.1f} s; the log holds {log_backlog:,}:"
        )
        say(_INDENT + "  ".join(f"p{p} [{lo:,}, {hi:,})" for p, (lo, hi) in enumerate(marks)))
        if failures:
            notes.append(f"{failures:,} backlog records failed to produce")
        if log_backlog < s.backlog - failures:
            notes.append(
                f"retention kept {log_backlog:,} of {s.backlog:,} backlog records;"
                " the runs use what the log holds"
            )
        per_partition = log_backlog / s.partitions
        if per_partition <= DEFAULT_LAG_THRESHOLD:
            notes.append(
                f"~{per_partition:,.0f} records per partition is within"
                f" parallel.rebalance.lag.threshold ({DEFAULT_LAG_THRESHOLD}): no catch-up,"
                " both consumers replay the backlog alike"
            )

        t = time.monotonic()
        read = min(_READ_BEFORE_CRASH, log_backlog)
        committed, read = _crash(bootstrap, topic, group, low, read)
        say(
            f"[4/{steps}] A consumer in group {group} committed the start of the backlog"
            f" (offsets {', '.join(map(str, committed))}), read {read:,} records past it, then"
            f" crashed without committing them ({time.monotonic() - t:.1f} s)"
        )
        plain_group, fast_group = f"{group}-plain", f"{group}-fast"
        _copy_group(bootstrap, topic, plain_group, committed)
        _copy_group(bootstrap, topic, fast_group, committed)
        say(
            f"{_INDENT}its committed offsets copied to {plain_group} and {fast_group},"
            " so both restarts begin at the same backlog"
        )

        fresh = _FreshProducer(bootstrap, topic, s.partitions, s.rate)
        fresh.start()
        stack.callback(fresh.stop)
        say(
            f"[5/{steps}] A producer keeps writing {s.rate:g} fresh records/s,"
            " each stamped with its produce time"
        )

        common = {
            "bootstrap": bootstrap,
            "topic": topic,
            "start": committed,
            "probe": probe,
            "settings": s,
        }
        say(
            f"[6/{steps}] Restart (a): plain confluent_kafka.Consumer in {plain_group};"
            f" every record costs {s.work_us:g} us of work"
        )
        plain = _measure("plain", PlainConsumer, group=plain_group, **common)
        say(_INDENT + _run_summary(plain))

        say(
            f"[7/{steps}] Restart (b): fastrebalance.Consumer(enable.parallel.rebalance=True)"
            f" in {fast_group}, same work"
        )

        def make_fast(conf: dict[str, Any]) -> FastConsumer:
            return FastConsumer({**conf, "enable.parallel.rebalance": True})

        fast = _measure("fastrebalance", make_fast, group=fast_group, **common)
        say(_INDENT + _run_summary(fast))

        fresh.stop()
        if fresh.error is not None:
            raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
        if fresh.failures:
            notes.append(f"{fresh.failures:,} fresh records failed to produce")
        if owns_external:
            _cleanup(bootstrap, topic, [group, plain_group, fast_group, f"{fast_group}.catchup"])

    return DemoResult(
        settings=s,
        cluster=cluster_desc,
        topic=topic,
        crashed_group=group,
        log_backlog=log_backlog,
        plain=plain,
        fast=fast,
        fresh_produced=fresh.produced,
        produce_failures=failures + fresh.failures,
        wall_s=time.monotonic() - began,
        notes=tuple(notes),
    )


def _cleanup(bootstrap: str, topic: str, groups: list[str]) -> None:
    """Best effort: leave a cluster the user named as we found it; a leftover demo
    topic is harmless, so failures pass silently. (The embedded one dies with us.)"""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures: list[Any] = list(admin.delete_topics([topic], request_timeout=10).values())
    futures += admin.delete_consumer_groups(groups, request_timeout=10).values()
    for future in futures:
        with contextlib.suppress(Exception):
            future.result(timeout=15)


# ----------------------------------------------------------------- printing
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def _run_summary(r: RunResult) -> str:
    parts = [
        f"backlog {r.backlog:,}",
        f"joined after {_duration(r.joined_s)}",
        f"first fresh record after {_duration(r.first_fresh_s)}",
        f"backlog delivered after {_duration(r.backlog_done_s)}",
    ]
    if r.child_alive is not None:
        parts.append(f"child consumer {'still alive' if r.child_alive else 'not alive'}")
    if r.timed_out:
        parts.append("TIMED OUT")
    return "; ".join(parts)


def _ratio(plain: float | None, fast: float | None) -> str:
    if plain is None or fast is None or plain <= 0 or fast <= 0:
        return "-"
    return f"{plain / fast:.1f}x" if plain / fast < 100 else f"{plain / fast:,.0f}x"


def format_results(result: DemoResult) -> str:
    """The side-by-side table, its legend, and the verdict line."""
    p, f = result.plain, result.fast
    rows: list[tuple[str, str, str, str]] = [
        ("", "plain", "fastrebalance", "plain/fast"),
        ("backlog at restart (records)", f"{p.backlog:,}", f"{f.backlog:,}", ""),
        ("joined the group after", _duration(p.joined_s), _duration(f.joined_s), ""),
        (
            "time to first fresh record",
            _duration(p.first_fresh_s),
            _duration(f.first_fresh_s),
            _ratio(p.first_fresh_s, f.first_fresh_s),
        ),
        (
            "fresh latency p50",
            _duration(p.fresh_p50_s),
            _duration(f.fresh_p50_s),
            _ratio(p.fresh_p50_s, f.fresh_p50_s),
        ),
        (
            "fresh latency p99",
            _duration(p.fresh_p99_s),
            _duration(f.fresh_p99_s),
            _ratio(p.fresh_p99_s, f.fresh_p99_s),
        ),
        (
            "backlog fully delivered after",
            _duration(p.backlog_done_s),
            _duration(f.backlog_done_s),
            _ratio(p.backlog_done_s, f.backlog_done_s),
        ),
        ("fresh records delivered", f"{p.fresh_records:,}", f"{f.fresh_records:,}", ""),
        (
            "  of which behind newer ones",
            f"{p.fresh_out_of_order:,}",
            f"{f.fresh_out_of_order:,}",
            "",
        ),
        ("records checked", f"{p.expected:,}", f"{f.expected:,}", ""),
        ("duplicates", f"{p.duplicates:,}", f"{f.duplicates:,}", ""),
        ("lost", f"{p.lost:,}", f"{f.lost:,}", ""),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0])] + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i]
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    s = result.settings
    legend = [
        "Times count from each restart (the consumer's creation). A fresh record was produced"
        " after the restart; its latency runs from produce to delivery."
        f" {s.work_us:g} us of work per record, {s.rate:g} fresh records/s,"
        f" {s.partitions} partitions, {result.cluster}.",
        "plain/fast above 1: fastrebalance was that many times faster.",
        "The second run's backlog also holds the fresh records written during the first.",
        "Fresh records behind newer ones were produced before fastrebalance read the log end,"
        " so they lie below where its primary starts and its child delivers them with the"
        " backlog; in short runs they set its p99.",
    ]
    legend += [f"note: {n}" for n in result.notes]
    for r in (p, f):
        if r.errors:
            legend.append(f"note: {r.label} saw errors: {'; '.join(r.errors)}")
        if r.timed_out:
            legend.append(f"note: {r.label} timed out after {s.run_timeout_s:g} s")
    lines.append("")
    lines += [
        textwrap.fill(text, _WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        for text in legend
    ]
    verdict = f"lost: {result.lost}" + (
        " (every record from the committed offsets to the log end was delivered at least"
        " once, in both runs)"
        if result.ok
        else " - CHECK FAILED: records were never delivered"
    )
    lines += [
        "",
        textwrap.fill(verdict, _WIDTH, subsequent_indent="  "),
        f"demo wall time: {result.wall_s:.1f} s",
    ]
    return "\n".join(lines)
