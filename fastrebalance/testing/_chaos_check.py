"""The chaos run's checker: the worker logs' format, the sampler of the group's committed
offsets, the checks (every record delivered at least once, the stored offset never ahead of
processing, exactly once in an eos run's output), and the result with its summary table.

Thread ownership: the sampler's two consumers belong to its thread while it runs, and to
the caller's after ``stop()`` (a lock guards the hand-over in between).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Consumer as PlainConsumer

from fastrebalance._planning import restore
from fastrebalance.testing._chaos_settings import ALL_WORKER_MODES, ChaosSettings

__all__ = [
    "ChaosResult",
    "LogRecord",
    "OffsetSampler",
    "Sample",
    "check",
    "check_output",
    "check_samples",
    "claimed_intervals",
    "format_line",
    "format_summary",
    "parse_line",
    "percentile",
    "percentiles",
    "read_logs",
    "read_topic",
]


def format_line(partition: int, offset: int, value: str, latency_ms: float, stream: str) -> str:
    """One processed record in a worker log: ``stream`` is 'f' (primary) or 'b' (child)."""
    return f"{partition} {offset} {value} {latency_ms:.1f} {stream}\n"


@dataclass(slots=True)  # a soak reads a million of them
class LogRecord:
    partition: int
    offset: int
    value: int
    log: Path
    end: int  #: byte position just after its line: when it became visible to a sampler
    latency_ms: float
    stream: str


def parse_line(line: bytes) -> tuple[int, int, int, float, str]:
    p, o, v, lat, stream = line.split()
    return int(p), int(o), int(v), float(lat), stream.decode()


def read_logs(paths: Iterable[Path]) -> list[LogRecord]:
    out = []
    for path in paths:
        if not path.exists():
            continue
        pos = 0
        with open(path, "rb") as f:
            for line in f:
                pos += len(line)
                if not line.endswith(b"\n"):
                    continue  # torn by SIGKILL; the next incarnation writes a new file
                p, o, v, lat, stream = parse_line(line)
                out.append(LogRecord(p, o, v, path, pos, lat, stream))
    return out


# -------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    t: float
    group: dict[int, tuple[int, str | None]]  #: partition -> (offset, metadata)
    child: dict[int, tuple[int, str | None]]
    sizes: dict[Path, int]  #: log sizes read AFTER the offsets


class OffsetSampler:
    """Samples the group's committed offsets (and the child's log), then the log sizes.

    Plain confluent-kafka consumers that never subscribe and never commit: ``committed()``
    only, the way a lag monitor or ``kafka-consumer-groups`` reads a group.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        partitions: int,
        log_paths: Callable[[], list[Path]],
        interval_s: float,
    ) -> None:
        base = {"bootstrap.servers": bootstrap, "enable.auto.commit": False, "log_level": 2}
        self.group = PlainConsumer({**base, "group.id": group})
        self.child = PlainConsumer({**base, "group.id": group + ".catchup"})
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.log_paths = log_paths  #: every worker log, listed before its worker starts
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._lock = threading.Lock()  # the sampler thread and the drain share the consumers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def read_group(self, timeout: float = 10) -> dict[int, tuple[int, str | None]]:
        with self._lock:
            got = self.group.committed(self.tps, timeout)
        return {tp.partition: (tp.offset, tp.metadata) for tp in got}

    def sample(self) -> None:
        t = time.monotonic()
        group = self.read_group()
        with self._lock:
            got = self.child.committed(self.tps, 10)
        child = {tp.partition: (tp.offset, tp.metadata) for tp in got}
        sizes = {}
        for path in self.log_paths():
            try:
                sizes[path] = path.stat().st_size
            except FileNotFoundError:
                sizes[path] = 0
        self.samples.append(Sample(t, group, child, sizes))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except KafkaException:
                self.errors += 1  # broker paused: this moment is simply not sampled

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def close(self) -> None:
        self.group.close()
        self.child.close()


