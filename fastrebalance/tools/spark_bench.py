"""``fastrebalance bench-spark``: the Spark source's restart to the first fresh record, and
its live latency at scale (what each measures: the command's help; results: docs/spark.md).

The restart's job is a realistic micro-batch: parse the JSON value, append to parquet, count
per batch. Each batch that carried backlog is timed (Spark's own ``triggerExecution``) next
to the restart batch, which carries a few live records and is therefore almost pure fixed
cost. The modes run interleaved and the table shows medians, so that load from other jobs
hits every mode alike; a warm-up run comes first and is not reported, or the JVM would bill
its JIT compilation to one mode (measured: a 20,000-record catch-up restart took 9.2 s as the
first run of a session, 4.5 s as the second).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Producer

from ..testing._chaos_check import percentiles
from ..testing._sparkpython import local_driver_conf
from ..testing._workload import PacedProducer, watermarks
from . import _args as a
from ._plot import Curve, CurvePanel
from ._runner import Session, div, md_table, median, ratio

MODES: dict[str, dict[str, str]] = {
    # KIP-333 catch-up with the default budgets
    "catchup": {},
    # the defaults before issue 13: 100,000 backlog records per batch, whatever the batch costs,
    # in tasks of 25,000
    "catchup-100k": {"catchup.maxOffsetsPerTrigger": "100000", "catchup.chunkSize": "25000"},
    # the adaptive budget with the task size before issue 13: the cost of many small tasks
    "catchup-25k-tasks": {"catchup.chunkSize": "25000"},
    # a smaller backlog budget per batch: live records wait less, the backlog takes longer
    "catchup-40k": {"catchup.maxOffsetsPerTrigger": "40000", "catchup.chunkSize": "10000"},
    # backlog batches aimed at 10 s, the default before issue 33's round 3: more batches, each
    # with the job's fixed cost, and live records that wait less meanwhile
    "catchup-10s": {"catchup.targetBatchDurationMs": "10000"},
    # Spark's usual in-order reading, no limit: the first batch after restart is the backlog
    "plain": {"catchup.enabled": "false"},
    # Spark's usual in-order reading with a per-batch budget
    "plain-limited": {"catchup.enabled": "false", "maxOffsetsPerTrigger": "100000"},
}
#: The mode the others are compared with: Spark's usual reading, the whole backlog at once.
BASELINE = "plain"


class Batch(NamedTuple):
    id: int
    at: float  #: when the sink had it (time.time())
    #: kind ("old", "backlog", "fresh"; a "*" suffix when read as backlog) -> (records, oldest
    #: sent_ms). Fresh records sent between the restart and the source's first look at the
    #: log end are part of the backlog, hence "fresh*".
    kinds: dict[str, tuple[int, int]]

    def count(self, kind: str) -> int:
        return sum(n for k, (n, _) in self.kinds.items() if k.rstrip("*") == kind)


@dataclass
class Result:
    """One restart, in seconds from it."""

    first_fresh_s: float
    drained_s: float
    worst_fresh_age_s: float
    restart_batch_s: float
    drain_batches: list[float]  #: the duration of each batch that carried backlog records
    #: after each batch of the restart: (seconds from it, backlog records, live records) in
    #: the sink, what --plot draws
    sink: list[tuple[float, int, int]] = field(default_factory=list)


def _value(kind: str, seq: int) -> bytes:
    doc = {"kind": kind, "seq": seq, "sent_ms": int(time.time() * 1000), "customer": f"c{seq % 97}"}
    return json.dumps({**doc, "amount": seq % 1000 + 0.5}).encode()


def _produce(bootstrap: str, topic: str, partitions: int, count: int, kind: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for i in range(count):
        while True:
            try:
                p.produce(topic, value=_value(kind, i), partition=i % partitions)
                break
            except BufferError:
                # The queue fills when the broker lags, or while librdkafka's metadata briefly
                # has fewer partitions than the topic (seen on a loaded machine: "partition
                # count changed from 64 to 4"): wait for deliveries instead of failing the run.
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("producer could not flush")


class _Live(PacedProducer):
    """Live records in the job's JSON, round-robin over the partitions, or each to a random
    one (``spread``)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float,
                 spread: bool = False) -> None:  # fmt: skip
        super().__init__({"bootstrap.servers": bootstrap, "linger.ms": 0}, rate, "live")
        self.topic, self.partitions, self.spread = topic, partitions, spread

    def record(self, seq: int) -> tuple[str, int, bytes]:
        where = random.randrange(self.partitions) if self.spread else seq % self.partitions
        return self.topic, where, _value("fresh", seq)


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 20 ms (it reads counters only); TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        time.sleep(0.02)
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")


