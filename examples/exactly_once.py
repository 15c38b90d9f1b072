"""Exactly-once read-process-write with catch-up: fresh orders first, each output once.

A pipeline reads `orders`, writes one `receipts` record per order, and commits its input
offsets in the same transaction. It crashed with a backlog; on restart, fresh orders are
processed at once while the child consumer reads the backlog, and every transaction
carries both commit logs (the group's token and the catch-up checkpoint).

Run against the embedded cluster (nothing to install):
    python examples/exactly_once.py
or against your own Kafka:
    python examples/exactly_once.py --bootstrap-servers localhost:9092
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException, Producer

from fastrebalance import Consumer, TopicPartition
from fastrebalance.testing import EmbeddedKafka

BACKLOG = 3000


def run(bootstrap: str, orders: str, receipts: str) -> int:
    group = f"receipts-{uuid.uuid4().hex[:8]}"
    feed = Producer({"bootstrap.servers": bootstrap})
    for i in range(BACKLOG):  # what piled up while the pipeline was down
        feed.produce(orders, value=f"order-{i}".encode(), partition=0)
    feed.flush()
    # The previous incarnation's last committed transaction ended at offset 0.
    seed = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    seed.commit(offsets=[TopicPartition(orders, 0, 0)], asynchronous=False)
    seed.close()

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.parallel.rebalance": True,
            "parallel.rebalance.lag.threshold": 100,
            "parallel.rebalance.transactional": True,  # offsets only in transactions
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group})
    producer.init_transactions(30)
    consumer.assign([TopicPartition(orders, 0)])
    for i in range(10):  # fresh orders, after the restart
        feed.produce(orders, value=f"fresh-{i}".encode(), partition=0)
    feed.flush()

    done: set[bytes] = set()
    first_fresh = None
    deadline = time.monotonic() + 60
    while len(done) < BACKLOG + 10 and time.monotonic() < deadline:
        batch = [m for m in consumer.consume(500, 0.2) if m.error() is None]
        if not batch:
            continue
        producer.begin_transaction()
        try:
            for m in batch:
                producer.produce(receipts, value=b"receipt for " + m.value(), partition=0)
            consumer.send_offsets_to_transaction(producer, batch)
            consumer.commit_transaction(producer)
        except KafkaException:
            consumer.abort_transaction(producer)  # the batch comes again
            continue
        for m in batch:
            if first_fresh is None and m.value().startswith(b"fresh"):
                first_fresh = len(done)
            done.add(m.value())
    consumer.close()

    # Read the output as a downstream read_committed consumer would.
    reader = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{group}-reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(receipts, 0, 0)])
    counts: Counter[bytes] = Counter()
    while True:
        m = reader.poll(5)
        if m is None or m.error() is not None:
            break
        counts[m.value()] += 1
    reader.close()
    twice = sum(1 for n in counts.values() if n > 1)
    print(f"processed {len(done)} orders; the first fresh one after {first_fresh} backlog orders")
    print(f"receipts: {len(counts)} distinct, {twice} written twice")
    ok = len(done) == BACKLOG + 10 and len(counts) == BACKLOG + 10 and twice == 0
    return 0 if ok and first_fresh is not None and first_fresh < BACKLOG else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing cluster (default: embedded)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        suffix = uuid.uuid4().hex[:8]
        orders, receipts = f"orders-{suffix}", f"receipts-{suffix}"
        if args.bootstrap_servers:
            bootstrap = args.bootstrap_servers
        else:
            cluster = stack.enter_context(EmbeddedKafka())
            for topic in (orders, receipts):
                cluster.create_topic(topic, 1)
            bootstrap = cluster.bootstrap_servers
        return run(bootstrap, orders, receipts)


if __name__ == "__main__":
    raise SystemExit(main())