# ---------------------------------------------------------------------------- checks
class _RangeMax:
    """Maximum of ``values[a:b]`` in O(1) after O(n log n) setup (a sparse table):
    a soak samples thousands of moments over hundreds of thousands of offsets."""

    def __init__(self, values: Sequence[int]) -> None:
        self.levels = [list(values)]
        k = 1
        while 2 * k <= len(values):
            prev = self.levels[-1]
            self.levels.append([max(prev[i], prev[i + k]) for i in range(len(prev) - k)])
            k *= 2

    def __call__(self, a: int, b: int) -> int:
        level = (b - a).bit_length() - 1
        row = self.levels[level]
        return max(row[a], row[b - (1 << level)])


def availability(
    records: list[LogRecord], samples: list[Sample], produced: dict[int, int]
) -> dict[int, list[int]]:
    """Per partition and produced offset: the index of the first sample that saw it in a
    log (``len(samples)`` when none did)."""
    never = len(samples)
    sizes: dict[Path, list[int]] = {}
    for path in {r.log for r in records}:
        sizes[path] = [s.sizes.get(path, 0) for s in samples]
    avail = {p: [never] * n for p, n in produced.items()}
    for r in records:
        row = avail.get(r.partition)
        if row is None or r.offset >= len(row):
            continue
        idx = bisect.bisect_left(sizes[r.log], r.end)  # sizes only grow
        if idx < row[r.offset]:
            row[r.offset] = idx
    return avail


def claimed_intervals(sample: Sample, partition: int) -> tuple[int, list[tuple[int, int]]]:
    """(bare committed offset, intervals the full token + checkpoint claim processed)."""
    offset, metadata = sample.group.get(partition, (-1, None))
    child_offset, child_metadata = sample.child.get(partition, (-1, None))
    restored = restore(offset, metadata, child_offset, child_metadata)
    if restored.position is None:
        return offset, []
    intervals, cursor = [], 0
    for s, e in restored.ranges:
        if s > cursor:
            intervals.append((cursor, min(s, restored.position)))
        cursor = max(cursor, e)
    if cursor < restored.position:
        intervals.append((cursor, restored.position))
    return offset, [(a, b) for a, b in intervals if a < b]


def check_samples(
    samples: list[Sample],
    records: list[LogRecord],
    produced: dict[int, int],
    deleted: dict[int, int] | None = None,
) -> list[str]:
    """Every offset a sample declared processed must have been in a log at that sample.

    Args:
        produced: partition -> log end (every offset below it was produced).
        deleted: partition -> low watermark at the end; offsets below it that no log holds
            were deleted by retention (reported apart), so claiming them is no violation.
    """
    avail = availability(records, samples, produced)
    for p, low in (deleted or {}).items():
        row = avail.get(p, [])
        for o in range(min(low, len(row))):
            if row[o] == len(samples):
                row[o] = -1
    problems = []
    for p in sorted(produced):
        row = avail[p]
        if not row:
            continue
        rmax = _RangeMax(row)
        for idx, sample in enumerate(samples):
            bare, claimed = claimed_intervals(sample, p)
            checks = [("committed offset", [(0, bare)] if bare > 0 else [])]
            checks.append(("token+checkpoint claim", claimed))
            for what, intervals in checks:
                for a, b in intervals:
                    if b > len(row):
                        problems.append(f"sample {idx} partition {p}: {what} {b} > log end")
                        b = len(row)
                    if a >= b or rmax(a, b) <= idx:
                        continue
                    late = [o for o in range(a, b) if row[o] > idx]
                    problems.append(
                        f"sample {idx} (t={sample.t:.1f}) partition {p}: {what} covers "
                        f"[{a}, {b}) but {len(late)} offsets were not in any log yet, first "
                        f"{late[:10]} (group {sample.group.get(p)}, child {sample.child.get(p)})"
                    )
    return problems


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values: always a value that was really measured
    (None: no values). The project's one definition, for every report."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered) / 100 - 1e-9))  # 99.9% of 1000: 999th
    return ordered[rank - 1]


