"""``fastrebalance bench-spark``: the Spark source's restart to the first fresh record, and
its live latency at scale.

    fastrebalance bench-spark --backlog 500000 --repeat 3
    python -m fastrebalance.tools.spark_bench --scale 4,1000 --repeat 2   # the same command

On the embedded cluster, or on any broker with ``--bootstrap-servers``.

For each mode: a query reads a topic and is stopped, a backlog piles up, live traffic starts
and the query restarts from its checkpoint. Measured from the restart: when the first live
record reaches the sink, when the whole backlog has, and how stale the live records got
meanwhile. The job is a realistic micro-batch: parse the JSON value, append to parquet,
count per batch.

The catch-up pays for its fresh first batch with extra micro-batches, so the report breaks
the drain down: how many batches carried backlog and what each cost (Spark's own
``triggerExecution``), next to the restart batch, which carries a few live records and is
therefore almost pure fixed cost. The modes run interleaved and the table shows medians, so
that load from other jobs on a shared machine hits every mode alike. A warm-up run comes
first and is not reported: the JVM would otherwise bill its JIT compilation to one mode.

The partitions mode (``--scale``) runs a query with the quick start's options on topics of
each size under light live traffic, and reports produce-to-sink latency (p50, p99, max) next
to what one planning call costs the driver: its time, and the ListOffsets requests it sends
per broker, counted by librdkafka's own statistics.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from ..testing._workload import PacedProducer, watermarks
from . import _args as a
from ._runner import Session, md_table

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
    # Spark's usual in-order reading, no limit: the first batch after restart is the backlog
    "plain": {"catchup.enabled": "false"},
    # Spark's usual in-order reading with a per-batch budget
    "plain-limited": {"catchup.enabled": "false", "maxOffsetsPerTrigger": "100000"},
}
#: The mode the others are compared with: Spark's usual reading, the whole backlog at once.
BASELINE = "plain"


@dataclass
class BatchStats:
    batch_id: int
    at: float
    # kind ("old", "backlog", "fresh"; a "*" suffix when read as backlog) -> (records, oldest
    # sent_ms). Fresh records sent between the restart and the source's first look at the log
    # end are part of the backlog, hence "fresh*".
    kinds: dict[str, tuple[int, int]]

    @property
    def backlog(self) -> int:
        return self.kinds.get("backlog", (0, 0))[0] + self.kinds.get("backlog*", (0, 0))[0]


@dataclass
class Result:
    mode: str
    backlog: int
    first_fresh_s: float = math.nan
    drained_s: float = math.nan
    worst_fresh_age_s: float = math.nan
    # the batches after the restart, up to the one that completed the backlog
    batches: list[BatchStats] = field(default_factory=list)
    # Spark's triggerExecution (s) per batch id of the restarted query
    durations: dict[int, float] = field(default_factory=dict)

    @property
    def restart_batch_s(self) -> float:
        return self.durations.get(self.batches[0].batch_id, math.nan) if self.batches else math.nan

    @property
    def drain_batches(self) -> list[float]:
        """Duration of each batch that carried backlog records."""
        return [self.durations.get(b.batch_id, math.nan) for b in self.batches if b.backlog]

    def line(self) -> str:
        drain = self.drain_batches
        return (
            f"{self.mode:14s} first fresh {self.first_fresh_s:6.2f}s  backlog done"
            f" {self.drained_s:6.2f}s  worst fresh age {self.worst_fresh_age_s:6.2f}s"
            f"  restart batch {self.restart_batch_s:5.2f}s  backlog in {len(drain)} batch(es)"
            f" [{' '.join(f'{d:.2f}' for d in drain)}]s"
        )


def _value(kind: str, seq: int) -> bytes:
    sent_ms = int(time.time() * 1000)
    doc = {"kind": kind, "seq": seq, "sent_ms": sent_ms, "customer": f"c{seq % 97}"}
    return json.dumps({**doc, "amount": seq % 1000 + 0.5}).encode()


def _produce(bootstrap: str, topic: str, partitions: int, count: int, kind: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for i in range(count):
        p.produce(topic, value=_value(kind, i), partition=i % partitions)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("producer could not flush")


class _Live(PacedProducer):
    """Live records in the job's JSON, round-robin over the partitions."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__({"bootstrap.servers": bootstrap, "linger.ms": 0}, rate, "live")
        self.topic, self.partitions = topic, partitions

    def record(self, seq: int) -> tuple[str, int, bytes]:
        return self.topic, seq % self.partitions, _value("fresh", seq)


