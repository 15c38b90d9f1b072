"""The asyncio twin: crash with a backlog, restart, see fresh records first, from asyncio.

``fastrebalance.aio.AIOConsumer`` is ``confluent_kafka.aio.AIOConsumer`` with KIP-333:
the same awaitable calls, coroutine callbacks, and executor.

Run against the embedded cluster (nothing to install):
    python examples/asyncio_consumer.py
or against your own Kafka:
    python examples/asyncio_consumer.py --bootstrap-servers localhost:9092
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

from confluent_kafka import Producer

from fastrebalance import TopicPartition
from fastrebalance.aio import AIOConsumer
from fastrebalance.testing import EmbeddedKafka

BACKLOG = 5000


async def run(bootstrap: str, topic: str) -> int:
    group = f"example-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(BACKLOG):  # yesterday's records: the backlog
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
    crashed = AIOConsumer(dict(conf))
    await crashed.assign([TopicPartition(topic, 0, 0)])
    await crashed.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    await crashed.close()

    async def on_assign(consumer: AIOConsumer, partitions: list[TopicPartition]) -> None:
        print("assigned", [(tp.topic, tp.partition) for tp in partitions])

    consumer = AIOConsumer(dict(conf))
    try:
        await consumer.subscribe([topic], on_assign=on_assign)
        seen, first_fresh_at = 0, None
        began = time.monotonic()
        deadline = began + 30
        while not await consumer.catchup_status() and time.monotonic() < deadline:
            # joining the group; the catch-up starts on assignment, and the poll() that
            # assigns may already return the backlog's first record: it counts
            msg = await consumer.poll(0.1)
            seen += msg is not None and not msg.error()
        producer.produce(topic, value=b"fresh!", partition=0)  # after the restart
        producer.flush()
        while seen < BACKLOG + 1 and time.monotonic() < deadline:
            for msg in await consumer.consume(500, 0.5):
                if msg.error():
                    continue
                seen += 1
                if msg.value() == b"fresh!":
                    first_fresh_at = seen
            await consumer.commit(asynchronous=False)  # everything handed out
        print(f"delivered {seen} records in {time.monotonic() - began:.1f} s;"
              f" the fresh one came #{first_fresh_at}")
        print(f"child consumer alive (on standby): {await consumer.child_consumer_is_alive()}")
    finally:
        await consumer.close()
    return 0 if seen == BACKLOG + 1 and first_fresh_at is not None and first_fresh_at < seen else 1


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
        return asyncio.run(run(bootstrap, topic))


if __name__ == "__main__":
    raise SystemExit(main())