def _query(spark: Any, session: Session, topic: str, sink: Callable[[Any, int], None],
           checkpoint: str, options: dict[str, str] | None = None) -> Any:  # fmt: skip
    """A query of ``topic``, each batch to ``sink`` (``foreachBatch``)."""
    options = {"kafka.bootstrap.servers": session.bootstrap, "subscribe": topic,
               "kafka.fetch.wait.max.ms": "10", **(options or {})}  # fmt: skip
    reader = spark.readStream.format("fastrebalance").options(**options)
    stream = reader.load().writeStream.foreachBatch(sink)
    return stream.option("checkpointLocation", checkpoint).start()


def _durations(query: Any) -> dict[int, float]:
    """Spark's triggerExecution (s) of each batch that read records."""
    return {p["batchId"]: p["durationMs"].get("triggerExecution", 0) / 1000
            for p in query.recentProgress if p["numInputRows"]}  # fmt: skip


def run_mode(
    spark: Any, session: Session, mode: str, backlog: int, partitions: int, rate: float,
    workdir: str,
) -> Result:  # fmt: skip
    from pyspark.sql import functions as F

    bootstrap = session.bootstrap
    topic = session.topic(f"-{mode}-{uuid.uuid4().hex[:6]}", partitions)
    out, checkpoint = os.path.join(workdir, topic, "out"), os.path.join(workdir, topic, "ck")
    options = {"startingOffsets": "earliest", **MODES[mode]}
    schema = "kind string, seq long, sent_ms long, customer string, amount double"
    batches: list[Batch] = []

    def sink(df: Any, batch_id: int) -> None:
        value = F.from_json(F.col("value").cast("string"), schema).alias("v")
        parsed = df.select("partition", "offset", "catchup", value)
        parsed = parsed.select("partition", "offset", "catchup", "v.*").persist()
        parsed.write.mode("append").parquet(out)
        rows = parsed.groupBy("kind", "catchup").agg(
            F.count("*").alias("n"), F.min("sent_ms").alias("oldest")
        )
        kinds = {r.kind + "*" * r.catchup: (r.n, r.oldest) for r in rows.collect()}
        parsed.unpersist()
        batches.append(Batch(batch_id, time.time(), kinds))

    def count(kind: str) -> int:
        return sum(b.count(kind) for b in batches)

    _produce(bootstrap, topic, partitions, 1000, "old")
    q = _query(spark, session, topic, sink, checkpoint, options)
    _wait(lambda: count("old") >= 1000, 120, f"{mode}: the first records")
    q.processAllAvailable()  # committed too: a stop before the commit would replay the batch
    q.stop()
    _produce(bootstrap, topic, partitions, backlog, "backlog")
    stored = sum(hi - lo for lo, hi in watermarks(session.probe, topic, partitions))
    if stored != 1000 + backlog:
        raise RuntimeError(f"retention dropped records: {stored} stored of {1000 + backlog}")

    live = _Live(bootstrap, topic, partitions, rate)
    restart_wall = time.time()
    live.start()
    seen = len(batches)
    q = _query(spark, session, topic, sink, checkpoint, options)
    try:
        _wait(lambda: count("backlog") >= backlog and count("fresh") > 0, 600,
              f"{mode}: the backlog")  # fmt: skip
        live.stop()
        _wait(lambda: count("fresh") >= live.sent, 120, f"{mode}: the live records")
    finally:
        live.stop()
        q.stop()
    durations, after = _durations(q), batches[seen:]
    first_fresh = next(b for b in after if b.count("fresh"))
    drained_s, drain_batches, drained = math.nan, [], 0
    for b in after:
        if b.count("backlog"):
            drain_batches.append(durations.get(b.id, math.nan))
        drained += b.count("backlog")
        if drained >= backlog:
            drained_s = b.at - restart_wall
            break
    # how stale the live stream got while the backlog was being read
    live_batches = [b for b in after if "fresh" in b.kinds]
    during = [b for b in live_batches if b.at - restart_wall <= drained_s + 1e-9]
    worst = max(b.at - b.kinds["fresh"][1] / 1000 for b in during or live_batches[:1])
    restart_batch_s = durations.get(after[0].id, math.nan)
    return Result(first_fresh.at - restart_wall, drained_s, worst, restart_batch_s,
                  drain_batches, sink_over_time(after, restart_wall))  # fmt: skip