def run_mode(
    spark: Any, session: Session, mode: str, backlog: int, partitions: int, rate: float,
    workdir: str, verbose: bool = False,
) -> Result:  # fmt: skip
    from pyspark.sql import functions as F

    bootstrap = session.bootstrap
    topic = session.topic(f"-{mode}-{uuid.uuid4().hex[:6]}", partitions)
    out, checkpoint = os.path.join(workdir, topic, "out"), os.path.join(workdir, topic, "ck")
    batches: list[BatchStats] = []
    schema = "kind string, seq long, sent_ms long, customer string, amount double"

    def sink(df: Any, batch_id: int) -> None:
        value = F.from_json(F.col("value").cast("string"), schema).alias("v")
        parsed = df.select("partition", "offset", "catchup", value).select(
            "partition", "offset", "catchup", "v.*"
        )
        parsed.persist()
        parsed.write.mode("append").parquet(out)
        rows = parsed.groupBy("kind", "catchup").agg(
            F.count("*").alias("n"), F.min("sent_ms").alias("oldest")
        )
        kinds = {r.kind + "*" * r.catchup: (r.n, r.oldest) for r in rows.collect()}
        parsed.unpersist()
        batches.append(BatchStats(batch_id, time.time(), kinds))

    def start() -> Any:
        reader = (
            spark.readStream.format("fastrebalance")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.fetch.wait.max.ms", "10")
        )
        for key, value in MODES[mode].items():
            reader = reader.option(key, value)
        return (
            reader.load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    def count(kind: str) -> int:
        return sum(n for b in batches for k, (n, _) in b.kinds.items() if k.rstrip("*") == kind)

    def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}: timed out waiting for {what}")
            time.sleep(0.02)

    _produce(bootstrap, topic, partitions, 1000, "old")
    q = start()
    wait(lambda: count("old") >= 1000, 120, "the first records")
    q.processAllAvailable()  # committed too: a stop before the commit would replay the batch
    q.stop()
    _produce(bootstrap, topic, partitions, backlog, "backlog")
    stored = sum(hi - lo for lo, hi in watermarks(session.probe, topic, partitions))
    if stored != 1000 + backlog:
        raise RuntimeError(f"retention dropped records: {stored} stored of {1000 + backlog}")

    result = Result(mode, backlog)
    live = _Live(bootstrap, topic, partitions, rate)
    restart_wall = time.time()
    live.start()
    seen = len(batches)
    q = start()
    try:
        wait(lambda: count("backlog") >= backlog and count("fresh") > 0, 600, "the backlog")
        live.stop()
        wait(lambda: count("fresh") >= live.sent, 120, "the live records")
    finally:
        live.stop()
        q.stop()
    for p in q.recentProgress:
        if p["numInputRows"]:
            result.durations[p["batchId"]] = p["durationMs"].get("triggerExecution", 0) / 1000
    if verbose:
        for p in q.recentProgress:
            if p["numInputRows"]:
                print(f"  batch {p['batchId']}: {p['numInputRows']} rows {p['durationMs']}")
        for b in batches[seen:]:
            print(f"  at {b.at - restart_wall:6.2f}s {b.kinds}")
    after = batches[seen:]
    fresh = [b for b in after if "fresh" in b.kinds or "fresh*" in b.kinds]
    result.first_fresh_s = fresh[0].at - restart_wall
    drained = 0
    for b in after:
        result.batches.append(b)
        drained += b.backlog
        if drained >= backlog:
            result.drained_s = b.at - restart_wall
            break
    # how stale the live stream got while the backlog was being read
    live_batches = [b for b in after if "fresh" in b.kinds]
    during = [
        b for b in live_batches if b.at - restart_wall <= result.drained_s + 1e-9
    ] or live_batches[:1]
    result.worst_fresh_age_s = max(b.at - b.kinds["fresh"][1] / 1000 for b in during)
    return result


def _spread(values: Sequence[float]) -> str:
    """``median (min-max)``, or the one value."""
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return "-"
    if len(ok) == 1:
        return f"{ok[0]:.1f} s"
    return f"{statistics.median(ok):.1f} s ({min(ok):.1f}-{max(ok):.1f})"


