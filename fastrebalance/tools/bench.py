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

Every measured consumer runs in its own process (``python -m fastrebalance.tools.bench
--worker``): its peak RSS is its own, a previous run's garbage or threads cannot slow
the next one, and fastrebalance and confluent-kafka run exactly the same loop. The
parent owns the cluster, prepares each run's backlog right before it (so every run
sees the same kind of backlog: B records in large lz4 batches, not the previous run's
trickle of fresh records), and reads the watermarks to report the backlog the log
really held.

Thread ownership: the fresh producer's handle belongs to its own thread; every other
handle belongs to the thread that calls ``run_bench()`` (or to the worker process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from .workload import (
    FETCH_WAIT_MS,
    SESSION_TIMEOUT_MS,
    FreshProducer,
    RunResult,
    check_reachable,
    cleanup,
    format_duration,
    measure_restart,
    produce_backlog,
    set_group_offsets,
    watermarks,
)

__all__ = [
    "BenchResult",
    "BenchSettings",
    "RecoveryRun",
    "ThroughputRun",
    "format_markdown",
    "main",
    "run_bench",
    "write_plot",
]

Out = Callable[[str], None]

PLAIN, FAST = "plain", "fastrebalance"
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
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# ------------------------------------------------------------------ machine
def machine_info() -> dict[str, Any]:
    """What the numbers depend on: reported with them, since the machine is shared."""
    import confluent_kafka

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "platform": platform.platform(terse=True),
    }


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


