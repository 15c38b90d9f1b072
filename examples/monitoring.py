"""Monitoring a catch-up: childConsumerIsAlive(), catchup_status(), stats_cb, and the
operator's view from outside with `fastrebalance status`.

A consumer restarts with a 30,000-record backlog. While its child consumer drains it,
the application reports, once a second, what a health check or a metrics exporter
would: whether the child is alive, the records it still has to read, its rate (from the
`fastrebalance` object that stats_cb's JSON carries). Halfway, `fastrebalance status`
reads the group's two commit logs from another process, as an operator would.

Run against the embedded cluster (nothing to install):
    python examples/monitoring.py
or against your own Kafka:
    python examples/monitoring.py --bootstrap-servers localhost:9092
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Producer

from fastrebalance import Consumer, TopicPartition
from fastrebalance.testing import EmbeddedKafka, ExternalKafka

BACKLOG = 30_000


def busy(seconds: float) -> None:
    """Stand-in for the application's work on one record."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def health(consumer: Consumer, stats: dict[str, Any]) -> tuple[bool, int]:
    """What a /health endpoint or a metrics exporter would publish.

    The child consumer is alive from the first backlog on (it stays on standby
    afterwards, ready for the next crash): a pending backlog with no live child means
    nobody is reading it, which is worth an alert.
    """
    alive = consumer.childConsumerIsAlive()
    remaining = sum(s.records_remaining for s in consumer.catchup_status().values())
    line = (
        f"child alive: {alive!s:5}  backlog remaining: {remaining:>6,}"
        f"  child state: {stats.get('child_state', '?'):8}"
        f"  backlog rate: {stats.get('backlog_records_per_second', 0):>8,.0f}/s"
    )
    if remaining and not alive:
        line += "  ALERT: backlog pending but no child consumer reading it"
    print(line, flush=True)
    return alive, remaining


def operator_view(bootstrap: str, group: str, topic: str) -> int:
    """`fastrebalance status`, from another process: it reads only committed offsets."""
    argv = ["status", "--bootstrap-servers", bootstrap, "--group", group, "--topic", topic]
    print("\n$ fastrebalance " + " ".join(argv), flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "fastrebalance.tools.cli", *argv], capture_output=True, text=True
    )
    print(proc.stdout + proc.stderr, flush=True)
    return proc.returncode


def run(bootstrap: str, topic: str) -> int:
    group = f"example-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(BACKLOG):
        producer.produce(topic, value=f"old-{i}".encode(), partition=0)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()

    stats: dict[str, Any] = {}

    def on_stats(raw: str) -> None:
        # librdkafka's statistics JSON, plus our "fastrebalance" object: per-partition
        # pending ranges and records remaining, child state, backlog records delivered.
        stats.update(json.loads(raw).get("fastrebalance", {}))

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.parallel.rebalance": True,
        "parallel.rebalance.lag.threshold": 1000,
        "auto.commit.interval.ms": 500,  # auto-commit writes both commit logs
        "statistics.interval.ms": 500,
        "stats_cb": on_stats,
        "fetch.wait.max.ms": 10,
    }
    with Consumer(conf) as crashed:  # the previous incarnation committed 0, then died
        crashed.assign([TopicPartition(topic, 0, 0)])
        crashed.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)

    status_code = None
    delivered = 0
    with Consumer(conf) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        next_report = time.monotonic()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                delivered += 1
                busy(100e-6)
            if time.monotonic() < next_report:
                continue
            next_report += 1.0
            alive, remaining = health(consumer, stats)
            if status_code is None and remaining and remaining < BACKLOG // 2:
                status_code = operator_view(bootstrap, group, topic)
            if alive and delivered >= BACKLOG and not remaining:
                break
        health(consumer, stats)
        standby = consumer.childConsumerIsAlive()
    print(f"delivered {delivered:,} records; child consumer on standby: {standby}")
    ok = delivered >= BACKLOG and standby and status_code in (0, None)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing cluster (default: embedded)")
    args = parser.parse_args()
    # The consumer's own INFO lines: catch-up planned, child started, finished, standby.
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
    logging.getLogger("fastrebalance").setLevel(logging.INFO)
    with contextlib.ExitStack() as stack:
        topic = f"example-{uuid.uuid4().hex[:8]}"
        if args.bootstrap_servers:
            cluster: Any = stack.enter_context(ExternalKafka(args.bootstrap_servers))
        else:
            cluster = stack.enter_context(EmbeddedKafka())
        cluster.create_topic(topic, 1)
        return run(cluster.bootstrap_servers, topic)


if __name__ == "__main__":
    raise SystemExit(main())