def sink_over_time(batches: Sequence[Batch], since: float) -> list[tuple[float, int, int]]:
    """The backlog and live records in the sink after each batch, cumulated: where a table
    gives the moment the backlog was in, this shows how each mode got there (batches of
    backlog beside live ones, or one long batch of everything)."""
    points, backlog, live = [], 0, 0
    for b in sorted(batches, key=lambda b: b.at):
        backlog += b.count("backlog")
        live += b.count("fresh")
        points.append((b.at - since, backlog, live))
    return points


def sink_panels(runs: Mapping[str, Sequence[Result]]) -> list[CurvePanel]:
    """What --plot draws: each mode's first measured run (a run, not a blend of runs: its
    points belong together), backlog and live records in two panels."""
    first = {mode: rs[0] for mode, rs in runs.items() if rs}
    return [
        CurvePanel("backlog records in the sink", "records",
                   [Curve(m, [(t, b) for t, b, _ in r.sink]) for m, r in first.items()]),
        CurvePanel("live records in the sink", "records",
                   [Curve(m, [(t, f) for t, _, f in r.sink]) for m, r in first.items()]),
    ]  # fmt: skip


def _spread(values: Iterable[float]) -> str:
    """``median (min-max)``, or the one value."""
    ok = [v for v in values if not math.isnan(v)]
    if len(ok) < 2:
        return f"{ok[0]:.1f} s" if ok else "-"
    return f"{statistics.median(ok):.1f} s ({min(ok):.1f}-{max(ok):.1f})"


#: The columns of the restart table (``_row``).
HEADER = ["mode", "restart → first fresh record in the sink", "backlog fully in the sink",
          f"÷ {BASELINE}", "batches with backlog", "each backlog batch", "restart batch",
          "oldest live record while the backlog is read"]  # fmt: skip


def _row(mode: str, runs: Sequence[Result], base: Sequence[Result]) -> list[str]:
    """A mode's row: medians over its runs, and its drain time against the baseline's runs.

    The ratio is of the medians; the range in brackets is of the ratios within each repeat
    (a mode against the baseline run just before or after it, under similar load).
    """
    drained = [r.drained_s for r in runs]
    against = ratio(div(median(drained), median(b.drained_s for b in base)))
    paired = [r.drained_s / b.drained_s for r, b in zip(runs, base, strict=False)]
    if len(paired) > 1 and mode != BASELINE:
        against += f" ({min(paired):.2f}-{max(paired):.2f})"
    counts = "/".join(str(n) for n in sorted(len(r.drain_batches) for r in runs))
    return [mode, _spread(r.first_fresh_s for r in runs), _spread(drained), against,
            counts, _spread(d for r in runs for d in r.drain_batches),
            _spread(r.restart_batch_s for r in runs),
            _spread(r.worst_fresh_age_s for r in runs)]  # fmt: skip


def _line(header: Sequence[str], row: Sequence[str]) -> str:
    """One run's row as a progress line, each cell after its column's name."""
    cells = ", ".join(f"{h} {c}" for h, c in zip(header[1:], row[1:], strict=True))
    return f"{header[0]} {row[0]}: {cells}"


@dataclass
class ScaleResult:
    latencies_ms: list[float]
    batch_s: list[float]
    plan_ms: list[float]
    list_offsets_per_broker: list[int]


def measure_planning(bootstrap: str, topic: str, calls: int = 10) -> tuple[list[float], list[int]]:
    """The driver's fetch of every log end, as one planning call makes it: time, and the
    ListOffsets requests per broker (librdkafka statistics, which count what was sent)."""
    from fastrebalance.spark._fetcher import OffsetFetcher
    from fastrebalance.spark._options import parse_options

    stats: dict[str, dict[str, int]] = {}

    def on_stats(raw: str) -> None:
        brokers = json.loads(raw)["brokers"].items()
        stats["req"] = {name: broker.get("req", {}).get("ListOffsets", 0)
                        for name, broker in brokers if broker.get("nodeid", -1) >= 0}  # fmt: skip

    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    fetcher = OffsetFetcher(options)
    consumer = Consumer(
        {**options.consumer_config("bench"), "statistics.interval.ms": 50, "stats_cb": on_stats}
    )
    fetcher._consumer = consumer  # the same calls, on a client whose statistics we read
    took: list[float] = []
    per_broker: list[int] = []
    try:
        fetcher.marks(refresh=True, lows=True)
        for _ in range(calls):
            consumer.poll(0.2)
            before = dict(stats.get("req", {}))
            began = time.perf_counter()
            fetcher.marks(refresh=True)
            took.append((time.perf_counter() - began) * 1000)
            consumer.poll(0.2)
            after = stats.get("req", {})
            per_broker = sorted(after[b] - before.get(b, 0) for b in after)
    finally:
        fetcher.close()
    return took, per_broker


