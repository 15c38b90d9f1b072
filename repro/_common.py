"""Shared bits of the adversary repro scripts (issue 22): not part of the package.

Plain confluent_kafka only for setup and checking: topics, a backlog, the group's stored
offset sampled from outside (a plain Consumer's committed()).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("BOOTSTRAP", "127.0.0.1:39292")


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    fut = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})]
    )[topic]
    fut.result(30)
    time.sleep(0.5)


def commit_zero(group: str, topic: str, partitions: int = 1) -> None:
    c = PlainConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, p, 0) for p in range(partitions)],
                 asynchronous=False)
    finally:
        c.close()


def produce(topic: str, count: int, partition: int = 0, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for i in range(start, start + count):
        p.produce(topic, value=str(i).encode(), key=str(i).encode(), partition=partition)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def base_conf(group: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": BOOTSTRAP,
        "group.id": group,
        "enable.parallel.rebalance": True,
        "parallel.rebalance.group.catchup": os.environ.get("GROUP", "1") == "1",
        "parallel.rebalance.lag.threshold": 10,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(extra)
    return conf


def group_offsets(group: str, topic: str, partitions: int = 1) -> list[int]:
    c = PlainConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in got]
    finally:
        c.close()


class Sampler(threading.Thread):
    """Samples the group's stored offset while running; an offset above the lowest
    unprocessed one (per partition) is unsafe."""

    def __init__(self, group: str, topic: str, partitions: int, processed: list[set[int]],
                 lock: threading.Lock, end: list[int]) -> None:
        super().__init__(daemon=True)
        self.group, self.topic, self.partitions = group, topic, partitions
        self.processed, self.lock, self.end = processed, lock, end
        self.samples = 0
        self.unsafe: list[tuple[int, int, int]] = []
        self.last: list[int] = [-1] * partitions
        self._low = [0] * partitions
        self._halt = threading.Event()

    def run(self) -> None:
        c = PlainConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": self.group})
        try:
            while not self._halt.is_set():
                try:
                    got = c.committed(
                        [TopicPartition(self.topic, p) for p in range(self.partitions)],
                        timeout=10)
                except Exception:  # noqa: BLE001 (a paused broker): sample again
                    continue
                with self.lock:
                    for tp in got:
                        if tp.offset < 0:
                            continue
                        self.last[tp.partition] = tp.offset
                        done = self.processed[tp.partition]
                        low = self._low[tp.partition]
                        while low in done:
                            low += 1
                        self._low[tp.partition] = low
                        if tp.offset > low:  # stored past an unprocessed record
                            self.unsafe.append((tp.partition, tp.offset, low))
                self.samples += 1
                self._halt.wait(0.1)
        finally:
            c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(15)
