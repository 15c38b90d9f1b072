"""Restart-to-first-fresh-record benchmark for the Spark source, on the embedded cluster.

    python -m fastrebalance.tools.spark_bench --backlog 500000 --repeat 3

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
"""

from __future__ import annotations

import argparse
import json
import math
import os
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


def _log_size(bootstrap: str, topic: str, partitions: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-marks"})
    try:
        total = 0
        for p in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        c.close()


class _Live(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic, self.partitions, self.interval = topic, partitions, 1.0 / rate
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.halt.is_set():
            self.producer.produce(
                self.topic, value=_value("fresh", self.sent), partition=self.sent % self.partitions
            )
            self.producer.poll(0)
            self.sent += 1
            next_at += self.interval
            self.halt.wait(max(next_at - time.monotonic(), 0))
        self.producer.flush(10)


def run_mode(
    spark: Any, bootstrap: str, create_topic: Any, mode: str, backlog: int, partitions: int,
    rate: float, workdir: str, verbose: bool = False,
) -> Result:  # fmt: skip
    from pyspark.sql import functions as F

    topic = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    create_topic(topic, partitions)
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
    stored = _log_size(bootstrap, topic, partitions)
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
        live.halt.set()
        live.join()
        wait(lambda: count("fresh") >= live.sent, 120, "the live records")
    finally:
        live.halt.set()
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


def _median(values: Sequence[float]) -> str:
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
    lines = [
        "| mode | restart → first fresh record in the sink | backlog fully in the sink"
        f" | ÷ {BASELINE} | batches with backlog | each backlog batch | restart batch"
        " | oldest live record while the backlog is read |",
        "|---|---|---|---|---|---|---|---|",
    ]
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
        lines.append(
            f"| {m} | {_median([r.first_fresh_s for r in runs])} | {_median(drained)}"
            f" | {ratio_text} | {'/'.join(map(str, counts))} | {_median(each)}"
            f" | {_median([r.restart_batch_s for r in runs])}"
            f" | {_median([r.worst_fresh_age_s for r in runs])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0, help="live records per second")
    parser.add_argument(
        "--modes", default="catchup,plain,plain-limited", help=f"any of {', '.join(MODES)}"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--warmup", type=int, default=1, help="unreported runs first, to warm up the JVM"
    )
    parser.add_argument("--verbose", action="store_true", help="print every batch")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {', '.join(MODES)}")

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from fastrebalance.spark import register
    from fastrebalance.testing import EmbeddedKafka

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
    try:
        with EmbeddedKafka() as kafka:

            def run(mode: str, backlog: int) -> Result:
                return run_mode(
                    spark, kafka.bootstrap_servers, kafka.create_topic, mode, backlog,
                    args.partitions, args.rate, workdir, args.verbose,
                )  # fmt: skip

            for _ in range(args.warmup):
                print("(warm-up) " + run(modes[0], min(args.backlog, 200_000)).line(), flush=True)
            for _ in range(args.repeat):
                for mode in modes:
                    r = run(mode, args.backlog)
                    results.append(r)
                    print(r.line(), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nbacklog {args.backlog:,} records, {args.partitions} partitions, {args.rate:g} live"
        f" records/s; {args.repeat} run(s) per mode, median (range)\n"
    )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
