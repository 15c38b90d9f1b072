"""``fastrebalance bench``: post-crash latency, catch-up speed and overhead, side by side
with plain confluent-kafka, in one run. The scenarios (recovery, steady) and what each
column measures: docs/benchmarks.md.

Every measured consumer runs in its own process (``_runner.Worker``), where both libraries
run the same loop. The parent prepares each run's backlog right before it, so that every
run sees the same kind of backlog (B records in large lz4 batches, not the previous run's
trickle of fresh records), and reads the watermarks to report what the log really held.

Thread ownership: the fresh producer's handle belongs to its own thread; every other
handle belongs to the thread that calls ``run_bench()`` (or to the worker process).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import queue
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._config import UNCOMMITTED_KEY
from ..testing import _workload as wl
from . import _args as a
from . import _runner
from ._plot import Panel, Series, draw
from ._runner import FAST, PLAIN, Session, alternate, div, median, ratio
from .workload import (
    FETCH_WAIT_MS,
    GROUP_PROTOCOLS,
    RunResult,
    format_duration,
    group_conf,
    measure_restart,
)

#: plain confluent-kafka with the fetch setting fastrebalance gives its child
#: (_config.child_config): the fair baseline for the drain. librdkafka stops fetching for
#: fetch.queue.backoff.ms (1000 ms by default) whenever its queue holds queued.min.messages.
TUNED = "plain tuned"
TUNED_CONF = {"fetch.queue.backoff.ms": 10}
RECOVERY_CONSUMERS = (PLAIN, TUNED, FAST)
#: Throughput variants: raw confluent-kafka, fastrebalance with the mode off, and on.
RAW, OFF, ON = "raw", "mode off", "mode on"
VARIANTS = (RAW, OFF, ON)
LOOPS = ("poll", "consume")
CONSUME_BATCH = 1000  #: records asked per consume() in the steady state (the issue's)
POLL_TIMEOUT_S = 1.0  #: of each poll()/consume() in the steady state, as in the README
#: Targets from the issue: reported next to the measured ratios, never asserted.
TARGET_P99_RATIO = 1.5
TARGET_DRAIN_RATIO = 1.0
TARGET_THROUGHPUT = {OFF: 0.98, ON: 0.95}  #: of raw, for both loops
#: The steady-state runs time the loop over a queue librdkafka has already filled with the
#: whole topic (PREFETCH_S per handle after its first record), in turns of BLOCK records.
PREFETCH_S = 3.0
BLOCK = 10_000
_WORKER_GRACE_S = 60.0  #: a worker still silent this long after its run timeout is killed
_WORKER_MODULE = "fastrebalance.tools.bench"


@dataclass(frozen=True)
class BenchSettings:
    """What to run; the defaults take about 10 minutes on 2 cores. Each field is the
    option of the same name (``fastrebalance bench --help``), except ``tail_s``: each
    recovery run reads this long after its backlog and its window, so that the last fresh
    records of the window are delivered too. ``group_protocol``: every measured consumer's,
    plain and fastrebalance alike, so that a ratio compares the libraries under one
    protocol (``workload.group_conf``). ``keep_samples``: each recovery run returns every
    fresh record's latency (``RunResult.samples``), which --plot draws."""

    backlogs: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    work_us: tuple[float, ...] = (0.0, 20.0)
    reps: int = 3
    steady_reps: int = 5
    duration_s: float = 10.0
    rate: float = 100.0
    partitions: int = 4
    throughput_records: int = 1_000_000
    scenarios: tuple[str, ...] = ("steady", "recovery")
    bootstrap_servers: str | None = None
    tail_s: float = 0.3
    run_timeout_s: float = 300.0
    group_protocol: str = "classic"
    keep_samples: bool = False