# ------------------------------------------------------------------ workers
def _spawn(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one measured consumer in a fresh interpreter; returns its JSON answer."""
    env = dict(os.environ)
    # Run this very package even when it is not installed (benchmarks/run.py from a checkout).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "fastrebalance.tools.bench", "--worker"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"benchmark worker ({spec['kind']}) exited with code {proc.returncode}:"
            f" {proc.stderr.strip()[-2000:] or '(no stderr)'}"
        )
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def _peak_rss_kib() -> int:
    """This process's peak resident set, KiB.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec from the forked copy
    of the parent, so every worker would report at least the parent's size, which
    grows as the benchmark collects results.
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS


def _make_consumer(kind: str, conf: dict[str, Any]) -> Any:
    if kind in (PLAIN, RAW, TUNED):
        from confluent_kafka import Consumer as PlainConsumer

        return PlainConsumer({**conf, **TUNED_CONF} if kind == TUNED else conf)
    from .._consumer import Consumer as FastConsumer

    return FastConsumer({**conf, "enable.parallel.rebalance": kind in (FAST, ON)})


def _worker_recovery(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Consumer as PlainConsumer

    probe = PlainConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": "bench-probe"})
    try:
        base = _peak_rss_kib()
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
    return {"result": dataclasses.asdict(result), "rss_peak_kib": _peak_rss_kib(),
            "rss_base_kib": base}  # fmt: skip


def _worker_throughput(spec: dict[str, Any]) -> dict[str, Any]:
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
            for v in _alternate(variants, turn):
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


def _worker_main() -> int:
    spec = json.loads(sys.stdin.read())
    if spec["kind"] == "recovery":
        answer = _worker_recovery(spec)
    elif spec["kind"] == "throughput":
        answer = _worker_throughput(spec)
    else:
        raise ValueError(f"unknown worker kind {spec['kind']!r}")
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


def _result_from(d: dict[str, Any]) -> RunResult:
    d = dict(d)
    d["errors"] = tuple(d.get("errors") or ())
    d["samples"] = tuple(tuple(s) for s in d.get("samples") or ())
    return RunResult(**d)


# -------------------------------------------------------------------- the run
def _quiet(_line: str) -> None:
    pass


def _alternate(items: Sequence[str], turn: int) -> list[str]:
    """Rotate who goes first each time, so neither consumer always runs on the
    machine the other one just warmed up (or just loaded)."""
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


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
    from confluent_kafka import Consumer as PlainConsumer

    from ..testing import EmbeddedKafka, ExternalKafka

    s = settings or BenchSettings()
    emit = out or _quiet
    began = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    recovery_topic = f"fastrebalance-bench-{run_id}"
    steady_topic = f"fastrebalance-bench-{run_id}-steady"
    notes: list[str] = []
    recovery: list[RecoveryRun] = []
    throughput: list[ThroughputRun] = []
    groups: list[str] = []
    throughput_log = 0
    fresh_produced = failures = 0
    load_start = _loadavg()

    with ExitStack() as stack:
        owns_external = cluster is None and bool(s.bootstrap_servers)
        if cluster is None:
            if s.bootstrap_servers:
                cluster = stack.enter_context(ExternalKafka(s.bootstrap_servers))
            else:
                emit("starting an embedded Kafka (librdkafka's mock cluster)...")
                cluster = stack.enter_context(EmbeddedKafka())
        bootstrap = cluster.bootstrap_servers
        cluster_desc = f"{cluster.kind} cluster at {bootstrap}"
        check_reachable(bootstrap)
        probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{run_id}-p"})
        stack.callback(probe.close)

        def group(name: str) -> str:
            g = f"bench-{run_id}-{name}"
            groups.extend([g, f"{g}.catchup"])
            return g

        if "steady" in s.scenarios:
            cluster.create_topic(steady_topic, s.partitions)
            failures += produce_backlog(bootstrap, steady_topic, s.partitions, s.throughput_records)
            marks = watermarks(probe, steady_topic, s.partitions)
            throughput_log = sum(hi - lo for lo, hi in marks)
            emit(f"steady state: {throughput_log:,} records in {steady_topic}")
            if throughput_log < s.throughput_records:
                notes.append(
                    f"steady state: retention kept {throughput_log:,} of"
                    f" {s.throughput_records:,} records; each run reads what the log holds"
                )
            want = min(s.throughput_records, throughput_log)
            for rep in range(s.steady_reps):
                for loop in LOOPS:
                    spec = {
                        "kind": "throughput",
                        "bootstrap": bootstrap,
                        "topic": steady_topic,
                        "groups": {
                            v: group(f"tp-{loop}-{v.replace(' ', '')}-{rep}") for v in VARIANTS
                        },
                        "variants": _alternate(VARIANTS, rep),
                        "loop": loop,
                        "records": want,
                        "poll_timeout_s": s.poll_timeout_s,
                        "run_timeout_s": s.run_timeout_s,
                    }
                    got = _spawn(spec, s.run_timeout_s + _WORKER_GRACE_S)["variants"]
                    for variant in VARIANTS:
                        run = ThroughputRun(
                            loop, variant, rep, got[variant]["records"], got[variant]["seconds"]
                        )
                        throughput.append(run)
                        emit(
                            f"[steady {rep + 1}/{s.steady_reps}] {loop:7} {variant:8}"
                            f" {run.per_s:>10,.0f} records/s ({run.records:,} in"
                            f" {run.seconds:.2f} s)"
                        )

        if "recovery" in s.scenarios:
            cluster.create_topic(recovery_topic, s.partitions)
            fresh = FreshProducer(bootstrap, recovery_topic, s.partitions, s.rate)
            fresh.start()
            stack.callback(fresh.stop)
            emit(
                f"recovery: {recovery_topic}, {s.partitions} partitions,"
                f" {s.rate:g} fresh records/s throughout"
            )

            def one(asked: int, work_us: float, rep: int, consumer: str) -> None:
                nonlocal failures
                if asked:
                    failures += produce_backlog(bootstrap, recovery_topic, s.partitions, asked)
                marks = watermarks(probe, recovery_topic, s.partitions)
                share = _per_partition(asked, s.partitions)
                start = [max(lo, hi - n) for (lo, hi), n in zip(marks, share, strict=True)]
                prepared = sum(hi - st for (_lo, hi), st in zip(marks, start, strict=True))
                g = group(f"r{asked}-w{work_us:g}-{rep}-{consumer}")
                set_group_offsets(bootstrap, recovery_topic, g, start)
                spec = {
                    "kind": "recovery",
                    "consumer": consumer,
                    "bootstrap": bootstrap,
                    "topic": recovery_topic,
                    "group": g,
                    "start": start,
                    "work_us": work_us,
                    "tail_s": s.tail_s,
                    "run_timeout_s": s.run_timeout_s,
                    "window_s": s.duration_s,
                }
                got = _spawn(spec, s.run_timeout_s + _WORKER_GRACE_S)
                run = RecoveryRun(
                    asked=asked,
                    work_us=work_us,
                    rep=rep,
                    consumer=consumer,
                    prepared=prepared,
                    result=_result_from(got["result"]),
                    rss_peak_kib=got["rss_peak_kib"],
                    rss_base_kib=got["rss_base_kib"],
                )
                recovery.append(run)
                emit(f"[recovery {rep + 1}/{s.reps}] " + _run_line(run))

            turn = 0
            for rep in range(s.reps):
                for work_us in s.work_us:
                    one(0, work_us, rep, FAST)
                    for asked in s.backlogs:
                        for consumer in _alternate(RECOVERY_CONSUMERS, turn):
                            one(asked, work_us, rep, consumer)
                        turn += 1
            fresh.stop()
            if fresh.error is not None:
                raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
            fresh_produced = fresh.produced
            failures += fresh.failures
        if failures:
            notes.append(f"{failures:,} records failed to produce")
        if owns_external:
            cleanup(bootstrap, [recovery_topic, steady_topic], groups)

    load_end = _loadavg()
    machine = machine_info()
    machine["loadavg_start"] = load_start
    machine["loadavg_end"] = load_end
    return BenchResult(
        settings=s,
        cluster=cluster_desc,
        machine=machine,
        recovery=tuple(recovery),
        throughput=tuple(throughput),
        throughput_log=throughput_log,
        fresh_produced=fresh_produced,
        produce_failures=failures,
        wall_s=time.monotonic() - began,
        notes=tuple(notes),
    )


# ----------------------------------------------------------------- printing
def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


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


def _median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _group_runs(result: BenchResult) -> dict[tuple[int, float, str], list[RecoveryRun]]:
    out: dict[tuple[int, float, str], list[RecoveryRun]] = {}
    for run in result.recovery:
        out.setdefault((run.asked, run.work_us, run.consumer), []).append(run)
    return out


def _by_rep(runs: Sequence[RecoveryRun]) -> dict[int, RunResult]:
    return {r.rep: r.result for r in runs}


def paired_ratio(
    top: Sequence[RecoveryRun],
    bottom: Sequence[RecoveryRun],
    metric: Callable[[RunResult], float | None],
) -> float | None:
    """Median over the repetitions of top/bottom, each pair from the same repetition.

    The two runs of a pair ran minutes apart at most, under the same load from the
    rest of the machine; a ratio of medians could pair a quiet run with a busy one.
    """
    b = _by_rep(bottom)
    return _median(_div(metric(t.result), metric(b[t.rep])) for t in top if t.rep in b)


def better_plain_drain(
    fast: Sequence[RecoveryRun], plain: Sequence[RecoveryRun], tuned: Sequence[RecoveryRun]
) -> float | None:
    """The drain target's ratio: fastrebalance against the faster of the two plain
    consumers of the same repetition (defaults, or tuned like the child), so that a
    fetch setting the child has and plain lacks cannot pass for the design's gain."""
    p, t = _by_rep(plain), _by_rep(tuned)

    def best(rep: int) -> float | None:
        times = [x for x in (_drain(p[rep]) if rep in p else None,
                             _drain(t[rep]) if rep in t else None) if x]  # fmt: skip
        return min(times) if times else None

    return _median(_div(_drain(f.result), best(f.rep)) for f in fast)


def steady_p99(result: BenchResult, work_us: float) -> float | None:
    """Median p99 of fastrebalance restarted without a backlog: the reference."""
    runs = _group_runs(result).get((0, work_us, FAST), [])
    return _median(r.result.fresh_p99_s for r in runs)


def _p99(r: RunResult) -> float | None:
    return r.fresh_p99_s


def _drain(r: RunResult) -> float | None:
    return r.backlog_done_s


def _first(r: RunResult) -> float | None:
    return r.first_fresh_s


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> list[str]:
    align = ["---"] * min(right, len(header)) + ["--:"] * max(0, len(header) - right)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _recovery_tables(result: BenchResult) -> list[str]:
    s = result.settings
    runs = _group_runs(result)
    lines = [
        f"### Recovery: restart with a backlog of B records, {s.partitions} partitions,"
        f" {s.rate:g} fresh records/s",
        "",
    ]
    header = ["B asked", "W µs", "consumer", "backlog at restart", "first fresh", "fresh p50",
              "fresh p99", "fresh max", "fresh via child", "p99 ÷ steady p99",
              "backlog delivered", "records/s", "peak RSS", "close()", "lost"]  # fmt: skip
    rows = []
    for (asked, work_us, consumer), group in sorted(
        runs.items(),
        key=lambda kv: (kv[0][1], kv[0][0], RECOVERY_CONSUMERS.index(kv[0][2])),
    ):
        res = [r.result for r in group]
        steady = runs.get((0, work_us, FAST), [])
        rps = _median(r.records_per_s for r in res)
        rss = _median(r.rss_peak_kib for r in group) or 0.0
        rows.append(
            [
                "0 (steady)" if asked == 0 else f"{asked:,}",
                f"{work_us:g}",
                consumer,
                f"{_median(r.backlog for r in res) or 0:,.0f}",
                format_duration(_median(r.first_fresh_s for r in res)),
                format_duration(_median(r.fresh_p50_s for r in res)),
                format_duration(_median(r.fresh_p99_s for r in res)),
                format_duration(_median(r.fresh_max_s for r in res)),
                f"{_median(r.fresh_out_of_order for r in res) or 0:,.0f}",
                _ratio(paired_ratio(group, steady, _p99)) if asked else "-",
                format_duration(_median(r.backlog_done_s for r in res)) if asked else "-",
                f"{rps:,.0f}" if rps and asked else "-",
                f"{rss / 1024:.0f} MiB",
                format_duration(_median(r.close_s for r in res)),
                f"{sum(r.lost for r in res):,}",
            ]
        )
    lines += _md_table(header, rows, right=3)
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
            p99_ratio = paired_ratio(fast, steady, _p99)
            drain = paired_ratio(fast, plain, _drain)
            drain_tuned = paired_ratio(fast, tuned, _drain) if tuned else None
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
                    _ratio(p99_ratio),
                    _ratio(paired_ratio(plain, steady, _p99)),
                    _ratio(drain),
                    _ratio(drain_tuned),
                    _ratio(best),
                    _ratio(paired_ratio(plain, fast, _first)),
                    " ".join(met) or "-",
                ]
            )
    lines += _md_table(header, rows, right=2)
    base = _median(r.rss_base_kib for r in result.recovery) or 0.0
    lines += [
        "",
        f"Fresh records: produced after the restart (the consumer's construction) and"
        f" within the first {s.duration_s:g} s; latency = delivery - produce time."
        " Fresh via child: of those, the ones produced before fastrebalance read the log"
        " end (during the join), which lie below where its primary starts, so its child"
        " delivers them after the backlog. Steady p99: fastrebalance restarted with no"
        " backlog, same W, same producer, same repetition. W µs of busy work per record;"
        " 100-byte records; backlog written in lz4 batches right before each run."
        " records/s: deliveries until the backlog was delivered ÷ time from the restart"
        f" (join included). Peak RSS: the whole worker process (VmHWM); its base (Python"
        f" + libraries, before the consumer) was {base / 1024:.0f} MiB. close(): the"
        " consumer's close() after the run (commits, leaving the group), not part of any"
        " other column. lost: records below the final log end never delivered (must be 0)."
        f" plain tuned: plain confluent-kafka with the child's fetch setting"
        f" ({', '.join(f'{k}={v}' for k, v in TUNED_CONF.items())}; librdkafka's default is"
        " 1000): the drain against plain (defaults) mixes configuration and design,"
        " against plain tuned it is the design alone; the target is against the better"
        " of the two.",
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
        rate = {v: _median(t.per_s for t in runs if t.variant == v) for v in VARIANTS}
        raw = {t.rep: t.per_s for t in runs if t.variant == RAW}
        ratio = {
            v: _median(_div(t.per_s, raw.get(t.rep)) for t in runs if t.variant == v)
            for v in (OFF, ON)
        }
        met = []
        for name, variant in (("off", OFF), ("on", ON)):
            value = ratio[variant]
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
            + [_ratio(ratio[OFF]), _ratio(ratio[ON]), " ".join(met) or "-"]
        )
    lines += _md_table(header, rows)
    lines += [
        "",
        "Targets: mode on ≥ 0.95x raw poll() and consume(); mode off ≥ 0.98x."
        " Ratios: the median over the repetitions of the ratio within one repetition."
        " Each repetition is one process holding the three variants, each a new group"
        " reading the whole topic from the start (no committed offset: no catch-up),"
        f" read in turns of {BLOCK:,} records, the first variant rotating: what the"
        " machine does meanwhile falls on all three alike (run in separate processes,"
        " the same bound method measured 0.86M and 1.34M records/s minutes apart)."
        " Mode off is confluent-kafka's own bound methods: its ratio shows the noise"
        " left. The loop only skips errors and counts. fetch.queue.backoff.ms="
        f"{THROUGHPUT_FETCH_BACKOFF_MS} for every variant, and the turns begin"
        f" {PREFETCH_S:g} s per handle after the first records, once librdkafka has"
        " fetched the whole topic into every queue: what is timed is the per-call cost"
        " of the consumer, fetching excluded.",
        "",
    ]
    return lines


def format_markdown(result: BenchResult, command: str | None = None) -> str:
    """The tables (medians over the repetitions), their targets and a legend, as Markdown."""
    s = result.settings
    m = result.machine
    lines: list[str] = []
    if command:
        lines += [f"Command: `{command}`", ""]
    load = " → ".join(
        ", ".join(f"{x:.2f}" for x in la) for la in (m["loadavg_start"], m["loadavg_end"]) if la
    )
    lines += [
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['platform']}, Python {m['python']},"
        f" confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']};"
        f" load average (1, 5, 15 min) {load}. Cluster: {result.cluster}.",
        f"Recovery: medians of {s.reps} repetition(s); the consumers alternate which runs"
        " first."
        f" Wall time {result.wall_s / 60:.1f} min.",
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


def result_json(result: BenchResult) -> str:
    """Every run's raw measurements, for later analysis."""
    return json.dumps(dataclasses.asdict(result), indent=1, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    """``benchmarks/run.py``'s entry: the same options and exit codes as
    ``fastrebalance bench``, because it is that command."""
    from .cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker_main())
    sys.exit(main())
