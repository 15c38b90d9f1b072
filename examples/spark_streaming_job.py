"""A Spark Structured Streaming job on the fastrebalance source: fresh orders first after a restart.

The job reads JSON orders from Kafka, parses them, writes each micro-batch to parquet and
prints what the batch held: live records, and backlog records (``catchup = true``) that the
source reads in parallel chunks after a restart.

One command, nothing to set up (an embedded Kafka, a first run, a backlog piling up while
the job is down, a restart from the checkpoint, a check that every order arrived once):

    python examples/spark_streaming_job.py

Or kill and restart it yourself, in three terminals:

    python examples/spark_streaming_job.py kafka            # embedded Kafka + live orders
    python examples/spark_streaming_job.py job --bootstrap-servers 127.0.0.1:PORT
    # Ctrl-C (or kill -9) the job, then pile up a backlog while it is down:
    python examples/spark_streaming_job.py burst --bootstrap-servers 127.0.0.1:PORT
    # start the job again with the same command: the first batch has the live orders,
    # the backlog follows in the next batches

Needs ``pip install 'fastrebalance[spark]'`` and a Java 17+ runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from confluent_kafka import Producer

TOPIC = "orders"
PARTITIONS = 4
ORDER_SCHEMA = "order_id long, customer string, amount double, created_ms long"


# -- the producer side -------------------------------------------------------------------------
def order(i: int) -> bytes:
    return json.dumps(
        {
            "order_id": i,
            "customer": f"customer-{i % 50}",
            "amount": round(5 + (i * 7919) % 500 / 10, 2),
            "created_ms": int(time.time() * 1000),
        }
    ).encode()


def burst(bootstrap: str, count: int, first_id: int) -> None:
    """Append ``count`` orders at once: the backlog a stopped job will find."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for i in range(first_id, first_id + count):
        p.produce(TOPIC, value=order(i), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


class LiveOrders(threading.Thread):
    """A steady trickle of new orders, like a shop that keeps selling while the job is down."""

    def __init__(self, bootstrap: str, rate: float, first_id: int = 10_000_000) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.rate, self.next_id = rate, first_id
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(1 / self.rate):
            self.producer.produce(
                TOPIC, value=order(self.next_id), partition=self.next_id % PARTITIONS
            )
            self.producer.poll(0)
            self.next_id += 1
        self.producer.flush(10)


# -- the Spark job -----------------------------------------------------------------------------
def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import fastrebalance
    from pyspark.sql import SparkSession

    from fastrebalance.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("orders-job")
        # a local master's executors are threads of this JVM: the driver's ports stay on
        # loopback (Spark picks the host's network address otherwise)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_job(
    spark: Any,
    bootstrap: str,
    checkpoint: str,
    output: str,
    on_batch: Any = None,
    trigger: dict[str, Any] | None = None,
    **opts: str,
) -> Any:
    """Kafka -> parsed orders -> one parquet folder per micro-batch, with a line per batch."""
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("fastrebalance")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("kafka.fetch.wait.max.ms", "10")
        .options(**opts)
        .load()
        .select(
            "partition",
            "offset",
            "catchup",
            F.spark_partition_id().alias("task"),
            F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o"),
        )
        .select("partition", "offset", "catchup", "task", "o.*")
    )

    def write_batch(df: Any, batch_id: int) -> None:
        df.persist()
        # One folder per batch id, overwritten if Spark replays the batch after a crash: the
        # source re-plans a replay from the logged offsets, so it holds the very same orders.
        df.drop("task").write.mode("overwrite").parquet(os.path.join(output, f"batch={batch_id}"))
        s = df.agg(
            F.sum(F.when(~F.col("catchup"), 1).otherwise(0)).alias("live"),
            F.sum(F.when(F.col("catchup"), 1).otherwise(0)).alias("backlog"),
            F.countDistinct(F.when(F.col("catchup"), F.col("task"))).alias("tasks"),
            F.max(F.when(~F.col("catchup"), F.col("created_ms"))).alias("newest_live"),
            F.round(F.sum("amount"), 2).alias("revenue"),
        ).collect()[0]
        df.unpersist()
        live, backlog = s.live or 0, s.backlog or 0
        if live or backlog:
            age = f" (newest {time.time() - s.newest_live / 1000:.1f}s old)" if live else ""
            chunks = f" in {s.tasks} parallel tasks" if backlog else ""
            print(
                f"  batch {batch_id:3d}: {live:6d} live{age:22s} {backlog:7d} backlog{chunks}"
                f"  revenue {s.revenue}",
                flush=True,
            )
        if on_batch is not None:
            on_batch(batch_id, live, backlog, s.newest_live or 0)

    return (
        orders.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(**(trigger or {"processingTime": "500 milliseconds"}))
        .start()
    )


