"""Shared helpers for the adversary's reproductions (issue 19): a Spark session, a
foreachBatch recorder and a plain confluent-kafka reader of the truth."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BS = os.environ.get("BS", "127.0.0.1:39492")


def spark_session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from fastrebalance.spark import register

    s = (
        SparkSession.builder.master("local[2]")
        .appName("adv19")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    return s


def new_topic(partitions: int = 1, config: dict[str, str] | None = None, name: str | None = None) -> str:
    name = name or f"adv19-{uuid.uuid4().hex[:8]}"
    a = AdminClient({"bootstrap.servers": BS})
    f = a.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    f[name].result(30)
    time.sleep(1.0)
    return name


def produce(topic: str, n: int, partitions: int = 1, tag: str = "r", **kw: Any) -> None:
    p = Producer({"bootstrap.servers": BS, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % partitions, **kw)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def truth(topic: str, partitions: int, isolation: str = "read_uncommitted") -> set[tuple[int, int]]:
    """Every (partition, offset) a plain consumer reads from the beginning to the end."""
    c = Consumer({
        "bootstrap.servers": BS, "group.id": "adv19-truth-" + uuid.uuid4().hex,
        "enable.auto.commit": False, "isolation.level": isolation,
        "enable.partition.eof": True,
    })
    c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    got: set[tuple[int, int]] = set()
    eof: set[int] = set()
    deadline = time.time() + 60
    while len(eof) < partitions and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                eof.add(m.partition())
            continue
        got.add((m.partition(), m.offset()))
    c.close()
    return got


class Recorder:
    """foreachBatch sink: batch id -> list of attempts, each a sorted list of (partition, offset)."""

    def __init__(self) -> None:
        self.attempts: dict[int, list[list[tuple[int, int]]]] = {}

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("partition", "offset").collect()
        self.attempts.setdefault(batch_id, []).append(sorted((r.partition, r.offset) for r in rows))

    def seen(self) -> set[tuple[int, int]]:
        return {k for atts in self.attempts.values() for a in atts for k in a}

    def count(self) -> int:
        return sum(len(atts[-1]) for atts in self.attempts.values())

    def replays_identical(self) -> bool:
        return all(all(a == atts[0] for a in atts) for atts in self.attempts.values())

    def summary(self) -> str:
        return " ".join(f"{b}:{[len(a) for a in atts]}" for b, atts in sorted(self.attempts.items()))


def reader(spark, topic: str, **opts: Any):
    r = spark.readStream.format("fastrebalance").option("kafka.bootstrap.servers", BS)
    if not any(k in opts for k in ("subscribe", "assign", "subscribePattern")):
        r = r.option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k.replace("__", "."), str(v))
    return r.load()


def report(name: str, want: set, rec: Recorder) -> bool:
    got = rec.seen()
    missing, invented = want - got, got - want
    ok = not missing and not invented and rec.replays_identical()
    print(f"[{name}] want={len(want)} got_distinct={len(got)} rows={rec.count()} missing={len(missing)} "
          f"invented={len(invented)} replays_identical={rec.replays_identical()} batches={rec.summary()[:300]}"
          f" -> {'OK' if ok else 'FAIL'}", flush=True)
    if missing:
        print("   missing sample:", sorted(missing)[:10], flush=True)
    if invented:
        print("   invented sample:", sorted(invented)[:10], flush=True)
    return ok
