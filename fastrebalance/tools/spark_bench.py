"""Restart-to-first-fresh-record benchmark for the Spark source, on the embedded cluster.

    python -m fastrebalance.tools.spark_bench --backlog 500000

For each mode: a query reads a topic and is stopped, a backlog piles up, live traffic starts
and the query restarts from its checkpoint. Measured from the restart: when the first live
record reaches the sink, when the whole backlog has, and how stale the live records got
meanwhile. The job is a realistic micro-batch: parse the JSON value, append to parquet,
count per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

MODES: dict[str, dict[str, str]] = {
    # KIP-333 catch-up with the default budgets
    "catchup": {},
    # a smaller backlog budget per batch: live records wait less, the backlog takes longer
    "catchup-40k": {"catchup.maxOffsetsPerTrigger": "40000", "catchup.chunkSize": "10000"},
    # Spark's usual in-order reading, no limit: the first batch after restart is the backlog
    "plain": {"catchup.enabled": "false"},
    # Spark's usual in-order reading with the same per-batch budget as the catch-up
    "plain-limited": {"catchup.enabled": "false", "maxOffsetsPerTrigger": "100000"},
}


@dataclass
class BatchStats:
    at: float
    # kind ("old", "backlog", "fresh"; a "*" suffix when read as backlog) -> (records, oldest
    # sent_ms). Fresh records sent between the restart and the source's first look at the log
    # end are part of the backlog, hence "fresh*".
    kinds: dict[str, tuple[int, int]]


@dataclass
class Result:
    mode: str
    backlog: int
    first_fresh_s: float = float("nan")
    drained_s: float = float("nan")
    worst_fresh_age_s: float = float("nan")
    batches: list[BatchStats] = field(default_factory=list)


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
        batches.append(BatchStats(time.time(), kinds))

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

    def wait(condition: Any, timeout: float, what: str) -> None:
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
    if verbose:
        for p in q.recentProgress:
            if p["numInputRows"]:
                print(f"  batch {p['batchId']}: {p['numInputRows']} rows {p['durationMs']}")
        for b in batches[seen:]:
            print(f"  at {b.at - restart_wall:6.2f}s {b.kinds}")
    result.batches = batches[seen:]
    fresh = [b for b in result.batches if "fresh" in b.kinds or "fresh*" in b.kinds]
    result.first_fresh_s = fresh[0].at - restart_wall
    drained = 0
    for b in result.batches:
        drained += b.kinds.get("backlog", (0, 0))[0] + b.kinds.get("backlog*", (0, 0))[0]
        if drained >= backlog:
            result.drained_s = b.at - restart_wall
            break
    # how stale the live stream got while the backlog was being read
    live_batches = [b for b in result.batches if "fresh" in b.kinds]
    during = [
        b for b in live_batches if b.at - restart_wall <= result.drained_s + 1e-9
    ] or live_batches[:1]
    result.worst_fresh_age_s = max(b.at - b.kinds["fresh"][1] / 1000 for b in during)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0, help="live records per second")
    parser.add_argument(
        "--modes", default="catchup,plain,plain-limited", help=f"any of {', '.join(MODES)}"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print every batch")
    args = parser.parse_args(argv)

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
            for _ in range(args.repeat):
                for mode in args.modes.split(","):
                    r = run_mode(
                        spark, kafka.bootstrap_servers, kafka.create_topic, mode, args.backlog,
                        args.partitions, args.rate, workdir, args.verbose,
                    )  # fmt: skip
                    results.append(r)
                    print(
                        f"{mode:14s} first fresh {r.first_fresh_s:6.2f}s  backlog done"
                        f" {r.drained_s:6.2f}s  worst fresh age {r.worst_fresh_age_s:6.2f}s"
                        f"  batches {len(r.batches)}",
                        flush=True,
                    )
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n| mode | restart → first fresh record in sink | backlog drained | worst fresh age |")
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r.mode} | {r.first_fresh_s:.2f} s | {r.drained_s:.2f} s"
            f" | {r.worst_fresh_age_s:.2f} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