def percentiles(
    values: list[float], points: Sequence[float] = (50, 90, 99, 99.9)
) -> dict[str, float]:
    """Nearest-rank percentiles plus max; empty input gives NaNs."""
    ordered = sorted(values)
    out = {f"p{q:g}": percentile(ordered, q) for q in points}
    out |= {"max": ordered[-1] if ordered else None, "n": len(ordered)}
    return {k: math.nan if v is None else v for k, v in out.items()}


def check(
    result: ChaosResult,
    sent: int,
    failed: int,
    delivered: dict[int, tuple[int, int]],
    logs: list[Path],
    samples: list[Sample],
) -> None:
    """At least once, duplicates, latency and the offset samples, into ``result``.

    Args:
        sent, failed: records the producer sent, and of those the ones that failed.
        delivered: value -> (partition, offset) of every record the producer wrote.
        logs: every worker log; ``samples``: the offset sampler's samples.
    """
    result.produced = sent
    result.written = len(delivered)
    result.produce_failed = failed
    records = read_logs(logs)
    result.logged = len(records)
    counts = Counter(r.value for r in records)
    result.delivered_unique = len(counts)
    result.wrong = [
        f"log {r.log.name}: value {r.value} at {r.partition}/{r.offset}, produced at "
        f"{delivered.get(r.value)}"
        for r in records
        if delivered.get(r.value) != (r.partition, r.offset)
    ][:20]
    low = result.low_watermarks
    missing = sorted(set(delivered) - set(counts))
    deleted = [v for v in missing if delivered[v][1] < low.get(delivered[v][0], 0)]
    result.deleted_by_retention = len(deleted)
    result.lost = sorted(set(missing) - set(deleted))
    dups = [n for n in counts.values() if n > 1]
    result.duplicated_values = len(dups)
    result.extra_copies = sum(dups) - len(dups)

    first: dict[int, LogRecord] = {}
    for r in records:
        seen = first.get(r.value)
        if seen is None or r.latency_ms < seen.latency_ms:
            first[r.value] = r
    result.latency_all = percentiles([r.latency_ms for r in first.values()])
    result.latency_fresh = percentiles([r.latency_ms for r in first.values() if r.stream == "f"])
    result.backlog_first_deliveries = sum(1 for r in first.values() if r.stream == "b")

    result.token_samples = sum(
        1 for smp in samples for _, md in smp.group.values() if md and md.startswith("~fr")
    )
    result.checkpoint_samples = sum(
        1 for smp in samples for off, _ in smp.child.values() if off >= 0
    )
    result.violations = check_samples(samples, records, result.log_ends, low)


def read_topic(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    *,
    committed: bool = False,
    strict: bool = False,
    timeout: float = 120.0,
) -> Iterator[Any]:
    """Every record of ``topic`` below ``ends`` (partition -> offset; -1: wherever the
    partition reports its end), read from the start by a plain consumer that commits
    nothing: the truth a harness holds its sink or its logs against. ``committed``: as a
    ``read_committed`` consumer (a transaction still open holds its partition's end back
    until it ends). ``strict``: an error other than a partition's end raises."""
    conf = {"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
            "enable.partition.eof": True, "enable.auto.commit": False}  # fmt: skip
    if committed:
        conf["isolation.level"] = "read_committed"
    reader = PlainConsumer(conf)
    todo = {p for p, end in ends.items() if end != 0}
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in reader.consume(5000, 0.5):
                err, p, o = m.error(), m.partition(), m.offset()
                if p is None or o is None:
                    continue
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    if strict:
                        raise RuntimeError(f"reading {topic} back: {err}")
                    continue
                end = ends[p]
                if end < 0:  # done at its end, until a record says it was not
                    (todo.discard if err is not None else todo.add)(p)
                elif o >= end - (err is None):
                    todo.discard(p)
                if err is None and (end < 0 or o < end):
                    yield m
        if todo:
            raise RuntimeError(f"{topic}: partitions {sorted(todo)} not read to their end"
                               f" in {timeout:g}s")  # fmt: skip
    finally:
        reader.close()