@dataclass(frozen=True)
class RecoveryRun:
    """One restart. ``asked``: the backlog B asked for (0: the steady-state reference);
    ``prepared``: B as the log held it when the group's offsets were set (less than asked:
    retention trimmed it); ``rss_base_kib``: the worker before the consumer was built."""

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
    produce_failures: int
    wall_s: float
    notes: tuple[str, ...] = ()

    @property
    def lost(self) -> int:
        return sum(r.result.lost for r in self.recovery)

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """Why the run cannot be trusted as a loss check: a loss, or runs that could not
        show one (nothing produced, no backlog, no fresh record)."""
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
        if unfed:
            out.append(f"{len(unfed)} restart(s) saw no fresh record")
        return out


# ------------------------------------------------------------------ workers
def make_consumer(kind: str, conf: dict[str, Any]) -> Any:
    """Every measured consumer, by kind: the demo's restarts are built here too."""
    if kind in (PLAIN, RAW, TUNED):
        from confluent_kafka import Consumer as PlainConsumer

        return PlainConsumer({**conf, **TUNED_CONF} if kind == TUNED else conf)
    from .._consumer import Consumer as FastConsumer

    return FastConsumer({**conf, "enable.parallel.rebalance": kind in (FAST, ON)})


def _worker_recovery(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    from confluent_kafka import Consumer as PlainConsumer

    kind, args = spec["consumer"], spec["args"]
    probe = PlainConsumer({"bootstrap.servers": args["bootstrap"], "group.id": "bench-probe"})
    try:
        base = _runner.memory_kib("VmHWM")
        result = measure_restart(lambda conf: make_consumer(kind, conf), probe=probe, **args)
    finally:
        probe.close()
    peak = _runner.memory_kib("VmHWM")
    return {"result": dataclasses.asdict(result), "rss_peak_kib": peak, "rss_base_kib": base}


def _worker_throughput(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    """Every variant in one process, each with its own group over the whole topic, read
    in turns of ``BLOCK`` records: the time of each variant's loop, first record excluded.

    Why turns, and why the queues are filled first: docs/benchmarks.md, What is measured.
    The loop body is the least an application does, so the library's per-call cost is as
    visible as it can be.
    """
    # fetch.queue.backoff.ms 10 and queues that hold the whole topic: librdkafka's default
    # backoff (1000 ms) pauses the fetch at ~100k queued records, and the fetch is not timed
    conf = {"bootstrap.servers": spec["bootstrap"], "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            **group_conf(spec.get("group_protocol", BenchSettings.group_protocol)),
            "fetch.queue.backoff.ms": 10, "queued.max.messages.kbytes": 1_000_000,
            "queued.min.messages": 10_000_000}  # fmt: skip
    variants: list[str] = spec["variants"]
    want: int = spec["records"] - 1  # each handle's first record is not timed
    deadline = time.monotonic() + spec["run_timeout_s"]
    consumers: dict[str, Any] = {}
    read = dict.fromkeys(variants, 0)
    seconds = dict.fromkeys(variants, 0.0)
    try:
        for v in variants:
            # the steady state: a fresh group's partitions are read in order, not caught up
            # on from the log start (parallel.rebalance.catchup.uncommitted, with earliest)
            steady = {} if v in (PLAIN, RAW, TUNED) else {UNCOMMITTED_KEY: False}
            consumers[v] = make_consumer(v, {**conf, "group.id": spec["groups"][v], **steady})
            consumers[v].subscribe([spec["topic"]])
        for v in variants:  # the first record: it waits for the join and the first fetch
            while (m := consumers[v].poll(POLL_TIMEOUT_S)) is None or m.error() is not None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{v}: no record within the run timeout")
        time.sleep(PREFETCH_S * len(variants))
        turn = 0
        while any(read[v] < want for v in variants) and time.monotonic() <= deadline:
            for v in alternate(variants, turn):
                n = min(BLOCK, want - read[v])
                if n > 0:
                    began = time.perf_counter()
                    got = _read_block(consumers[v], spec["loop"], n, deadline)
                    seconds[v] += time.perf_counter() - began
                    read[v] += got
            turn += 1
    finally:
        for c in consumers.values():
            c.close()
    return {"variants": {v: {"records": read[v], "seconds": seconds[v]} for v in variants}}


def _read_block(consumer: Any, loop: str, want: int, deadline: float) -> int:
    """``want`` records through ``consumer``'s poll() or consume() loop; fewer only
    past the deadline."""
    n = 0
    if loop == "poll":
        poll = consumer.poll
        while n < want:
            m = poll(POLL_TIMEOUT_S)
            if m is None:
                if time.monotonic() > deadline:
                    break
            elif m.error() is None:
                n += 1
        return n
    consume = consumer.consume
    while n < want:
        # never ask past the last record: that call would wait out its timeout
        msgs = consume(min(CONSUME_BATCH, want - n), POLL_TIMEOUT_S)
        if not msgs and time.monotonic() > deadline:
            break
        for m in msgs:
            if m.error() is None:
                n += 1
    return n


# -------------------------------------------------------------------- the run
def run_bench(
    settings: BenchSettings | None = None, *, cluster: Any = None, out: _runner.Out | None = print
) -> BenchResult:
    """Run the scenarios and return every run's measurements. ``cluster``: a running
    ``KafkaCluster`` (tests pass theirs); when None, ``settings.bootstrap_servers`` names
    one, or an embedded one is started. ``out`` receives a progress line per run."""
    s = settings or BenchSettings()
    emit = out or _runner.quiet
    notes: list[str] = []
    throughput: list[ThroughputRun] = []
    recovery: list[RecoveryRun] = []
    log = failures = 0
    with Session("bench", s.bootstrap_servers, cluster, emit) as session:
        if "steady" in s.scenarios:
            log, failures = _steady(session, s, throughput, notes, emit)
        if "recovery" in s.scenarios:
            failures += _recovery(session, s, recovery, emit)
        if failures:
            notes.append(f"{failures:,} records failed to produce")
    return BenchResult(s, session.description, session.machine(), tuple(recovery),
                       tuple(throughput), log, failures, session.wall_s, tuple(notes))  # fmt: skip


def _steady(
    session: Session, s: BenchSettings, runs: list[ThroughputRun], notes: list[str],
    emit: _runner.Out,
) -> tuple[int, int]:  # fmt: skip
    """The throughput runs; returns (records the log held, records that failed to produce)."""
    topic = session.topic("-steady", s.partitions)
    failures = wl.produce_backlog(session.bootstrap, topic, s.partitions, s.throughput_records)
    log = sum(hi - lo for lo, hi in wl.watermarks(session.probe, topic, s.partitions))
    emit(f"steady state: {log:,} records in {topic}")
    if log < s.throughput_records:
        notes.append(f"steady state: retention kept {log:,} of {s.throughput_records:,} records;"
                     " each run reads what the log holds")  # fmt: skip
    for rep in range(s.steady_reps):
        for loop in LOOPS:
            groups = {v: session.group(f"tp-{loop}-{v.replace(' ', '')}-{rep}") for v in VARIANTS}
            spec = {"kind": "throughput", "bootstrap": session.bootstrap, "topic": topic,
                    "groups": groups, "variants": alternate(VARIANTS, rep), "loop": loop,
                    "records": min(s.throughput_records, log),
                    "run_timeout_s": s.run_timeout_s,
                    "group_protocol": s.group_protocol}  # fmt: skip
            got = _runner.run_worker(_WORKER_MODULE, spec, s.run_timeout_s + _WORKER_GRACE_S)
            done = [ThroughputRun(loop, v, rep, **got["variants"][v]) for v in VARIANTS]
            runs += done
            rates = ", ".join(f"{t.variant} {t.per_s:,.0f}" for t in done)
            emit(f"[steady {rep + 1}/{s.steady_reps}] {loop}: {rates} records/s")
    return log, failures


def _recovery(
    session: Session, s: BenchSettings, runs: list[RecoveryRun], emit: _runner.Out
) -> int:
    """The restarts; returns the records that failed to produce."""
    topic, bootstrap = session.topic("", s.partitions), session.bootstrap
    fresh = wl.FreshProducer(bootstrap, wl.partition_keys(topic, s.partitions), s.rate)
    fresh.start()
    session.later(fresh.stop)
    emit(f"recovery: {topic}, {s.partitions} partitions, {s.rate:g} fresh records/s throughout,"
         f" group protocol {s.group_protocol}")
    failures = 0

    def one(asked: int, work_us: float, rep: int, consumer: str) -> None:
        nonlocal failures
        if asked:
            failures += wl.produce_backlog(bootstrap, topic, s.partitions, asked)
        marks = wl.watermarks(session.probe, topic, s.partitions)
        # the last records of each partition: produce_backlog's round robin of ``asked``
        share = [asked // s.partitions + (p < asked % s.partitions) for p in range(s.partitions)]
        start = [max(lo, hi - n) for (lo, hi), n in zip(marks, share, strict=True)]
        group = session.group(f"r{asked}-w{work_us:g}-{rep}-{consumer}")
        wl.set_group_offsets(bootstrap, topic, group, start)
        args = {"bootstrap": bootstrap, "topic": topic, "group": group, "start": start,
                "work_us": work_us, "tail_s": s.tail_s, "run_timeout_s": s.run_timeout_s,
                "window_s": s.duration_s, "group_protocol": s.group_protocol,
                "keep_samples": s.keep_samples}  # fmt: skip
        spec = {"kind": "recovery", "consumer": consumer, "args": args}
        got = _runner.run_worker(_WORKER_MODULE, spec, s.run_timeout_s + _WORKER_GRACE_S)
        prepared = sum(hi - st for (_lo, hi), st in zip(marks, start, strict=True))
        result = _runner.revive(RunResult, got["result"])
        run = RecoveryRun(asked, work_us, rep, consumer, prepared, result, got["rss_peak_kib"],
                          got["rss_base_kib"])  # fmt: skip
        runs.append(run)
        r, d = run.result, format_duration
        lost = f", LOST {r.lost:,}" if r.lost or r.timed_out else ""
        emit(f"[recovery {rep + 1}/{s.reps}] B={asked:,} W={work_us:g} {consumer}: first fresh"
             f" {d(r.first_fresh_s)}, backlog delivered {d(r.backlog_done_s)}{lost}"
             + (" (timed out)" if r.timed_out else ""))  # fmt: skip

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
    return failures + fresh.failures


# ----------------------------------------------------------------- printing
def recovery_panels(result: BenchResult) -> list[Panel]:
    """What --plot draws: a panel per (work per record, backlog), in the tables' order,
    each consumer's median run by fresh p99 (a run, not a median of runs: the points of
    one restart belong together)."""
    runs: dict[tuple[float, int], dict[str, list[RecoveryRun]]] = {}
    for run in result.recovery:
        runs.setdefault((run.work_us, run.asked), {}).setdefault(run.consumer, []).append(run)
    panels = []
    for (work_us, asked), by_consumer in sorted(runs.items()):
        if not asked:
            continue
        series = []
        for consumer in RECOVERY_CONSUMERS:
            ranked = sorted(by_consumer.get(consumer, []),
                            key=lambda r: r.result.fresh_p99_s or math.inf)  # fmt: skip
            if ranked:
                r = ranked[(len(ranked) - 1) // 2].result
                series.append(Series(consumer, r.samples, r.backlog_done_s))
        steady = runs.get((work_us, 0), {}).get(FAST, [])
        panels.append(Panel(
            f"backlog {asked:,} records, {work_us:g} µs of work a record", series,
            median(r.result.fresh_p99_s for r in steady),
        ))  # fmt: skip
    return panels


def write_plot(result: BenchResult, path: str) -> str:
    """The recovery latency plot as a PNG at ``path``; PlotUnavailable without matplotlib,
    ValueError when the runs kept no samples (``BenchSettings.keep_samples``)."""
    panels = recovery_panels(result)
    if not any(s.samples for p in panels for s in p.series):
        raise ValueError("the recovery runs kept no samples: run with keep_samples=True")
    s = result.settings
    title = (f"Fresh-record latency after a restart with a backlog: {s.rate:g} fresh"
             f" records/s, {s.partitions} partitions; median run (by p99) of {s.reps}")  # fmt: skip
    return draw(panels, path, title)


def paired_ratio(
    top: Sequence[RecoveryRun], bottom: Sequence[RecoveryRun], metric: str
) -> float | None:
    """Median over the repetitions of top/bottom (``metric``: a ``RunResult`` field), each
    pair from the same repetition: the two ran minutes apart at most, under the same load
    from the rest of the machine, where a ratio of medians could pair a quiet run with a
    busy one."""
    b = {r.rep: getattr(r.result, metric) for r in bottom}
    return median(div(getattr(t.result, metric), b[t.rep]) for t in top if t.rep in b)


def better_plain_drain(
    fast: Sequence[RecoveryRun], plain: Sequence[RecoveryRun], tuned: Sequence[RecoveryRun]
) -> float | None:
    """The drain target's ratio: fastrebalance against the faster of the two plain
    consumers of the same repetition (defaults, or tuned like the child), so that a
    fetch setting the child has and plain lacks cannot pass for the design's gain."""

    def best(rep: int) -> float | None:
        times = [r.result.backlog_done_s for r in (*plain, *tuned) if r.rep == rep]
        return min((t for t in times if t), default=None)

    return median(div(f.result.backlog_done_s, best(f.rep)) for f in fast)


def _mark(name: str, value: float | None, low: float = 0.0, high: float = math.inf) -> list[str]:
    """``name ✓`` when ``value`` meets its target, ``name ✗`` when not; nothing if unmeasured."""
    return [] if value is None else [f"{name} {'✓' if low <= value <= high else '✗'}"]


def _recovery_tables(result: BenchResult) -> list[str]:
    s = result.settings
    runs: dict[tuple[int, float, str], list[RecoveryRun]] = {}
    for run in result.recovery:
        runs.setdefault((run.asked, run.work_us, run.consumer), []).append(run)
    d = format_duration

    def med(k: tuple[int, float, str], name: str) -> Any:
        return median(getattr(r.result, name) for r in runs[k])

    def row(k: tuple[int, float, str]) -> list[str]:
        steady, rss = runs.get((0, k[1], FAST), []), median(r.rss_peak_kib for r in runs[k])
        return [
            "0 (steady)" if k[0] == 0 else f"{k[0]:,}", f"{k[1]:g}", k[2],
            f"{med(k, 'backlog') or 0:,.0f}", d(med(k, "first_fresh_s")),
            d(med(k, "fresh_p50_s")), d(med(k, "fresh_p99_s")), d(med(k, "fresh_max_s")),
            f"{med(k, 'fresh_out_of_order') or 0:,.0f}",
            ratio(paired_ratio(runs[k], steady, "fresh_p99_s")) if k[0] else "-",
            d(med(k, "backlog_done_s")) if k[0] else "-",
            f"{med(k, 'records_per_s'):,.0f}" if k[0] and med(k, "records_per_s") else "-",
            f"{(rss or 0) / 1024:.0f} MiB", d(med(k, "close_s")),
            f"{sum(r.result.lost for r in runs[k]):,}",
        ]  # fmt: skip

    header = ["B asked", "W µs", "consumer", "backlog at restart", "first fresh", "fresh p50",
              "fresh p99", "fresh max", "fresh via child", "p99 ÷ steady p99",
              "backlog delivered", "records/s", "peak RSS", "close()", "lost"]  # fmt: skip
    order = sorted(runs, key=lambda k: (k[1], k[0], RECOVERY_CONSUMERS.index(k[2])))
    lines = [f"### Recovery: restart with a backlog of B records, {s.partitions} partitions,"
             f" {s.rate:g} fresh records/s", ""]  # fmt: skip
    lines += _runner.md_table(header, [row(k) for k in order], left=3)
    lines += ["", "Targets (each ratio: the median over the repetitions of the ratio within"
              " one repetition):", ""]  # fmt: skip
    header = ["B", "W µs", f"fastrebalance p99 ÷ steady p99 (≤ {TARGET_P99_RATIO:g})",
              "plain p99 ÷ steady p99", "drain fastrebalance ÷ plain (defaults)",
              "drain fastrebalance ÷ plain tuned",
              f"drain ÷ better plain (≤ {TARGET_DRAIN_RATIO:g})",
              "first fresh plain ÷ fastrebalance", "met"]  # fmt: skip
    rows = []
    for work_us in s.work_us:
        steady = runs.get((0, work_us, FAST), [])
        for asked in s.backlogs:
            plain, tuned, fast = (runs.get((asked, work_us, c), []) for c in RECOVERY_CONSUMERS)
            if not plain or not fast:
                continue
            p99 = paired_ratio(fast, steady, "fresh_p99_s")
            best = better_plain_drain(fast, plain, tuned)
            met = _mark("p99", p99, high=TARGET_P99_RATIO)
            met += _mark("drain", best, high=TARGET_DRAIN_RATIO)
            rows.append([f"{asked:,}", f"{work_us:g}", ratio(p99),
                         ratio(paired_ratio(plain, steady, "fresh_p99_s")),
                         ratio(paired_ratio(fast, plain, "backlog_done_s")),
                         ratio(paired_ratio(fast, tuned, "backlog_done_s") if tuned else None),
                         ratio(best), ratio(paired_ratio(plain, fast, "first_fresh_s")),
                         " ".join(met) or "-"])  # fmt: skip
    lines += _runner.md_table(header, rows, left=2)
    base = median(r.rss_base_kib for r in result.recovery) or 0.0
    return [*lines, "", f"Fresh records: produced within {s.duration_s:g} s of the restart."
            f" Peak RSS includes the worker's base (Python + libraries) of {base / 1024:.0f}"
            " MiB. Every column: docs/benchmarks.md, What is measured.", ""]  # fmt: skip


def _throughput_table(result: BenchResult) -> list[str]:
    s = result.settings
    header = ["loop", "raw confluent-kafka", "fastrebalance, mode off",
              "fastrebalance, mode on", "off ÷ raw", "on ÷ raw", "met"]  # fmt: skip
    rows = []
    for loop in LOOPS:
        runs = [t for t in result.throughput if t.loop == loop]
        rate = {v: median(t.per_s for t in runs if t.variant == v) for v in VARIANTS}
        raw = {t.rep: t.per_s for t in runs if t.variant == RAW}
        ratios = {v: median(div(t.per_s, raw.get(t.rep)) for t in runs if t.variant == v)
                  for v in (OFF, ON)}  # fmt: skip
        met = [m for n, v in (("off", OFF), ("on", ON))
               for m in _mark(n, ratios[v], low=TARGET_THROUGHPUT[v])]  # fmt: skip
        t = f"{POLL_TIMEOUT_S:g}"
        call = f"poll({t})" if loop == "poll" else f"consume({CONSUME_BATCH}, {t})"
        rows.append([call, *(f"{rate[v]:,.0f}" if rate[v] else "-" for v in VARIANTS),
                     ratio(ratios[OFF]), ratio(ratios[ON]), " ".join(met) or "-"])  # fmt: skip
    return [
        f"### Steady state: no backlog, {result.throughput_log:,} records read from the"
        f" start (records/s, medians of {s.steady_reps})",
        "",
        *_runner.md_table(header, rows),
        "",
        "Targets: mode on ≥ 0.95x raw poll() and consume(); mode off ≥ 0.98x. How the three"
        f" variants share one process, in turns of {BLOCK:,} records: docs/benchmarks.md,"
        " What is measured.",
        "",
    ]


def protocol_line(protocol: str) -> str:
    """The report names the group protocol: the same tables under the other protocol are
    a different measurement (KIP-848's assignment is the broker's, heartbeat-driven)."""
    if protocol == "consumer":
        return ("Group protocol: consumer (KIP-848, `group.protocol=consumer`) for every measured"
                " consumer; session and heartbeat are the broker's.")  # fmt: skip
    return (f"Group protocol: classic for every measured consumer (session.timeout.ms"
            f" {group_conf('classic')['session.timeout.ms']}).")


def format_markdown(result: BenchResult, command: str | None = None) -> str:
    """The tables (medians over the repetitions), their targets and a legend, as Markdown."""
    s = result.settings
    lines = [f"Command: `{command}`", ""] if command else []
    lines += [
        _runner.machine_line(result.machine, result.cluster),
        protocol_line(s.group_protocol),
        f"Recovery: medians of {s.reps} repetition(s); the consumers alternate which runs"
        f" first. Wall time {result.wall_s / 60:.1f} min.",
        "",
    ]
    if result.recovery:
        lines += _recovery_tables(result)
    if result.throughput:
        lines += _throughput_table(result)
    lines += [f"Note: {note}" for note in result.notes]
    if result.recovery:
        problems = "; ".join(result.problems())
        ok = "(every run delivered every record)"
        verdict = f"— CHECK FAILED: {problems}" if problems else ok
        lines.append(f"Loss check: {result.lost:,} records lost over {len(result.recovery)}"
                     f" restarts {verdict}.")  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    d = BenchSettings()
    p = a.command(
        commands,
        "bench",
        "benchmark post-crash latency, catch-up speed and overhead against plain "
        "confluent-kafka",
        (
            "recovery: a group B records behind restarts while fresh timestamped records "
            "arrive, each record costing W us of work: plain confluent-kafka (defaults, and "
            "tuned like the child) and fastrebalance in turns. steady: no backlog; poll() and "
            "consume(1000) throughput of raw confluent-kafka and fastrebalance, mode off and on.",
            "Every run is its own process. Prints Markdown tables of the medians and ratios "
            "(every column: docs/benchmarks.md). Runs on an embedded Kafka unless "
            "--bootstrap-servers names a cluster.",
        ),
        """\
examples:
  fastrebalance bench                                   # everything, ~10 min on 2 cores
  fastrebalance bench --backlogs 10000,100000 --reps 1 --duration 5
  fastrebalance bench --scenario steady --steady-reps 5
  fastrebalance bench --scenario recovery --backlogs 50000 --reps 1 --plot latency.png
  fastrebalance bench --bootstrap-servers localhost:9092 --markdown bench.md
  fastrebalance bench --scenario recovery --group-protocol consumer     # KIP-848 (Kafka 4)
  fastrebalance bench --scenario crash --group-protocol both --bootstrap-servers localhost:9092
""",
    )
    int_list, float_list, count = a.number_list(int, 1), a.number_list(float, 0), a.number(int, 1)
    a.option(p, "--backlogs", d.backlogs, int_list, "B,...",
             "recovery backlog sizes, records (default: {})")
    a.option(p, "--work-us", d.work_us, float_list, "W,...",
             "work per record, microseconds (default: {})")
    a.option(p, "--reps", d.reps, count, "N",
             "repetitions of every recovery run (and group run); tables show medians "
             "(default: {})")
    a.option(p, "--steady-reps", d.steady_reps, count, "N",
             "repetitions of every steady-state run (default: {})")
    a.option(p, "--duration", d.duration_s, a.positive(), "SECONDS",
             "fresh-latency window after each restart; each recovery run lasts at least "
             "this long (default: {})")
    a.rate(p, d.rate, "fresh records per second (default: {})")
    a.partitions(p, d.partitions, "partitions of each benchmark topic (default: {})")
    a.option(p, "--throughput-records", d.throughput_records, count, "N",
             "records each steady-state run reads (default: {})")
    p.add_argument("--scenario", choices=("all", "recovery", "steady", "group", "crash"),
                   default="all",
                   help="which scenario to run (default: all = steady and recovery; group: "
                   "group-wide catch-up, 1-4 member processes, python -m "
                   "fastrebalance.tools.groupbench run --help; crash: from a SIGKILL to the "
                   "restarted process's first fresh record, dead-member removal on and off, "
                   "on the real broker --bootstrap-servers names, one --work-us value, "
                   "200 us and 1,000 records/s unless given)")
    p.add_argument("--group-protocol", choices=(*GROUP_PROTOCOLS, "both"),
                   default=d.group_protocol,
                   help="group.protocol of every measured consumer, plain and fastrebalance "
                   "(default: classic; consumer: KIP-848, Apache Kafka 4 or the embedded "
                   "cluster; the session and heartbeat are then the broker's; both: "
                   "--scenario crash only). Not for --scenario group")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one; the benchmark "
                        "topics and groups are deleted afterwards")
    a.timeout(p, d.run_timeout_s, "give up on a run after this long; undelivered records "
              "count as lost (default: {})")
    a.report_files(p)
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw each fresh record's latency after the restart, per "
                   "backlog and consumer, as a PNG (recovery scenario; needs matplotlib: "
                   "pip install 'fastrebalance[plot]')")  # fmt: skip
    p.set_defaults(func=_command)


def settings_from_args(args: argparse.Namespace) -> tuple[BenchSettings, str]:
    """What ``fastrebalance bench`` runs, and the command that reproduces it, every option
    spelled out (the group protocol too), for the report's first line."""
    options = ("scenario", "backlogs", "work_us", "reps", "steady_reps", "duration", "rate",
               "partitions", "throughput_records", "group_protocol",
               "bootstrap_servers")  # fmt: skip
    same = {k: getattr(args, k) for k in options if k in BenchSettings.__dataclass_fields__}
    scenarios = ("steady", "recovery") if args.scenario == "all" else (args.scenario,)
    settings = BenchSettings(**same, duration_s=args.duration, scenarios=scenarios,
                             run_timeout_s=args.timeout,
                             keep_samples=bool(getattr(args, "plot", None)))  # fmt: skip
    return settings, " ".join(["fastrebalance bench", *a.spelled(args, options)])


def _command(args: argparse.Namespace) -> int:
    if args.scenario == "crash":
        from .crashbench import run_from_args as crash

        return crash(args)
    if args.group_protocol == "both":
        print("fastrebalance bench: --group-protocol both is for --scenario crash",
              file=sys.stderr)  # fmt: skip
        return a.EXIT_USAGE
    if args.scenario == "group":
        if args.group_protocol != BenchSettings.group_protocol:
            # groupbench sets its members' config itself: a silently ignored option would
            # make a classic table read as a consumer-protocol one
            print("fastrebalance bench: --group-protocol does not apply to --scenario group",
                  file=sys.stderr)  # fmt: skip
            return a.EXIT_USAGE
        from .groupbench import run_from_args

        return run_from_args(args)
    if args.plot:
        if args.scenario not in ("all", "recovery"):
            print("fastrebalance bench: --plot draws the recovery scenario's runs: "
                  "--scenario recovery or all", file=sys.stderr)  # fmt: skip
            return a.EXIT_USAGE
        from ._plot import require_matplotlib

        require_matplotlib()  # now, not after minutes of runs
    settings, command = settings_from_args(args)
    print(f"fastrebalance bench: {command}\n", flush=True)
    result = run_bench(settings, out=lambda line: print(line, flush=True))
    a.write_report(args, format_markdown(result, command), result)
    if args.plot:
        print(f"latency plot: {write_plot(result, args.plot)}", flush=True)
    return a.EXIT_OK if result.ok else a.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(_runner.worker_main({"recovery": _worker_recovery, "throughput": _worker_throughput}))
