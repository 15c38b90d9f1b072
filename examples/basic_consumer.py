"""A drop-in consumer: crash with a backlog, restart, see fresh records first.

Run against the embedded cluster (nothing to install):
    python examples/basic_consumer.py
or against your own Kafka:
    python examples/basic_consumer.py --bootstrap-servers localhost:9092
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid

from confluent_kafka import Producer

from fastrebalance import Consumer, TopicPartition
from fastrebalance.testing import EmbeddedKafka


def run(bootstrap: str, topic: str) -> int:
    group = f"example-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5000):  # yesterday's records: the backlog
        producer.produce(topic, value=f"old-{i}".encode(), partition=0)
    producer.flush()

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.parallel.rebalance": True,  # KIP-333 mode
        "parallel.rebalance.lag.threshold": 100,
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 10,
    }
    # The previous incarnation committed offset 0 and crashed.
    with Consumer(conf) as crashed:
        crashed.assign([TopicPartition(topic, 0, 0)])
        crashed.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)

    with Consumer(conf) as consumer:
        seen, first_fresh_at = 0, None
        began = time.monotonic()
        deadline = began + 30
        consumer.subscribe([topic], on_assign=lambda c, parts: print("assigned at", parts))
        while not consumer.assignment() and time.monotonic() < deadline:
            msg = consumer.poll(0.1)  # joining the group; catch-up starts on assignment
            seen += msg is not None and msg.error() is None
        producer.produce(topic, value=b"fresh!", partition=0)  # after the restart
        producer.flush()
        while seen < 5001 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen += 1
            if msg.value() == b"fresh!":
                first_fresh_at = seen
            if seen % 500 == 0:  # not one commit per record: a broker takes ~10 ms each
                consumer.commit(message=msg, asynchronous=True)
        print(f"delivered {seen} records in {time.monotonic() - began:.1f} s;"
              f" the fresh one came #{first_fresh_at}")
        print(f"child consumer alive (on standby): {consumer.child_consumer_is_alive()}")
        consumer.commit(asynchronous=False)
    return 0 if seen == 5001 and first_fresh_at is not None and first_fresh_at < 5001 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="an existing cluster (default: embedded)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        topic = f"example-{uuid.uuid4().hex[:8]}"
        if args.bootstrap_servers:
            bootstrap = args.bootstrap_servers
        else:
            cluster = stack.enter_context(EmbeddedKafka())
            cluster.create_topic(topic, 1)
            bootstrap = cluster.bootstrap_servers
        return run(bootstrap, topic)


if __name__ == "__main__":
    raise SystemExit(main())