def check_output(
    result: ChaosResult,
    delivered: dict[int, tuple[int, int]],
    bootstrap: str,
    topic: str,
    partitions: int,
) -> None:
    """Exactly once: each input value has one committed output record, no more."""
    ends = dict.fromkeys(range(partitions), -1)
    counts = Counter(
        int(m.value() or b"-1") for m in read_topic(bootstrap, topic, ends, committed=True)
    )
    result.output_records = sum(counts.values())
    low = result.low_watermarks
    gone = {v for v, (p, o) in delivered.items() if o < low.get(p, 0) and v not in counts}
    result.output_missing = sorted(set(delivered) - set(counts) - gone)
    result.output_duplicated = sorted(v for v, n in counts.items() if n > 1)


# ---------------------------------------------------------------------------- result
@dataclass
class ChaosResult:
    seed: int
    settings: ChaosSettings
    workdir: Path
    topic: str = ""
    group: str = ""
    chaos_seconds: float = 0.0
    drain_seconds: float = 0.0
    total_seconds: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[str] = field(default_factory=list)
    processes: int = 0
    produced: int = 0
    produce_failed: int = 0
    #: records the producer saw acknowledged (the check's truth is what the topic holds)
    written: int = 0
    delivered_unique: int = 0
    logged: int = 0
    lost: list[int] = field(default_factory=list)  #: values in no log, not deleted
    deleted_by_retention: int = 0  #: values in no log, below the low watermark
    duplicated_values: int = 0
    extra_copies: int = 0
    samples: int = 0
    sample_errors: int = 0
    token_samples: int = 0  #: partition samples whose group commit carried a range token
    checkpoint_samples: int = 0
    violations: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  #: log lines that disagree with the producer
    deaths: list[str] = field(default_factory=list)
    #: clean shutdowns that broke a documented bound (``shutdown_report``)
    bounds_exceeded: list[str] = field(default_factory=list)
    shutdown_seconds: list[float] = field(default_factory=list)  #: SIGTERM to exit
    modes: Counter[str] = field(default_factory=Counter)  #: worker processes per mode
    async_commit_kinds: Counter[str] = field(default_factory=Counter)
    #: the async pipeline's commits by when they landed: "current" (the assignment that
    #: handed the record out), "reassigned" (a later one), "revoked" (not assigned then)
    async_commit_whens: Counter[str] = field(default_factory=Counter)
    drained: bool = False
    low_watermarks: dict[int, int] = field(default_factory=dict)
    log_ends: dict[int, int] = field(default_factory=dict)
    latency_fresh: dict[str, float] = field(default_factory=dict)
    latency_all: dict[str, float] = field(default_factory=dict)
    backlog_first_deliveries: int = 0
    #: eos: records read committed from the output topic, input values with no output
    #: (not deleted by retention), and values with more than one output
    output_records: int = 0
    output_missing: list[int] = field(default_factory=list)
    output_duplicated: list[int] = field(default_factory=list)

    @property
    def fault_total(self) -> int:
        return sum(self.faults.values())

    @property
    def ok(self) -> bool:
        return (
            not (
                self.lost
                or self.violations
                or self.wrong
                or self.deaths
                or self.bounds_exceeded
                or self.produce_failed
                or self.output_missing
                or self.output_duplicated
            )
            and self.drained
            and self.produced > 0
        )

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} records lost, first values {self.lost[:20]}")
        if self.produce_failed:
            out.append(f"{self.produce_failed} records failed to produce")
        if not self.drained:
            out.append(f"committed offsets never reached the log ends {self.log_ends}")
        if self.output_missing:
            out.append(
                f"{len(self.output_missing)} input records have no committed output, first "
                f"values {self.output_missing[:20]}"
            )
        if self.output_duplicated:
            out.append(
                f"{len(self.output_duplicated)} input records have more than one committed "
                f"output, first values {self.output_duplicated[:20]}"
            )
        out += self.wrong[:10] + self.violations[:20] + self.deaths[:10]
        out += self.bounds_exceeded[:10]
        return out