def run_scale(
    spark: Any, session: Session, partitions: int, rate: float, seconds: float, workdir: str
) -> ScaleResult:
    """Light live traffic on a topic of ``partitions``, each record to a random partition;
    the latency of every record that reaches the sink after a warm-up."""
    from pyspark.sql import functions as F

    bootstrap = session.bootstrap
    topic = session.topic(f"-scale-{partitions}-{uuid.uuid4().hex[:6]}", partitions)
    latencies: list[float] = []
    measuring = threading.Event()
    seen = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select(F.get_json_object(F.col("value").cast("string"), "$.sent_ms")).collect()
        now_ms = time.time() * 1000
        seen[0] += len(rows)
        if measuring.is_set():
            latencies.extend(now_ms - int(r[0]) for r in rows)

    q = _query(spark, session, topic, sink, os.path.join(workdir, topic))
    live = _Live(bootstrap, topic, partitions, rate, spread=True)
    try:
        _wait(lambda: bool(q.recentProgress), 120, "batch 0")  # the start is fixed
        live.start()
        time.sleep(min(10.0, seconds / 3))  # warm-up
        seen[0], sent = 0, live.sent
        measuring.set()
        time.sleep(seconds)
        live.stop()
        deadline = time.monotonic() + 60
        while seen[0] < live.sent - sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        live.stop()
        q.stop()
    plan_ms, per_broker = measure_planning(bootstrap, topic)
    return ScaleResult(latencies, list(_durations(q).values()), plan_ms, per_broker)


def _scale_header(base: int) -> list[str]:
    return ["partitions", "records", "produce → sink p50", "p99", "max",
            f"p99 ÷ {base} partitions", "batch duration", "planning call",
            "ListOffsets requests per broker"]  # fmt: skip


