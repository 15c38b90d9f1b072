"""``fastrebalance bench``: post-crash latency, catch-up speed and overhead, side by side
with plain confluent-kafka, in one run.

Two scenarios, each run for plain ``confluent_kafka.Consumer`` and for
``fastrebalance.Consumer``, alternating, ``reps`` times; the tables report medians.

*recovery*: a group whose committed offsets lag the log end by B records restarts
(as after a crash) while a producer keeps writing fresh timestamped records at a
steady rate; every record costs W µs of work. Measured: time to the first fresh
record, fresh-record latency p50/p99/max over the records produced in the first
``duration_s`` after the restart, time until the backlog is delivered, records/s,
peak RSS. The same run also restarts fastrebalance with *no* backlog (B = 0): its
p99 is the steady-state p99 that the catch-up p99 is compared with.

*steady*: no backlog at all; the throughput of a ``poll()`` loop and a
``consume(1000)`` loop, raw confluent-kafka vs fastrebalance with the mode off and on.

Every measured consumer runs in its own process (``_runner.Worker``), where
fastrebalance and confluent-kafka run exactly the same loop. The parent owns the
cluster, prepares each run's backlog right before it (so every run sees the same kind
of backlog: B records in large lz4 batches, not the previous run's trickle of fresh
records), and reads the watermarks to report the backlog the log really held.

Thread ownership: the fresh producer's handle belongs to its own thread; every other
handle belongs to the thread that calls ``run_bench()`` (or to the worker process).
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..testing._workload import (
    FreshProducer,
    partition_keys,
    produce_backlog,
    set_group_offsets,
    watermarks,
)
from . import _args as a
from ._runner import (
    FAST,
    PLAIN,
    Column,
    Out,
    Session,
    alternate,
    div,
    machine_line,
    md_table,
    median,
    memory_kib,
    quiet,
    ratio,
    revive,
    run_worker,
    table,
    worker_main,
)
from .workload import FETCH_WAIT_MS, SESSION_TIMEOUT_MS, RunResult, format_duration, measure_restart

__all__ = [
    "BenchResult",
    "BenchSettings",
    "RecoveryRun",
    "ThroughputRun",
    "add_command",
    "format_markdown",
    "run_bench",
    "write_plot",
]

#: plain confluent-kafka with the fetch settings fastrebalance gives its child: the fair
#: baseline for the drain (what of the difference is configuration, not design)
TUNED = "plain tuned"
#: What TUNED sets: librdkafka stops fetching for fetch.queue.backoff.ms (1000 by
#: default) whenever its queue holds queued.min.messages; the child sets 10 ms
#: (_config.child_config), so a consumer catching up never idles waiting for it.
TUNED_CONF = {"fetch.queue.backoff.ms": 10}
RECOVERY_CONSUMERS = (PLAIN, TUNED, FAST)
#: Throughput variants: raw confluent-kafka, fastrebalance with the mode off, and on.
RAW, OFF, ON = "raw", "mode off", "mode on"
VARIANTS = (RAW, OFF, ON)
LOOPS = ("poll", "consume")
#: Records asked per consume() call in the steady-state loop (the issue's consume(1000)).
CONSUME_BATCH = 1000
#: Targets from the issue. Reported next to the measured ratios, never asserted.
TARGET_P99_RATIO = 1.5
TARGET_DRAIN_RATIO = 1.0
TARGET_THROUGHPUT = {("poll", ON): 0.95, ("consume", ON): 0.95, ("poll", OFF): 0.98,
                     ("consume", OFF): 0.98}  # fmt: skip
#: fetch.queue.backoff.ms of the steady-state throughput runs (see _worker_throughput).
THROUGHPUT_FETCH_BACKOFF_MS = 10
#: The steady-state runs time the loop over a queue librdkafka has already filled: they
#: wait this long after the first record, with a queue that holds the whole topic.
PREFETCH_S = 3.0
#: Records each variant reads in its turn of the steady-state run (see _worker_throughput).
BLOCK = 10_000
PREFETCH_KBYTES = 1_000_000
PREFETCH_MESSAGES = 10_000_000
#: A worker that has not answered this long after its run timeout is killed.
_WORKER_GRACE_S = 60.0
_WORKER_MODULE = "fastrebalance.tools.bench"


@dataclass(frozen=True)
class BenchSettings:
    """What to run. The defaults take about 10 minutes on 2 cores (docs/benchmarks.md).

    Attributes:
        backlogs: recovery backlog sizes B, records over all partitions.
        work_us: simulated work per record W, microseconds (busy CPU, not sleep).
        reps: repetitions of every recovery run; tables show medians.
        steady_reps: repetitions of every steady-state throughput run: more than
            ``reps`` because they are cheap and a ratio of two ~1 s runs is noisy.
        duration_s: fresh records produced this long after a restart make up its
            latency statistics; each run lasts at least this long (and until its
            backlog is delivered).
        rate: fresh records per second, written throughout the recovery scenario.
        partitions: partitions of each benchmark topic.
        throughput_records: records each steady-state throughput run reads.
        poll_timeout_s: the timeout of every poll()/consume() call in the throughput
            loops; 1.0 is what the README's loop uses.
        scenarios: "recovery" and/or "steady".
        bootstrap_servers: an existing cluster; None starts an embedded one.
        tail_s: each recovery run keeps reading this long after its backlog and its
            window, so the last fresh records of the window are delivered too.
        run_timeout_s: a recovery run still missing records then stops; they count as lost.
    """

    backlogs: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    work_us: tuple[float, ...] = (0.0, 20.0)
    reps: int = 3
    steady_reps: int = 5
    duration_s: float = 10.0
    rate: float = 100.0
    partitions: int = 4
    throughput_records: int = 1_000_000
    poll_timeout_s: float = 1.0
    scenarios: tuple[str, ...] = ("steady", "recovery")
    bootstrap_servers: str | None = None
    tail_s: float = 0.3
    run_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if any(b < 1 for b in self.backlogs):
            raise ValueError(f"backlogs={self.backlogs} is invalid: expected records >= 1")
        if any(w < 0 for w in self.work_us):
            raise ValueError(f"work_us={self.work_us} is invalid: expected microseconds >= 0")
        if min(self.reps, self.steady_reps, self.partitions, self.throughput_records) < 1:
            raise ValueError("reps, steady_reps, partitions and throughput_records must be >= 1")
        if not (self.duration_s > 0 and self.rate > 0 and self.run_timeout_s > 0):
            raise ValueError("duration_s, rate and run_timeout_s must be > 0")
        if self.tail_s < 0 or self.poll_timeout_s < 0:
            raise ValueError("tail_s and poll_timeout_s must be >= 0")
        unknown = set(self.scenarios) - {"recovery", "steady"}
        if unknown or not self.scenarios:
            raise ValueError(f"scenarios={self.scenarios} is invalid: recovery and/or steady")


@dataclass(frozen=True)
class RecoveryRun:
    """One restart, measured in its own process.

    Attributes:
        asked: the backlog B asked for (0: the steady-state reference run).
        prepared: B as the log held it when the group's offsets were set (the
            watermarks minus the offsets): less than ``asked`` means retention
            trimmed it.
        result: what the restarted consumer delivered; ``result.backlog`` is the backlog
            at the restart itself (``prepared`` plus the fresh records written since).
        rss_peak_kib: the worker's peak resident set.
        rss_base_kib: its resident set before the consumer was built (Python and
            the libraries), to tell the consumer's share.
    """

    asked: int
    work_us: float
    rep: int
    consumer: str
    prepared: int
    result: RunResult
    rss_peak_kib: int
    rss_base_kib: int


@dataclass(frozen=True)
class ThroughputRun:
    loop: str
    variant: str
    rep: int
    records: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BenchResult:
    settings: BenchSettings
    cluster: str
    machine: dict[str, Any]
    recovery: tuple[RecoveryRun, ...]
    throughput: tuple[ThroughputRun, ...]
    throughput_log: int
    fresh_produced: int
    produce_failures: int
    wall_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def lost(self) -> int:
        return sum(r.result.lost for r in self.recovery)

    @property
    def ok(self) -> bool:
        """Every run delivered every record (the benchmark doubles as a loss check), and
        the check had something to check: nothing failed to produce, every restart that
        asked for a backlog had one and saw fresh records."""
        return not self.problems()

    def problems(self) -> list[str]:
        """Why the run cannot be trusted; empty when it can (a loss check that passes
        over empty runs proves nothing)."""
        out = []
        if self.lost:
            out.append(f"{self.lost:,} records lost")
        if any(r.result.timed_out for r in self.recovery):
            out.append("a run timed out")
        if self.produce_failures:
            out.append(f"{self.produce_failures:,} records failed to produce")
        empty = [r for r in self.recovery if r.asked and r.prepared <= 0]
        if empty:
            out.append(f"{len(empty)} restart(s) asked for a backlog and found none")
        unfed = [r for r in self.recovery if r.result.fresh_records == 0]
        if self.recovery and unfed:
            out.append(f"{len(unfed)} restart(s) saw no fresh record")
        return out


# ------------------------------------------------------------------ workers
def _make_consumer(kind: str, conf: dict[str, Any]) -> Any:
    if kind in (PLAIN, RAW, TUNED):
        from confluent_kafka import Consumer as PlainConsumer

        return PlainConsumer({**conf, **TUNED_CONF} if kind == TUNED else conf)
    from .._consumer import Consumer as FastConsumer

    return FastConsumer({**conf, "enable.parallel.rebalance": kind in (FAST, ON)})


def _worker_recovery(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    from confluent_kafka import Consumer as PlainConsumer

    probe = PlainConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": "bench-probe"})
    try:
        base = memory_kib("VmHWM")
        result = measure_restart(
            spec["consumer"],
            lambda conf: _make_consumer(spec["consumer"], conf),
            bootstrap=spec["bootstrap"],
            topic=spec["topic"],
            group=spec["group"],
            start=spec["start"],
            probe=probe,
            work_us=spec["work_us"],
            tail_s=spec["tail_s"],
            run_timeout_s=spec["run_timeout_s"],
            window_s=spec["window_s"],
            keep_samples=True,
        )
    finally:
        probe.close()
    return {"result": dataclasses.asdict(result), "rss_peak_kib": memory_kib("VmHWM"),
            "rss_base_kib": base}  # fmt: skip


def _worker_throughput(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    """Every variant in one process, each with its own group over the whole topic,
    read in turns of ``BLOCK`` records: the time of each variant's loop, first record
    excluded.

    Why one process and turns: run one after another in their own processes, the same
    bound method (raw, and mode off, which *is* confluent-kafka's) measured 0.86M and
    1.34M records/s minutes apart, a spread wider than the overhead measured. In turns
    a few milliseconds long, whatever the machine does (other load, clock speed, cache
    state of librdkafka's queues) falls on every variant alike: two raw handles read
    that way agreed within 2% in each of three runs. Mode off, confluent-kafka's own
    bound methods, is that control in every run of the benchmark.

    The loop body is the least an application does (skip errors, count), so the
    library's own per-call cost is as visible as it can be. Joining the group is not
    timed. ``fetch.queue.backoff.ms`` is 10 ms for every variant, and the turns begin
    once librdkafka has fetched the whole topic into every handle's queue (sized to
    hold it, PREFETCH_S per handle): what is timed is the per-call cost, the cost this
    library adds to, and not librdkafka's prefetch (with its default backoff of 1000 ms
    the fetcher pauses once ~100k records are queued, which a consume() loop empties
    in ~0.1 s).
    """
    conf = {
        "bootstrap.servers": spec["bootstrap"],
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "fetch.queue.backoff.ms": THROUGHPUT_FETCH_BACKOFF_MS,
        "queued.max.messages.kbytes": PREFETCH_KBYTES,
        "queued.min.messages": PREFETCH_MESSAGES,
    }
    variants: list[str] = spec["variants"]
    want: int = spec["records"] - 1  # each handle's first record is not timed
    timeout: float = spec["poll_timeout_s"]
    deadline = time.monotonic() + spec["run_timeout_s"]
    consumers: dict[str, Any] = {}
    read = dict.fromkeys(variants, 0)
    seconds = dict.fromkeys(variants, 0.0)
    try:
        for v in variants:
            consumers[v] = _make_consumer(v, {**conf, "group.id": spec["groups"][v]})
            consumers[v].subscribe([spec["topic"]])
        for v in variants:  # the first record: it waits for the join and the first fetch
            while True:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{v}: no record within the run timeout")
                m = consumers[v].poll(timeout)
                if m is not None and m.error() is None:
                    break
        time.sleep(spec.get("prefetch_s", PREFETCH_S) * len(variants))
        turn = 0
        while any(read[v] < want for v in variants):
            if time.monotonic() > deadline:
                break
            for v in alternate(variants, turn):
                n = min(BLOCK, want - read[v])
                if n > 0:
                    began = time.perf_counter()
                    got = _read_block(consumers[v], spec["loop"], n, timeout, deadline)
                    seconds[v] += time.perf_counter() - began
                    read[v] += got
            turn += 1
    finally:
        for c in consumers.values():
            c.close()
    return {"variants": {v: {"records": read[v], "seconds": seconds[v]} for v in variants}}


def _read_block(consumer: Any, loop: str, want: int, timeout: float, deadline: float) -> int:
    """``want`` records through ``consumer``'s poll() or consume() loop; fewer only
    past the deadline."""
    n = 0
    if loop == "poll":
        poll = consumer.poll
        while n < want:
            m = poll(timeout)
            if m is None:
                if time.monotonic() > deadline:
                    break
                continue
            if m.error() is None:
                n += 1
    else:
        consume = consumer.consume
        while n < want:
            # never ask past the last record: that call would wait out its timeout
            msgs = consume(min(CONSUME_BATCH, want - n), timeout)
            if not msgs and time.monotonic() > deadline:
                break
            for m in msgs:
                if m.error() is None:
                    n += 1
    return n


# -------------------------------------------------------------------- the run
def _per_partition(total: int, partitions: int) -> list[int]:
    """How ``produce_backlog``'s round robin spreads ``total`` records."""
    return [total // partitions + (1 if p < total % partitions else 0) for p in range(partitions)]


def run_bench(
    settings: BenchSettings | None = None,
    *,
    cluster: Any = None,
    out: Out | None = print,
) -> BenchResult:
    """Run the scenarios and return every run's measurements.

    Args:
        settings: what to run; ``BenchSettings()`` when None.
        cluster: a running ``KafkaCluster`` (tests pass theirs); when None,
            ``settings.bootstrap_servers`` names one, or an embedded one is started.
        out: receives a progress line per run; None prints nothing.

    Raises:
        RuntimeError, KafkaException: the cluster or a worker failed.
    """
    s = settings or BenchSettings()
    emit = out or quiet
    notes: list[str] = []
    throughput: list[ThroughputRun] = []
    recovery: list[RecoveryRun] = []
    log = fresh_produced = failures = 0
    with Session("bench", s.bootstrap_servers, cluster, emit) as session:
        if "steady" in s.scenarios:
            log, failures = _steady(session, s, throughput, notes, emit)
        if "recovery" in s.scenarios:
            fresh_produced, more = _recovery(session, s, recovery, emit)
            failures += more
        if failures:
            notes.append(f"{failures:,} records failed to produce")
    return BenchResult(
        settings=s,
        cluster=session.description,
        machine=session.machine(),
        recovery=tuple(recovery),
        throughput=tuple(throughput),
        throughput_log=log,
        fresh_produced=fresh_produced,
        produce_failures=failures,
        wall_s=session.wall_s,
        notes=tuple(notes),
    )


def _steady(
    session: Session, s: BenchSettings, runs: list[ThroughputRun], notes: list[str], emit: Out
) -> tuple[int, int]:
    """The throughput runs; returns (records the log held, records that failed to produce)."""
    topic = session.topic("-steady", s.partitions)
    failures = produce_backlog(session.bootstrap, topic, s.partitions, s.throughput_records)
    log = sum(hi - lo for lo, hi in watermarks(session.probe, topic, s.partitions))
    emit(f"steady state: {log:,} records in {topic}")
    if log < s.throughput_records:
        notes.append(
            f"steady state: retention kept {log:,} of {s.throughput_records:,} records;"
            " each run reads what the log holds"
        )
    for rep in range(s.steady_reps):
        for loop in LOOPS:
            spec = {
                "kind": "throughput",
                "bootstrap": session.bootstrap,
                "topic": topic,
                "groups": {
                    v: session.group(f"tp-{loop}-{v.replace(' ', '')}-{rep}") for v in VARIANTS
                },
                "variants": alternate(VARIANTS, rep),
                "loop": loop,
                "records": min(s.throughput_records, log),
                "poll_timeout_s": s.poll_timeout_s,
                "run_timeout_s": s.run_timeout_s,
            }
            got = run_worker(_WORKER_MODULE, spec, s.run_timeout_s + _WORKER_GRACE_S)
            for variant in VARIANTS:
                done = got["variants"][variant]
                run = ThroughputRun(loop, variant, rep, done["records"], done["seconds"])
                runs.append(run)
                emit(
                    f"[steady {rep + 1}/{s.steady_reps}] {loop:7} {variant:8}"
                    f" {run.per_s:>10,.0f} records/s ({run.records:,} in {run.seconds:.2f} s)"
                )
    return log, failures


def _recovery(
    session: Session, s: BenchSettings, runs: list[RecoveryRun], emit: Out
) -> tuple[int, int]:
    """The restarts; returns (fresh records produced, records that failed to produce)."""
    topic = session.topic("", s.partitions)
    bootstrap = session.bootstrap
    fresh = FreshProducer(bootstrap, partition_keys(topic, s.partitions), s.rate)
    fresh.start()
    session.later(fresh.stop)
    emit(f"recovery: {topic}, {s.partitions} partitions, {s.rate:g} fresh records/s throughout")
    failures = 0

    def one(asked: int, work_us: float, rep: int, consumer: str) -> None:
        nonlocal failures
        if asked:
            failures += produce_backlog(bootstrap, topic, s.partitions, asked)
        marks = watermarks(session.probe, topic, s.partitions)
        share = _per_partition(asked, s.partitions)
        start = [max(lo, hi - n) for (lo, hi), n in zip(marks, share, strict=True)]
        group = session.group(f"r{asked}-w{work_us:g}-{rep}-{consumer}")
        set_group_offsets(bootstrap, topic, group, start)
        spec = {"kind": "recovery", "consumer": consumer, "bootstrap": bootstrap, "topic": topic,
                "group": group, "start": start, "work_us": work_us, "tail_s": s.tail_s,
                "run_timeout_s": s.run_timeout_s, "window_s": s.duration_s}  # fmt: skip
        got = run_worker(_WORKER_MODULE, spec, s.run_timeout_s + _WORKER_GRACE_S)
        run = RecoveryRun(
            asked=asked,
            work_us=work_us,
            rep=rep,
            consumer=consumer,
            prepared=sum(hi - st for (_lo, hi), st in zip(marks, start, strict=True)),
            result=revive(RunResult, got["result"]),
            rss_peak_kib=got["rss_peak_kib"],
            rss_base_kib=got["rss_base_kib"],
        )
        runs.append(run)
        emit(f"[recovery {rep + 1}/{s.reps}] " + _run_line(run))

    turn = 0
    for rep in range(s.reps):
        for work_us in s.work_us:
            one(0, work_us, rep, FAST)
            for asked in s.backlogs:
                for consumer in alternate(RECOVERY_CONSUMERS, turn):
                    one(asked, work_us, rep, consumer)
                turn += 1
    fresh.stop()
    if fresh.error is not None:
        raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
    return fresh.sent, failures + fresh.failures


# ----------------------------------------------------------------- printing
def _run_line(run: RecoveryRun) -> str:
    r = run.result
    what = "steady (no backlog)" if run.asked == 0 else f"B={run.asked:,}"
    d = format_duration
    line = (
        f"{what} W={run.work_us:g}us {run.consumer}: backlog {r.backlog:,},"
        f" first fresh {d(r.first_fresh_s)}, p99 {d(r.fresh_p99_s)}, max {d(r.fresh_max_s)},"
        f" backlog delivered {d(r.backlog_done_s)},"
        f" peak RSS {run.rss_peak_kib / 1024:.0f} MiB, close() {d(r.close_s)}"
    )
    if r.lost or r.timed_out:
        line += f", LOST {r.lost:,}" + (" (timed out)" if r.timed_out else "")
    return line


def _group_runs(result: BenchResult) -> dict[tuple[int, float, str], list[RecoveryRun]]:
    out: dict[tuple[int, float, str], list[RecoveryRun]] = {}
    for run in result.recovery:
        out.setdefault((run.asked, run.work_us, run.consumer), []).append(run)
    return out


def _by_rep(runs: Sequence[RecoveryRun]) -> dict[int, RunResult]:
    return {r.rep: r.result for r in runs}


def paired_ratio(
    top: Sequence[RecoveryRun], bottom: Sequence[RecoveryRun], metric: str
) -> float | None:
    """Median over the repetitions of top/bottom (``metric``: a ``RunResult`` field), each
    pair from the same repetition.

    The two runs of a pair ran minutes apart at most, under the same load from the
    rest of the machine; a ratio of medians could pair a quiet run with a busy one.
    """
    b = _by_rep(bottom)
    return median(
        div(getattr(t.result, metric), getattr(b[t.rep], metric)) for t in top if t.rep in b
    )


def better_plain_drain(
    fast: Sequence[RecoveryRun], plain: Sequence[RecoveryRun], tuned: Sequence[RecoveryRun]
) -> float | None:
    """The drain target's ratio: fastrebalance against the faster of the two plain
    consumers of the same repetition (defaults, or tuned like the child), so that a
    fetch setting the child has and plain lacks cannot pass for the design's gain."""
    p, t = _by_rep(plain), _by_rep(tuned)

    def best(rep: int) -> float | None:
        times = [r.backlog_done_s for r in (p.get(rep), t.get(rep)) if r and r.backlog_done_s]
        return min(times) if times else None

    return median(div(f.result.backlog_done_s, best(f.rep)) for f in fast)


def steady_p99(result: BenchResult, work_us: float) -> float | None:
    """Median p99 of fastrebalance restarted without a backlog: the reference."""
    runs = _group_runs(result).get((0, work_us, FAST), [])
    return median(r.result.fresh_p99_s for r in runs)


def _recovery_tables(result: BenchResult) -> list[str]:
    s = result.settings
    runs = _group_runs(result)
    lines = [
        f"### Recovery: restart with a backlog of B records, {s.partitions} partitions,"
        f" {s.rate:g} fresh records/s",
        "",
    ]
    Key = tuple[int, float, str]  # (B asked, W, consumer)
    d = format_duration

    def med(name: str) -> Callable[[Key], float | None]:
        return lambda k: median(getattr(r.result, name) for r in runs[k])

    def vs_steady(k: Key) -> str:
        steady = runs.get((0, k[1], FAST), [])
        return ratio(paired_ratio(runs[k], steady, "fresh_p99_s")) if k[0] else "-"

    def records_per_s(k: Key) -> str:
        rps = med("records_per_s")(k)
        return f"{rps:,.0f}" if rps and k[0] else "-"

    columns: list[Column[Key]] = [
        ("B asked", lambda k: "0 (steady)" if k[0] == 0 else f"{k[0]:,}"),
        ("W µs", lambda k: f"{k[1]:g}"),
        ("consumer", lambda k: k[2]),
        ("backlog at restart", lambda k: f"{med('backlog')(k) or 0:,.0f}"),
        ("first fresh", lambda k: d(med("first_fresh_s")(k))),
        ("fresh p50", lambda k: d(med("fresh_p50_s")(k))),
        ("fresh p99", lambda k: d(med("fresh_p99_s")(k))),
        ("fresh max", lambda k: d(med("fresh_max_s")(k))),
        ("fresh via child", lambda k: f"{med('fresh_out_of_order')(k) or 0:,.0f}"),
        ("p99 ÷ steady p99", vs_steady),
        ("backlog delivered", lambda k: d(med("backlog_done_s")(k)) if k[0] else "-"),
        ("records/s", records_per_s),
        ("peak RSS", lambda k: f"{(median(r.rss_peak_kib for r in runs[k]) or 0) / 1024:.0f} MiB"),
        ("close()", lambda k: d(med("close_s")(k))),
        ("lost", lambda k: f"{sum(r.result.lost for r in runs[k]):,}"),
    ]
    order = sorted(runs, key=lambda k: (k[1], k[0], RECOVERY_CONSUMERS.index(k[2])))
    lines += table(columns, order, left=3)
    lines += [
        "",
        "Targets (each ratio: the median over the repetitions of the ratio within one repetition):",
        "",
    ]
    header = ["B", "W µs", f"fastrebalance p99 ÷ steady p99 (≤ {TARGET_P99_RATIO:g})",
              "plain p99 ÷ steady p99", "drain fastrebalance ÷ plain (defaults)",
              "drain fastrebalance ÷ plain tuned",
              f"drain ÷ better plain (≤ {TARGET_DRAIN_RATIO:g})",
              "first fresh plain ÷ fastrebalance", "met"]  # fmt: skip
    rows = []
    for work_us in s.work_us:
        steady = runs.get((0, work_us, FAST), [])
        for asked in s.backlogs:
            plain = runs.get((asked, work_us, PLAIN), [])
            tuned = runs.get((asked, work_us, TUNED), [])
            fast = runs.get((asked, work_us, FAST), [])
            if not plain or not fast:
                continue
            p99_ratio = paired_ratio(fast, steady, "fresh_p99_s")
            drain = paired_ratio(fast, plain, "backlog_done_s")
            drain_tuned = paired_ratio(fast, tuned, "backlog_done_s") if tuned else None
            best = better_plain_drain(fast, plain, tuned)
            met = []
            if p99_ratio is not None:
                met.append("p99 ✓" if p99_ratio <= TARGET_P99_RATIO else "p99 ✗")
            if best is not None:
                met.append("drain ✓" if best <= TARGET_DRAIN_RATIO else "drain ✗")
            rows.append(
                [
                    f"{asked:,}",
                    f"{work_us:g}",
                    ratio(p99_ratio),
                    ratio(paired_ratio(plain, steady, "fresh_p99_s")),
                    ratio(drain),
                    ratio(drain_tuned),
                    ratio(best),
                    ratio(paired_ratio(plain, fast, "first_fresh_s")),
                    " ".join(met) or "-",
                ]
            )
    lines += md_table(header, rows, left=2)
    base = median(r.rss_base_kib for r in result.recovery) or 0.0
    lines += [
        "",
        f"Fresh records: produced within {s.duration_s:g} s of the restart. Peak RSS includes"
        f" the worker's base (Python + libraries) of {base / 1024:.0f} MiB. Every column:"
        " docs/benchmarks.md, What is measured.",
        "",
    ]
    return lines


def _throughput_table(result: BenchResult) -> list[str]:
    s = result.settings
    lines = [
        f"### Steady state: no backlog, {result.throughput_log:,} records read from the"
        f" start (records/s, medians of {s.steady_reps})",
        "",
    ]
    header = ["loop", "raw confluent-kafka", "fastrebalance, mode off",
              "fastrebalance, mode on", "off ÷ raw", "on ÷ raw", "met"]  # fmt: skip
    rows = []
    for loop in LOOPS:
        runs = [t for t in result.throughput if t.loop == loop]
        rate = {v: median(t.per_s for t in runs if t.variant == v) for v in VARIANTS}
        raw = {t.rep: t.per_s for t in runs if t.variant == RAW}
        ratios = {
            v: median(div(t.per_s, raw.get(t.rep)) for t in runs if t.variant == v)
            for v in (OFF, ON)
        }
        met = []
        for name, variant in (("off", OFF), ("on", ON)):
            value = ratios[variant]
            if value is not None:
                ok = value >= TARGET_THROUGHPUT[(loop, variant)]
                met.append(f"{name} {'✓' if ok else '✗'}")
        call = (
            f"poll({s.poll_timeout_s:g})"
            if loop == "poll"
            else f"consume({CONSUME_BATCH}, {s.poll_timeout_s:g})"
        )
        rows.append(
            [call]
            + [f"{rate[v]:,.0f}" if rate[v] else "-" for v in VARIANTS]
            + [ratio(ratios[OFF]), ratio(ratios[ON]), " ".join(met) or "-"]
        )
    lines += md_table(header, rows)
    lines += [
        "",
        "Targets: mode on ≥ 0.95x raw poll() and consume(); mode off ≥ 0.98x. How the three"
        f" variants share one process, in turns of {BLOCK:,} records: docs/benchmarks.md,"
        " What is measured.",
        "",
    ]
    return lines


def format_markdown(result: BenchResult, command: str | None = None) -> str:
    """The tables (medians over the repetitions), their targets and a legend, as Markdown."""
    s = result.settings
    lines: list[str] = []
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [
        machine_line(result.machine, result.cluster),
        f"Recovery: medians of {s.reps} repetition(s); the consumers alternate which runs"
        f" first. Wall time {result.wall_s / 60:.1f} min.",
        "",
    ]
    if result.recovery:
        lines += _recovery_tables(result)
    if result.throughput:
        lines += _throughput_table(result)
    for note in result.notes:
        lines.append(f"Note: {note}")
    if result.recovery:
        problems = result.problems()
        lines.append(
            f"Loss check: {result.lost:,} records lost over {len(result.recovery)} restarts"
            + (
                " (every run delivered every record)."
                if not problems
                else " — CHECK FAILED: " + "; ".join(problems) + "."
            )
        )
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------- plot
def _median_run(group: list[RecoveryRun]) -> RecoveryRun:
    """The repetition whose p99 is the median: a typical run, not a lucky one."""
    ordered = sorted(group, key=lambda r: r.result.fresh_p99_s or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def write_plot(result: BenchResult, path: str) -> str | None:
    """Fresh-record latency over time after the restart, plain and fastrebalance on one
    chart per (B, W). Returns the path, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return None
    s = result.settings
    runs = _group_runs(result)
    cells = [(b, w) for b in s.backlogs for w in s.work_us
             if (b, w, PLAIN) in runs and (b, w, FAST) in runs]  # fmt: skip
    if not cells:
        return None
    ncols = len(s.work_us)
    nrows = -(-len(cells) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(5.2 * ncols, 3.1 * nrows), squeeze=False, sharey=True
    )
    colours = {PLAIN: "#d62728", FAST: "#1f77b4"}
    for ax, (asked, work_us) in zip(axes.flat, cells, strict=False):
        for consumer in (PLAIN, FAST):
            run = _median_run(runs[(asked, work_us, consumer)])
            pts = run.result.samples
            if pts:
                ax.scatter(
                    [p[0] for p in pts],
                    [max(p[1], 1e-4) * 1000 for p in pts],
                    s=3,
                    color=colours[consumer],
                    rasterized=True,
                )
            if run.result.backlog_done_s is not None:
                ax.axvline(run.result.backlog_done_s, color=colours[consumer], lw=0.8, ls=":")
        ref = steady_p99(result, work_us)
        if ref:
            ax.axhline(ref * 1000, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_title(f"B = {asked:,} records, W = {work_us:g} µs/record", fontsize=9)
        ax.set_xlabel("delivered at, s after the restart", fontsize=8)
        ax.set_ylabel("fresh-record latency, ms", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", lw=0.3)
    for ax in list(axes.flat)[len(cells) :]:
        ax.set_visible(False)
    # One legend for the figure: inside a panel it hid the plain consumer's records,
    # which all arrive at once, top right, after its backlog.
    dot = {"ls": "", "marker": "o", "ms": 4}
    handles = [
        Line2D([], [], color=colours[PLAIN], label="plain confluent-kafka", **dot),
        Line2D([], [], color=colours[FAST], label="fastrebalance", **dot),
        Line2D([], [], ls=":", color="black", label="backlog delivered (colour: consumer)"),
        Line2D([], [], ls="--", color="grey", label="steady-state p99 (no backlog)"),
    ]
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8,
               bbox_to_anchor=(0.5, 1.0 - 0.55 / fig.get_figheight()), frameon=False)  # fmt: skip
    fig.suptitle(
        "Fresh-record latency after a restart, plain confluent-kafka vs fastrebalance:"
        f" {s.partitions} partitions, {s.rate:g} fresh records/s, median run of {s.reps}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / fig.get_figheight()))
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path





# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    d = BenchSettings()
    p = a.command(
        commands,
        "bench",
        "benchmark post-crash latency, catch-up speed and overhead against plain "
        "confluent-kafka",
        (
            "recovery: a group whose committed offsets lag the log end by B records restarts "
            "while a producer writes fresh timestamped records; each record costs W us of "
            "work. Measured for plain confluent_kafka.Consumer and fastrebalance.Consumer "
            "(enable.parallel.rebalance=True), alternating: time to the first fresh record, "
            "fresh-record latency p50/p99/max, time until the backlog is delivered, "
            "records/s, peak RSS; plus the steady-state p99 (fastrebalance, no backlog).",
            "steady: no backlog; poll() and consume(1000) throughput of raw confluent-kafka "
            "and fastrebalance with the mode off and on.",
            "Every run is its own process. Prints Markdown tables of the medians and ratios, "
            "and writes a latency plot when matplotlib is installed "
            "(pip install 'fastrebalance[bench]'). Runs on an embedded Kafka unless "
            "--bootstrap-servers names a cluster.",
        ),
        """\
examples:
  fastrebalance bench                                   # everything, ~10 min on 2 cores
  fastrebalance bench --backlogs 10000,100000 --reps 1 --duration 5
  fastrebalance bench --scenario steady --reps 5
  fastrebalance bench --bootstrap-servers localhost:9092 --plot latency.png
""",
    )
    int_list, float_list, count = a.number_list(int, 1), a.number_list(float, 0), a.number(int, 1)
    a.option(p, "--backlogs", d.backlogs, int_list, "B,...",
             "recovery backlog sizes, records (default: {})")
    a.option(p, "--work-us", d.work_us, float_list, "W,...",
             "work per record, microseconds (default: {})")
    a.option(p, "--reps", d.reps, count, "N",
             "repetitions of every recovery run; tables show medians (default: {})")
    a.option(p, "--steady-reps", d.steady_reps, count, "N",
             "repetitions of every steady-state run (default: {})")
    a.option(p, "--duration", d.duration_s, a.positive(), "SECONDS",
             "fresh-latency window after each restart; each recovery run lasts at least "
             "this long (default: {})")
    a.rate(p, d.rate, "fresh records per second (default: {})")
    a.partitions(p, d.partitions, "partitions of each benchmark topic (default: {})")
    a.option(p, "--throughput-records", d.throughput_records, count, "N",
             "records each steady-state run reads (default: {})")
    a.option(p, "--poll-timeout", d.poll_timeout_s, a.number(float, 0), "SECONDS",
             "timeout of each poll()/consume() in the steady-state loops "
             "(default: {}, as in the README)")
    p.add_argument("--scenario", choices=("all", "recovery", "steady", "group"), default="all",
                   help="which scenario to run (default: all; group: group-wide catch-up, 1-3 "
                   "member processes, python -m fastrebalance.tools.groupbench run --help)")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one; the benchmark "
                        "topics and groups are deleted afterwards")
    a.timeout(p, d.run_timeout_s, "give up on a run after this long; undelivered records "
              "count as lost (default: {})")
    p.add_argument("--plot", default="fastrebalance-bench.png", metavar="PATH",
                   help="latency-over-time PNG, if matplotlib is installed (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="do not write the plot")
    a.report_files(p)
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    if args.scenario == "group":
        from .groupbench import run_from_args

        return run_from_args(args)

    scenarios = ("steady", "recovery") if args.scenario == "all" else (args.scenario,)
    settings = BenchSettings(
        backlogs=args.backlogs, work_us=tuple(float(w) for w in args.work_us), reps=args.reps,
        steady_reps=args.steady_reps, duration_s=args.duration, rate=args.rate,
        partitions=args.partitions, throughput_records=args.throughput_records,
        poll_timeout_s=args.poll_timeout, scenarios=scenarios,
        bootstrap_servers=args.bootstrap_servers, run_timeout_s=args.timeout,
    )  # fmt: skip
    # The exact command, every option spelled out, so the tables can be reproduced.
    options = ("scenario", "backlogs", "work_us", "reps", "steady_reps", "duration", "rate",
               "partitions", "throughput_records", "poll_timeout", "bootstrap_servers")  # fmt: skip
    command = " ".join(["fastrebalance bench", *a.spelled(args, options)])
    print(f"fastrebalance bench: {command}\n", flush=True)
    result = run_bench(settings, out=lambda line: print(line, flush=True))
    a.write_report(args, format_markdown(result, command), result)
    if not args.no_plot and "recovery" in scenarios:
        written = write_plot(result, args.plot)
        if written:
            print(f"plot written to {written}")
        else:
            print("no plot: matplotlib is not installed (pip install 'fastrebalance[bench]')")
    return a.EXIT_OK if result.ok else a.EXIT_CHECK_FAILED


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(worker_main({"recovery": _worker_recovery, "throughput": _worker_throughput}))