def _ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value / 1000:.2f} s" if value >= 10000 else f"{value:.1f} ms"


def format_summary(r: ChaosResult, command: str | None = None) -> str:
    """The summary table (docs/reliability.md quotes one)."""
    s = r.settings
    faults = ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items()))
    modes = ", ".join(f"{m} {r.modes[m]}" for m in ALL_WORKER_MODES if m in s.modes)
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(r.async_commit_kinds.items()))
    whens = r.async_commit_whens
    slowest = max(r.shutdown_seconds, default=math.nan)
    rows = [
        ("command", command or "-"),
        ("seed", str(r.seed)),
        ("result", "PASS" if r.ok else "FAIL"),
        ("chaos / drain / total", f"{r.chaos_seconds:.0f} s / {r.drain_seconds:.0f} s / "
                                  f"{r.total_seconds:.0f} s"),
        ("setup", f"{s.partitions} partitions, {s.workers} workers ({s.min_workers}-"
                  f"{s.max_workers}), {s.protocol} protocol, threshold {s.threshold}, "
                  f"{s.rate:g} records/s, {s.work_us} us/record"
                  + (f", CPU hog of {s.cpu_hog} busy processes" if s.cpu_hog else "")),
        ("faults injected", f"{r.fault_total} ({faults})"),
        ("worker processes", f"{r.processes} ({modes})"),
        ("async commits", f"{sum(whens.values()):,} ({whens['revoked']:,} after the partition "
                          f"left the member, {whens['reassigned']:,} in a later assignment of "
                          f"it; {kinds or 'none'})"),
        ("clean shutdowns", f"{len(r.shutdown_seconds)}, slowest {_s(slowest)} from SIGTERM "
                            f"to exit; {len(r.bounds_exceeded)} documented bounds exceeded"),
        ("records produced", f"{r.produced:,} sent, {r.written:,} written"
                             + (f" ({r.produced - r.written - r.produce_failed:,} still in the "
                                "producer's queue when it stopped: never in Kafka)"
                                if r.produced - r.written - r.produce_failed > 0 else "")),
        ("delivered (unique)", f"{r.delivered_unique:,} ({r.logged:,} log lines)"),
        ("lost", str(len(r.lost))),
        ("deleted by retention", str(r.deleted_by_retention)),
        ("duplicates", f"{r.duplicated_values:,} records delivered more than once "
                       f"({r.extra_copies:,} extra copies)"),
        ("offset samples", f"{r.samples} ({r.sample_errors} failed while the broker was "
                           f"paused); {r.token_samples} with a range token, "
                           f"{r.checkpoint_samples} with a child checkpoint"),
        ("offset ran ahead", f"{len(r.violations)} violations"),
        ("latency, fresh", _lat(r.latency_fresh)),
        ("latency, all", _lat(r.latency_all) + f" ({r.backlog_first_deliveries:,} first "
                                                "delivered by the child)"),
        ("logs", str(r.workdir)),
    ]  # fmt: skip
    if s.eos:
        rows.insert(-1, (
            "exactly once (output)",
            f"{r.output_records:,} committed outputs read; {len(r.output_missing)} inputs "
            f"without one, {len(r.output_duplicated)} with more than one",
        ))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 72
    out = [line]
    out += [f"| {k:<{width}} | {v}" for k, v in rows]
    out.append(line)
    return "\n".join(out)


def _s(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.1f} s"


def _lat(p: dict[str, float]) -> str:
    if not p or not p.get("n"):
        return "-"
    return (
        f"p50 {_ms(p['p50'])}, p90 {_ms(p['p90'])}, p99 {_ms(p['p99'])}, "
        f"p99.9 {_ms(p['p99.9'])}, max {_ms(p['max'])} (n={p['n']:,})"
    )