def _scale_row(partitions: int, runs: Sequence[ScaleResult], base_p99: float | None) -> list[str]:
    """A size's row: the latency of all its runs' records, its p99 against the base size's."""
    lat = percentiles([x for r in runs for x in r.latencies_ms], (50, 99))
    plan_ms = statistics.median(x for r in runs for x in r.plan_ms)
    return [str(partitions), f"{lat['n']}", f"{lat['p50']:.0f} ms",
            f"{lat['p99']:.0f} ms", f"{lat['max']:.0f} ms", ratio(div(lat["p99"], base_p99)),
            _spread(x for r in runs for x in r.batch_s), f"{plan_ms:.0f} ms",
            str(runs[-1].list_offsets_per_broker)]  # fmt: skip


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "bench-spark",
        "benchmark the Spark source: restart to the first fresh record, live latency at scale",
        (
            "restart: for each mode, a query reads a topic and is stopped, a backlog piles up, "
            "live traffic starts and the query restarts from its checkpoint. Measured: when "
            "the first live record reaches the sink, when the whole backlog has, how stale "
            "the live records got meanwhile, and the batches that carried the backlog.",
            "--scale: a query with the quick start's options on topics of each size under "
            "light live traffic: produce-to-sink latency, and what one planning call costs "
            "the driver (its time, its ListOffsets requests per broker).",
            "Modes run interleaved, a warm-up run first (not reported). Needs pyspark; runs "
            "on an embedded Kafka unless --bootstrap-servers names a cluster.",
        ),
        """\
examples:
  fastrebalance bench-spark --backlog 500000 --repeat 3
  fastrebalance bench-spark --backlog 500000 --repeat 3 --modes catchup,catchup-25k-tasks,plain
  fastrebalance bench-spark --scale 4,1000 --seconds 60 --repeat 2
  fastrebalance bench-spark --backlog 2000000 --partitions 8 --modes catchup,plain --plot sink.png
""",
    )
    a.option(p, "--backlog", 500_000, a.number(int, 1), "N",
             "records piled up while the query is down (default: {})")
    a.partitions(p, 4, "partitions of each restart topic (default: {})")
    a.rate(p, 100.0, "live records per second (default: {})")
    a.option(p, "--modes", ("catchup", "plain", "plain-limited"), a.name_list(tuple(MODES)),
             "LIST", f"restart modes, any of {', '.join(MODES)} (default: {{}})")
    a.option(p, "--repeat", 1, a.number(int, 1), "N", "runs of each mode or size (default: {})")
    a.option(p, "--scale", (), a.number_list(int, 1), "P,...",
             "partitions mode: the topic sizes, e.g. 4,1000 (instead of the restart benchmark)")
    a.option(p, "--seconds", 60.0, a.positive(), "SECONDS", "partitions mode: per run "
             "(default: {})")
    a.bootstrap_servers(p, "a running broker (default: an embedded one)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw the backlog and live records in the sink over time after "
                   "the restart, each mode's first run, as a PNG (not with --scale; needs "
                   "matplotlib: pip install 'fastrebalance[plot]')")  # fmt: skip
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    if args.plot:
        if args.scale:
            print("fastrebalance bench-spark: --plot draws the restart runs, not --scale",
                  file=sys.stderr)  # fmt: skip
            return a.EXIT_USAGE
        from ._plot import require_matplotlib

        require_matplotlib()  # now, not after minutes of runs
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from fastrebalance.spark import register

    builder = SparkSession.builder.master("local[2]").appName("fastrebalance-bench")
    for key, value in (("spark.ui.enabled", "false"), ("spark.ui.showConsoleProgress", "false"),
                       ("spark.sql.shuffle.partitions", "2"),
                       *local_driver_conf("local[2]").items()):  # fmt: skip
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    workdir = tempfile.mkdtemp(prefix="fastrebalance-bench-")
    sizes = args.scale

    def run(item: Any, warm_up: bool = False) -> Any:
        """One run of a size (--scale) or a mode, and its line; the warm-up run is shorter."""
        if sizes:
            seconds = min(args.seconds, 15) if warm_up else args.seconds
            scaled = run_scale(spark, session, item, args.rate, seconds, workdir)
            return scaled, _line(_scale_header(item), _scale_row(item, [scaled], None))
        backlog = min(args.backlog, 200_000) if warm_up else args.backlog
        result = run_mode(spark, session, item, backlog, args.partitions, args.rate, workdir)
        return result, _line(HEADER, _row(item, [result], []))

    runs: dict[Any, list[Any]] = {item: [] for item in sizes or args.modes}
    try:
        with Session("spark", args.bootstrap_servers, out=None) as session:
            print("(warm-up) " + run((sizes or args.modes)[0], warm_up=True)[1], flush=True)
            for _ in range(args.repeat):
                for item in sizes or args.modes:
                    result, line = run(item)
                    runs[item].append(result)
                    print(line, flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    where = args.bootstrap_servers or "the embedded cluster"
    if sizes:
        print(f"\n{args.rate:g} live records/s on {where}, {args.seconds:g} s measured per run,"
              f" {args.repeat} run(s) per size\n")  # fmt: skip
        base_p99 = percentiles([x for r in runs[min(sizes)] for x in r.latencies_ms], (99,))
        rows = [_scale_row(n, rs, base_p99["p99"]) for n, rs in runs.items()]
        header = _scale_header(min(sizes))
    else:
        print(f"\nbacklog {args.backlog:,} records, {args.partitions} partitions,"
              f" {args.rate:g} live records/s on {where}; {args.repeat} run(s) per mode,"
              " median (range)\n")  # fmt: skip
        rows = [_row(m, rs, runs.get(BASELINE, [])) for m, rs in runs.items()]
        header = HEADER
    print("\n".join(md_table(header, rows, left=len(header))))
    if args.plot and not sizes:
        from ._plot import draw_curves

        title = (f"Restart with {args.backlog:,} backlog records over {args.partitions}"
                 f" partitions, {args.rate:g} live records/s")  # fmt: skip
        path = draw_curves(sink_panels(runs), args.plot, title, "seconds after the restart")
        print(f"sink plot: {path}", flush=True)
    return a.EXIT_OK


if __name__ == "__main__":
    sys.exit(a.run_alone(add_command, "bench-spark"))
