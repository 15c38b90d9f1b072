"""Small helpers shared by the integration tests: produce, drain, read a group's offsets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition

from fastrebalance._retry import call_with_retries


def produce(bootstrap: str, topic: str, count: int, partition: int = 0, start: int = 0) -> None:
    """Append ``count`` records whose values are their sequence numbers as text."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        p.produce(topic, value=str(i).encode(), partition=partition)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """How long ``fn()`` took, with its result or the exception it raised (measured after
    the call returns: a time bound checked on anything else cannot fail)."""
    started = time.monotonic()
    try:
        outcome = fn()
    except Exception as exc:
        outcome = exc
    return time.monotonic() - started, outcome


def base_conf(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.parallel.rebalance": True,
        "parallel.rebalance.lag.threshold": 10,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(extra)
    return conf


def drain(
    consumer: Any,
    until: Callable[[list[Any]], bool],
    timeout: float = 30.0,
    on_message: Callable[[Any], None] | None = None,
) -> list[Any]:
    """poll() until ``until(messages)`` holds; fail the test on timeout."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s with {len(got)} records")
        m = consumer.poll(0.2)
        if m is None or m.error() is not None:
            continue
        got.append(m)
        if on_message is not None:
            on_message(m)
    return got


def _committed(bootstrap: str, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
    """What a plain tool reads, retried on the library's retriable errors: a broker just
    resumed answers NOT_COORDINATOR for a moment (seen at load 8 right after SIGCONT)."""
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return call_with_retries(lambda: list(c.committed(tps, timeout=10)), attempts=30)
    finally:
        c.close()


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int = 1) -> list[int]:
    """The offsets Kafka stores for ``group``, read the way any plain tool reads them."""
    tps = _committed(bootstrap, group, [TopicPartition(topic, p) for p in range(partitions)])
    return [tp.offset for tp in tps]


def group_metadata(bootstrap: str, group: str, topic: str, partition: int = 0) -> tuple[int, str]:
    (tp,) = _committed(bootstrap, group, [TopicPartition(topic, partition)])
    return tp.offset, tp.metadata or ""


def close_member(*members: Any, seconds: float = 10.0) -> None:
    """Close *plain* confluent-kafka group members (or ours) the way fastrebalance closes
    its own: leave the group and serve the revoke first. librdkafka 2.16 can drop the reply
    to a rebalance that reaches a group already terminating, and its close() then waits for
    it for ever inside the rebalance callback, holding the GIL (seen hanging the suite on a
    loaded machine, and freezing a whole worker in stop 43). Members of one group close
    together: all unsubscribe, all are polled until none holds a partition (and for a
    second at least, so that a rebalance under way completes on a poll), then each closes;
    closed one by one, a member could close mid-rebalance, waiting on one nobody polls."""
    try:
        for m in members:
            m.unsubscribe()
        settle = time.monotonic() + 1.0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (
            time.monotonic() < settle or any(m.assignment() for m in members)
        ):
            for m in members:
                m.poll(0.05)
    finally:
        for m in members:
            m.close()


def swap_primary(consumer: Any, handle: Any) -> None:
    """Put ``handle`` (a wrapper injecting a fault) in place of a fastrebalance Consumer's
    primary librdkafka handle, in every part that holds it."""
    consumer._primary = handle
    for part in (
        consumer._delivery,
        consumer._committer,
        consumer._assignments,
        consumer._planner,
    ):
        part._primary = handle
    consumer._delivery._primary_poll = handle.poll


def recreate_topic(cluster: Any, topic: str, partitions: int, timeout: float = 60.0) -> None:
    """Delete ``topic`` and create it again, empty: Kafka refuses the creation while the
    deletion is still under way, so it is retried until ``timeout``."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster.create_topic(topic, partitions)
            return
        except RuntimeError:
            assert time.monotonic() < deadline, "the topic could not be created again"
            time.sleep(1)