def format_table(results: Sequence[Result]) -> str:
    """One row per mode: medians over the repeats, and the drain time against the baseline.

    The ratio is of the medians; the range in brackets is of the ratios within each repeat
    (a mode against the baseline run just before or after it, under similar load).
    """
    modes = list(dict.fromkeys(r.mode for r in results))
    by_mode = {m: [r for r in results if r.mode == m] for m in modes}
    base = by_mode.get(BASELINE, [])
    base_median = statistics.median([r.drained_s for r in base]) if base else math.nan
    header = ["mode", "restart → first fresh record in the sink", "backlog fully in the sink",
              f"÷ {BASELINE}", "batches with backlog", "each backlog batch", "restart batch",
              "oldest live record while the backlog is read"]  # fmt: skip
    rows = []
    for m in modes:
        runs = by_mode[m]
        drained = [r.drained_s for r in runs]
        ratio = statistics.median(drained) / base_median if base else math.nan
        paired = [r.drained_s / b.drained_s for r, b in zip(runs, base, strict=False)]
        ratio_text = "-" if math.isnan(ratio) else f"{ratio:.2f}x"
        if len(paired) > 1 and m != BASELINE:
            ratio_text += f" ({min(paired):.2f}-{max(paired):.2f})"
        counts = sorted(len(r.drain_batches) for r in runs)
        each = [d for r in runs for d in r.drain_batches]
        rows.append([m, _spread([r.first_fresh_s for r in runs]), _spread(drained), ratio_text,
                     "/".join(map(str, counts)), _spread(each),
                     _spread([r.restart_batch_s for r in runs]),
                     _spread([r.worst_fresh_age_s for r in runs])])  # fmt: skip
    return "\n".join(md_table(header, rows, left=len(header)))


@dataclass
class ScaleResult:
    partitions: int
    latencies_ms: list[float]
    batch_s: list[float]
    plan_ms: list[float]
    list_offsets_per_broker: list[int]

    def line(self) -> str:
        lat = sorted(self.latencies_ms)
        return (
            f"{self.partitions:5d} partitions: {len(lat)} records, p50 {_pct(lat, 50):.0f} ms,"
            f" p99 {_pct(lat, 99):.0f} ms, max {lat[-1] if lat else math.nan:.0f} ms;"
            f" {len(self.batch_s)} batches of {_spread(self.batch_s)};"
            f" planning call {statistics.median(self.plan_ms):.1f} ms,"
            f" ListOffsets per broker {self.list_offsets_per_broker}"
        )


def _pct(values: Sequence[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(len(ordered) * pct / 100) - 1)]