# -- the commands ------------------------------------------------------------------------------
def demo(backlog: int) -> int:
    """Run, stop, pile up a backlog, restart: the effect in one command, then a check."""
    from fastrebalance.testing import EmbeddedKafka

    workdir = tempfile.mkdtemp(prefix="orders-job-")
    checkpoint, output = os.path.join(workdir, "checkpoint"), os.path.join(workdir, "orders")
    with EmbeddedKafka() as kafka:
        kafka.create_topic(TOPIC, PARTITIONS)
        bs = kafka.bootstrap_servers
        spark = spark_session()
        live = LiveOrders(bs, rate=200)
        try:
            burst(bs, 2000, 0)
            live.start()
            # small budgets so that a demo-sized backlog spreads over a few batches
            catchup = {"catchup.maxOffsetsPerTrigger": "20000", "catchup.chunkSize": "5000"}
            print(f"== run 1: the job reads what {TOPIC!r} holds, then stops")
            # Trigger.AvailableNow ends by itself, between batches: no stop in the middle of
            # a batch, which would be safe (Spark replays it) but noisy.
            q = start_job(spark, bs, checkpoint, output, trigger={"availableNow": True}, **catchup)
            q.awaitTermination(120)
            print(f"== the job is down; {backlog} orders pile up meanwhile")
            burst(bs, backlog, 2000)
            seen: dict[str, Any] = {"first_live": None, "backlog": 0, "drained": None}
            restarted = time.time()

            def on_batch(batch_id: int, n_live: int, n_backlog: int, newest_ms: int) -> None:
                now = time.time() - restarted
                if n_live and newest_ms / 1000 > restarted and seen["first_live"] is None:
                    seen["first_live"] = now  # an order created after the restart
                seen["backlog"] += n_backlog
                if seen["drained"] is None and seen["backlog"] >= backlog:
                    seen["drained"] = now

            print("== run 2: restart from the same checkpoint")
            q = start_job(spark, bs, checkpoint, output, on_batch, **catchup)
            deadline = time.monotonic() + 90
            while seen["drained"] is None and time.monotonic() < deadline:
                time.sleep(0.2)
            live.halt.set()
            live.join()
            q.processAllAvailable()
            q.stop()
            if seen["drained"] is None:
                print("the backlog was not drained within 90 s")
                return 1
            print(
                f"== first live orders in the sink {seen['first_live']:.1f}s after the restart;"
                f" backlog of {backlog} drained after {seen['drained']:.1f}s"
            )
            return check(spark, bs, output)
        finally:
            live.halt.set()
            spark.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def check(spark: Any, bootstrap: str, output: str) -> int:
    """Every order in the topic is in the parquet output exactly once."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "orders-check"})
    ends = {
        p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
        for p in range(PARTITIONS)
    }
    c.close()
    df = spark.read.parquet(output)
    rows = df.groupBy("partition").agg({"offset": "count"}).collect()
    distinct = df.select("partition", "offset").distinct().count()
    counts = {r["partition"]: r["count(offset)"] for r in rows}
    total = sum(ends.values())
    if counts != ends or distinct != total:
        print(f"MISMATCH: topic holds {ends}, output holds {counts} ({distinct} distinct)")
        return 1
    print(f"== all {total} orders are in the parquet output, each exactly once")
    return 0


def serve_kafka(rate: float) -> int:
    from fastrebalance.testing import EmbeddedKafka

    with EmbeddedKafka() as kafka:
        kafka.create_topic(TOPIC, PARTITIONS)
        bs = kafka.bootstrap_servers
        burst(bs, 5000, 0)
        live = LiveOrders(bs, rate)
        live.start()
        me = f"python {sys.argv[0]}"
        print(f"Kafka at {bs}, topic {TOPIC!r}: {rate:g} new orders/s. Next, in other terminals:")
        print(f"  {me} job --bootstrap-servers {bs}")
        print(f"  (stop the job) {me} burst --bootstrap-servers {bs}  (then start the job again)")
        print("Ctrl-C stops Kafka.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            live.halt.set()
    return 0


def run_job(bootstrap: str, workdir: str) -> int:
    spark = spark_session()
    checkpoint, output = os.path.join(workdir, "checkpoint"), os.path.join(workdir, "orders")
    print(f"checkpoint {checkpoint}, output {output}; Ctrl-C or kill -9 me, then start me again")
    q = start_job(spark, bootstrap, checkpoint, output)
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stopping.is_set():
            os._exit(130)  # a second Ctrl-C: leave now, like a crash (the restart copes)
        print("stopping after the current batch (Ctrl-C again to kill)", flush=True)
        stopping.set()

    # PySpark's own SIGINT handler cancels the running Spark job mid-write; stopping between
    # two batches is quieter. Mid-batch is safe too (the batch is replayed on restart, and a
    # replay rewrites the same batch folder), but Spark then prints a long stack trace.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while q.isActive and not stopping.wait(0.5):
        pass
    deadline = time.monotonic() + 30
    while q.isActive and q.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.01)
    q.stop()
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="the whole story in one command (the default)")
    d.add_argument("--backlog", type=int, default=60_000)
    k = sub.add_parser("kafka", help="an embedded Kafka with a live order stream")
    k.add_argument("--rate", type=float, default=200.0, help="new orders per second")
    j = sub.add_parser("job", help="the streaming job; kill it and start it again")
    j.add_argument("--bootstrap-servers", required=True)
    j.add_argument("--workdir", default="./orders-job", help="checkpoint and parquet output")
    b = sub.add_parser("burst", help="pile up a backlog while the job is down")
    b.add_argument("--bootstrap-servers", required=True)
    b.add_argument("--count", type=int, default=300_000)
    args = parser.parse_args(argv)
    if args.command in (None, "demo"):
        return demo(getattr(args, "backlog", 60_000))
    if args.command == "kafka":
        return serve_kafka(args.rate)
    if args.command == "job":
        return run_job(args.bootstrap_servers, args.workdir)
    burst(args.bootstrap_servers, args.count, int(time.time()))
    print(f"{args.count} orders appended to {TOPIC!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
