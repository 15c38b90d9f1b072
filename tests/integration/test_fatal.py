"""A fatal error of the primary: nothing more is handed out or committed, as on a plain consumer.

librdkafka reports a fatal consumer error (a static member fenced by another with its
group.instance.id; under the consumer protocol, a subscription the broker refuses) as an
error event from poll()/consume(); from then on its consumer hands out nothing, holds no
assignment and refuses every commit with ``_FATAL``. fastrebalance's child reads another
group: before, it went on handing out the backlog it held (Kafka 4, a regex subscription
refused: 3,670 records in the 20 s after the error; a fenced static member on Kafka 3.9:
3,086; plain confluent-kafka: none).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrebalance import Consumer

from .helpers import base_conf, drain, produce, swap_primary

pytestmark = pytest.mark.integration

FATAL = KafkaError(KafkaError._FATAL, "Fatal error: injected by the test")


def _commit_at(bs: str, group: str, topic: str, offset: int, partitions: int = 1) -> None:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = [TopicPartition(topic, p, offset) for p in range(partitions)]
        deadline = time.monotonic() + 30
        while True:  # a coordinator just created answers NOT_COORDINATOR for a moment
            try:
                c.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()


class _FailedPrimary:
    """The primary handle as librdkafka's after a fatal error: the next poll()/consume()
    returns the error event, then nothing more; commits raise ``_FATAL``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._told = False

    def _event(self) -> list[Message]:
        if self._told:
            return []
        self._told = True
        return [Message(error=FATAL)]

    def poll(self, timeout: float = -1) -> Message | None:
        got = self._event()
        return got[0] if got else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        return self._event()

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("asynchronous", True):
            return None
        raise KafkaException(KafkaError(KafkaError._FATAL, "Commit failed: Local: Fatal error"))

    def assignment(self) -> list[TopicPartition]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _read_after_fatal(
    c: Any, method: str, seconds: float, on_record: Callable[[Message], None] | None = None
) -> tuple[bool, int]:
    """Records handed out after the fatal error event, over ``seconds`` after it."""
    seen_at = None
    after = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if seen_at is not None and time.monotonic() > seen_at + seconds:
            break
        got = c.consume(10, 0.1) if method == "consume" else [c.poll(0.1)]
        for m in got:
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._FATAL and seen_at is None:
                    seen_at = time.monotonic()
                continue
            if seen_at is not None:
                after += 1
            if on_record is not None:
                on_record(m)
    return seen_at is not None, after


@pytest.mark.parametrize("method", ["poll", "consume"])
def test_after_the_primarys_fatal_error_the_backlog_stops_too(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str, method: str
) -> None:
    """The fault is injected at the primary's handle (no cluster makes one on demand):
    its fatal error event, then nothing, as librdkafka's. The child, mid backlog, must
    hand out nothing more either, and no commit writes either log."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 20_000)
    _commit_at(bs, unique_group, topic, 0)
    c = Consumer(base_conf(bs, unique_group))
    try:
        c.subscribe([topic])
        drain(c, lambda got: len(got) >= 50)  # the child is reading the backlog
        assert c._child.active
        c.commit(asynchronous=False)
        child_group = c._child._conf["group.id"]
        before = _committed(bs, child_group, topic)
        swap_primary(c, _FailedPrimary(c._primary))
        seen, after = _read_after_fatal(c, method, 3.0)
        assert seen, "the error event is handed to the application, as plain's is"
        assert after == 0, f"{after} records handed out after the fatal error"
        with pytest.raises(KafkaException) as raised:
            c.commit(asynchronous=False)
        assert raised.value.args[0].code() == KafkaError._FATAL
        assert _committed(bs, child_group, topic) == before
    finally:
        if isinstance(c._primary, _FailedPrimary):
            swap_primary(c, c._primary._inner)
        c.close()


def _committed(bs: str, group: str, topic: str) -> int:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    try:
        return c.committed([TopicPartition(topic, 0)], 10)[0].offset  # type: ignore[no-any-return]
    finally:
        c.close()


@pytest.mark.kafka4
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["fenced", "regex refused"])
def test_a_real_fatal_error_hands_out_no_more_than_plain(
    request: pytest.FixtureRequest,
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    how: str,
) -> None:
    """Side by side with confluent-kafka, on a real broker: ``fenced``, a static member
    replaced by another process with its group.instance.id (classic protocol);
    ``regex refused``, the consumer protocol's broker refusing a change of subscription to a
    regex (Kafka 4: "ConsumerGroupHeartbeat fatal error: Broker: Invalid request")."""
    if getattr(kafka_cluster, "kind", None) == "embedded":
        pytest.skip("the mock cluster neither fences static members nor refuses a regex")
    if how == "regex refused":
        request.getfixturevalue("kip848_cluster")
    bs = kafka_cluster.bootstrap_servers
    topic, other = topic_factory(2), topic_factory(1)
    produce(bs, topic, 20_000, partition=0)
    produce(bs, topic, 20_000, partition=1)
    results = {}
    for name, cls in (("plain", PlainConsumer), ("ours", Consumer)):
        group = f"{unique_group}-{name}"
        _commit_at(bs, group, topic, 0, partitions=2)
        conf = base_conf(bs, group)
        if how == "fenced":
            conf["group.instance.id"] = "static-0"
        else:
            conf["group.protocol"] = "consumer"
            for key in ("session.timeout.ms", "heartbeat.interval.ms"):
                del conf[key]
        if cls is PlainConsumer:
            conf = {k: v for k, v in conf.items() if "parallel" not in k}
        c = cls(conf)
        fencer = None
        try:
            c.subscribe([topic])
            drain(c, lambda got: len(got) >= 20)
            if how == "fenced":
                fencer = PlainConsumer({k: v for k, v in conf.items() if "parallel" not in k})
                fencer.subscribe([topic])
            else:
                c.subscribe([f"^{other}$"])
            delivered: list[Message] = []

            def slowly(m: Message, fencer: Any = fencer, got: list[Message] = delivered) -> None:
                got.append(m)
                if fencer is not None:
                    fencer.poll(0)  # it joins while ours reads
                time.sleep(0.005)  # an application's work: the backlog outlasts the test

            seen, after = _read_after_fatal(c, "poll", 5.0, slowly)
            assert seen, f"{name}: no fatal error in 30 s ({len(delivered)} records)"
            with pytest.raises(KafkaException) as raised:
                c.commit(asynchronous=False)
            assert raised.value.args[0].code() == KafkaError._FATAL
            results[name] = after
        finally:
            c.close()
            if fencer is not None:
                fencer.close()
    assert results == {"plain": 0, "ours": 0}