def _await_leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 120) -> None:
    """A new topic of many partitions answers NOT_LEADER for a few seconds on a real broker."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-leaders"})
    try:
        deadline = time.monotonic() + timeout
        query = [TopicPartition(topic, p, -1) for p in range(partitions)]
        while True:
            try:
                found = c.offsets_for_times(query, timeout=10)
                if all(tp.error is None and tp.offset >= 0 for tp in found):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions without a leader after {timeout} s")
            time.sleep(0.5)
    finally:
        c.close()


def measure_planning(bootstrap: str, topic: str, calls: int = 10) -> tuple[list[float], list[int]]:
    """The driver's fetch of every log end, as one planning call makes it: time, and the
    ListOffsets requests per broker (librdkafka statistics, which count what was sent)."""
    from fastrebalance.spark._fetcher import OffsetFetcher
    from fastrebalance.spark._options import parse_options

    stats: dict[str, dict[str, int]] = {}

    def on_stats(raw: str) -> None:
        doc = json.loads(raw)
        stats["req"] = {
            name: broker.get("req", {}).get("ListOffsets", 0)
            for name, broker in doc["brokers"].items()
            if broker.get("nodeid", -1) >= 0
        }

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
    """Light live traffic on a topic of ``partitions``; latency of every record to the sink."""
    from pyspark.sql import functions as F

    bootstrap = session.bootstrap
    topic = session.topic(f"-scale-{partitions}-{uuid.uuid4().hex[:6]}", partitions)
    _await_leaders(bootstrap, topic, partitions)
    latencies: list[float] = []
    measuring = threading.Event()
    seen = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select(F.get_json_object(F.col("value").cast("string"), "$.sent_ms")).collect()
        now_ms = time.time() * 1000
        seen[0] += len(rows)
        if measuring.is_set():
            latencies.extend(now_ms - int(r[0]) for r in rows)

    q = (
        spark.readStream.format("fastrebalance")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("kafka.fetch.wait.max.ms", "10")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", os.path.join(workdir, topic))
        .start()
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    sent = 0
    try:
        deadline = time.monotonic() + 120
        while not q.recentProgress and time.monotonic() < deadline:
            time.sleep(0.1)  # batch 0: the start is fixed
        began = time.monotonic()
        next_at = began
        warmup = min(10.0, seconds / 3)
        while time.monotonic() < began + warmup + seconds:
            if not measuring.is_set() and time.monotonic() > began + warmup:
                seen[0], sent = 0, 0
                measuring.set()
            where = random.randrange(partitions)
            producer.produce(topic, value=_value("fresh", sent), partition=where)
            producer.poll(0)
            sent += 1
            next_at += 1.0 / rate
            time.sleep(max(next_at - time.monotonic(), 0))
        producer.flush(10)
        deadline = time.monotonic() + 60
        while seen[0] < sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        q.stop()
    batch_s = [
        p["durationMs"].get("triggerExecution", 0) / 1000
        for p in q.recentProgress
        if p["numInputRows"]
    ]
    plan_ms, per_broker = measure_planning(bootstrap, topic)
    return ScaleResult(partitions, latencies, batch_s, plan_ms, per_broker)


def format_scale_table(results: Sequence[ScaleResult]) -> str:
    sizes = list(dict.fromkeys(r.partitions for r in results))
    base = min(sizes)
    lats = {n: [x for r in results if r.partitions == n for x in r.latencies_ms] for n in sizes}
    p99 = {n: _pct(lats[n], 99) for n in sizes}
    header = ["partitions", "records", "produce → sink p50", "p99", "max",
              f"p99 ÷ {base} partitions", "batch duration", "planning call",
              "ListOffsets requests per broker"]  # fmt: skip
    rows = []
    for n in sizes:
        runs = [r for r in results if r.partitions == n]
        lat = sorted(x for r in runs for x in r.latencies_ms)
        plans = [x for r in runs for x in r.plan_ms]
        rows.append([str(n), str(len(lat)), f"{_pct(lat, 50):.0f} ms", f"{p99[n]:.0f} ms",
                     f"{lat[-1]:.0f} ms", f"{p99[n] / p99[base]:.2f}x",
                     _spread([x for r in runs for x in r.batch_s]),
                     f"{statistics.median(plans):.0f} ms",
                     str(runs[-1].list_offsets_per_broker)])  # fmt: skip
    return "\n".join(md_table(header, rows, left=len(header)))


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
""",
    )
    a.option(p, "--backlog", 500_000, a.number(int, 1), "N",
             "records piled up while the query is down (default: {})")
    a.partitions(p, 4, "partitions of each restart topic (default: {})")
    a.rate(p, 100.0, "live records per second (default: {})")
    a.option(p, "--modes", ("catchup", "plain", "plain-limited"), a.name_list(tuple(MODES)),
             "LIST", f"restart modes, any of {', '.join(MODES)} (default: {{}})")
    a.option(p, "--repeat", 1, a.number(int, 1), "N", "runs of each mode or size (default: {})")
    a.option(p, "--warmup", 1, a.number(int, 0), "N",
             "unreported runs first, to warm up the JVM (default: {})")
    a.option(p, "--scale", (), a.number_list(int, 1), "P,...",
             "partitions mode: the topic sizes, e.g. 4,1000 (instead of the restart benchmark)")
    a.option(p, "--seconds", 60.0, a.positive(), "SECONDS", "partitions mode: per run "
             "(default: {})")
    a.bootstrap_servers(p, "a running broker (default: an embedded one)")
    p.add_argument("--verbose", dest="print_batches", action="store_true",
                   help="print every batch")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from fastrebalance.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fastrebalance-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    workdir = tempfile.mkdtemp(prefix="fastrebalance-bench-")
    results: list[Result] = []
    scaled: list[ScaleResult] = []
    sizes, modes = args.scale, args.modes
    try:
        with Session("spark", args.bootstrap_servers, out=None) as session:
            for n in sizes[:1] * args.warmup:
                warm = run_scale(spark, session, n, args.rate, min(args.seconds, 15), workdir)
                print("(warm-up) " + warm.line(), flush=True)
            for _ in range(args.warmup if not sizes else 0):
                backlog = min(args.backlog, 200_000)
                warm_up = run_mode(spark, session, modes[0], backlog, args.partitions, args.rate,
                                   workdir, args.print_batches)  # fmt: skip
                print("(warm-up) " + warm_up.line(), flush=True)
            for _ in range(args.repeat):
                for n in sizes:
                    sr = run_scale(spark, session, n, args.rate, args.seconds, workdir)
                    scaled.append(sr)
                    print(sr.line(), flush=True)
                for mode in modes if not sizes else ():
                    r = run_mode(spark, session, mode, args.backlog, args.partitions, args.rate,
                                 workdir, args.print_batches)  # fmt: skip
                    results.append(r)
                    print(r.line(), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    where = args.bootstrap_servers or "the embedded cluster"
    if sizes:
        print(
            f"\n{args.rate:g} live records/s on {where}, {args.seconds:g} s measured per run,"
            f" {args.repeat} run(s) per size\n"
        )
        print(format_scale_table(scaled))
        return a.EXIT_OK
    print(
        f"\nbacklog {args.backlog:,} records, {args.partitions} partitions, {args.rate:g} live"
        f" records/s on {where}; {args.repeat} run(s) per mode, median (range)\n"
    )
    print(format_table(results))
    return a.EXIT_OK


if __name__ == "__main__":
    sys.exit(a.run_alone(add_command, "bench-spark"))
