"""DeserializingConsumer and its asyncio twin without a broker: the surface, the config
keys, and what poll()/consume() hand out when a record cannot be deserialized."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import confluent_kafka
import confluent_kafka.aio
import pytest
from confluent_kafka import Message
from confluent_kafka.error import (
    ConsumeError,
    KafkaError,
    KeyDeserializationError,
    ValueDeserializationError,
)
from confluent_kafka.serialization import MessageField, SerializationContext

from fastrebalance import Consumer, DeserializingConsumer
from fastrebalance.aio import AIOConsumer, AsyncDeserializingConsumer

DEAD = {"group.id": "g", "bootstrap.servers": "127.0.0.1:1"}
ON = {**DEAD, "enable.parallel.rebalance": True}


def _upper(data: bytes | None, ctx: SerializationContext) -> Any:
    assert data is not None
    if data.startswith(b"bad"):
        raise ValueError(f"cannot read {data!r} ({ctx.field})")
    return data.decode().upper()


class _Inner:
    """Stands in for the inner fastrebalance.Consumer: poll() returns the given records."""

    def __init__(self, records: list[Message | None]) -> None:
        self.records = records

    def poll(self, timeout: float = -1) -> Message | None:
        return self.records.pop(0)

    def close(self) -> None:
        pass


def _msg(offset: int, key: bytes, value: bytes) -> Message:
    return Message(topic="t", partition=0, offset=offset, key=key, value=value)


def test_every_method_of_consumer_and_of_confluent_s_deserializing_consumer_exists():
    ours = {n for n in dir(DeserializingConsumer) if not n.startswith("_")}
    for theirs in (Consumer, confluent_kafka.DeserializingConsumer):
        names = {n for n in dir(theirs) if not n.startswith("_")}
        assert names <= ours, names - ours
    assert DeserializingConsumer.commitSync is DeserializingConsumer.commit_sync
    d = DeserializingConsumer
    assert d.childConsumerIsAlive is d.child_consumer_is_alive
    assert inspect.signature(DeserializingConsumer.commit) == inspect.signature(Consumer.commit)


@pytest.mark.parametrize("conf", [DEAD, ON], ids=["mode off", "mode on"])
def test_forwarded_methods_reach_the_inner_consumer(conf):
    with DeserializingConsumer({**conf, "value.deserializer": _upper}) as c:
        assert c.assignment() == []
        assert c.child_consumer_is_alive() is False
        assert c.catchup_status() == {}
        assert "DeserializingConsumer" in repr(c)
    c.close()  # again: nothing


def test_consume_is_not_implemented_as_in_confluent_kafka():
    theirs = confluent_kafka.DeserializingConsumer(dict(DEAD))
    try:
        with pytest.raises(NotImplementedError):
            theirs.consume()
    finally:
        theirs.close()
    with DeserializingConsumer(dict(ON)) as c, pytest.raises(NotImplementedError):
        c.consume(10, 1.0)


def test_poll_deserializes_key_and_value_in_place():
    c = DeserializingConsumer({**DEAD, "key.deserializer": _upper, "value.deserializer": _upper})
    try:
        c._consumer = _Inner([_msg(5, b"k", b"v"), None])
        m = c.poll(0)
        assert m is not None
        assert (m.key(), m.value()) == ("K", "V")
        assert (m.deserialized_key(), m.deserialized_value()) == ("K", "V")
        assert c.poll(0) is None
    finally:
        c._consumer = _Inner([])


@pytest.mark.parametrize(
    "key, value, error, field",
    [
        (b"bad-k", b"v", KeyDeserializationError, MessageField.KEY),
        (b"k", b"bad-v", ValueDeserializationError, MessageField.VALUE),
    ],
)
def test_a_record_that_fails_is_raised_with_its_raw_bytes(key, value, error, field):
    c = DeserializingConsumer({**DEAD, "key.deserializer": _upper, "value.deserializer": _upper})
    c._consumer = _Inner([_msg(7, key, value)])
    with pytest.raises(error) as info:
        c.poll(0)
    raw = info.value.kafka_message
    assert (raw.offset(), raw.key(), raw.value()) == (7, key, value)  # nothing half-decoded
    assert field in str(info.value.__cause__)


def test_an_error_event_is_a_consume_error():
    event = Message(topic="t", partition=0, error=KafkaError(KafkaError._PARTITION_EOF))
    c = DeserializingConsumer({**DEAD, "value.deserializer": _upper})
    c._consumer = _Inner([event])
    with pytest.raises(ConsumeError) as info:
        c.poll(0)
    assert info.value.kafka_message is event
    assert info.value.args[0].code() == KafkaError._PARTITION_EOF


class _Closing:
    def __init__(self) -> None:
        self.closed = 0

    def __call__(self, data: bytes | None, ctx: SerializationContext) -> Any:
        return data

    def close(self) -> None:
        self.closed += 1


class _Builder:
    """A ``.builder``: takes its own key out of the config it is handed."""

    def __init__(self) -> None:
        self.built: list[_Closing] = []

    def build(self, conf: dict[str, Any], is_key: bool) -> tuple[_Closing, dict[str, Any]]:
        self.built.append(_Closing())
        conf.pop("my.registry.url", None)
        return self.built[-1], conf


def test_a_built_deserializer_is_closed_with_the_consumer_a_given_one_is_not():
    given, builder = _Closing(), _Builder()
    conf = {
        **ON,
        "key.deserializer": given,
        "value.deserializer.builder": builder,
        "my.registry.url": "mock://x",  # librdkafka would refuse it: the builder took it
    }
    before = dict(conf)
    c = DeserializingConsumer(conf)
    assert conf == before, "the application's dict is not modified"
    c.close()
    c.close()
    assert [d.closed for d in builder.built] == [1] and given.closed == 0


def test_a_deserializer_and_its_builder_both_set_are_refused():
    with pytest.raises(ValueError, match=r"value\.deserializer\.builder"):
        DeserializingConsumer(
            {**DEAD, "value.deserializer": _upper, "value.deserializer.builder": _Builder()}
        )


def test_rebalance_callbacks_receive_the_deserializing_consumer():
    c = DeserializingConsumer(dict(DEAD))
    try:
        seen: list[Any] = []
        relay = c._relay(lambda consumer, parts: seen.append(consumer))
        assert relay is not None
        relay(c._consumer, [])
        assert seen == [c]
        assert c._relay(None) is None
    finally:
        c.close()


# -- the asyncio twin -------------------------------------------------------------------------
def test_the_asyncio_twin_mirrors_confluent_kafka_s():
    assert issubclass(AsyncDeserializingConsumer, AIOConsumer)
    theirs = confluent_kafka.aio.AsyncDeserializingConsumer
    names = {n for n in dir(theirs) if not n.startswith("_")}
    assert names <= set(dir(AsyncDeserializingConsumer))

    async def run() -> None:
        c = await AsyncDeserializingConsumer({**ON, "value.deserializer": _upper})
        try:
            assert isinstance(c, AsyncDeserializingConsumer)
            assert await c.child_consumer_is_alive() is False
            assert await c is c  # awaited again: the same consumer
        finally:
            await c.close()
        await c.close()

    asyncio.run(run())


def test_async_consume_loses_nothing_of_a_batch_to_one_bad_record():
    """Batch 10, 11, bad 12, 13: consume() returns 10 and 11, the next call raises for 12
    (delivered inside the exception), the next returns 13; each record counts as received
    (claimable by a bare commit) only when the application has it."""

    async def run() -> None:
        c = await AsyncDeserializingConsumer({**ON, "value.deserializer": _upper})
        received: list[int] = []
        batch = [_msg(10, b"k", b"a"), _msg(11, b"k", b"b"), _msg(12, b"k", b"bad")]
        batch.append(_msg(13, b"k", b"d"))

        async def fetch(method: str, *args: Any, **kwargs: Any) -> Any:
            out, batch[:] = list(batch), []
            return out

        c._fetch = fetch  # type: ignore[method-assign]
        c._consumer._received = lambda got: received.extend(m.offset() for m in got)  # type: ignore[method-assign]
        try:
            first = await c.consume(10, 0)
            assert [(m.offset(), m.value()) for m in first] == [(10, "A"), (11, "B")]
            assert received == [10, 11]
            with pytest.raises(ValueDeserializationError) as info:
                await c.consume(10, 0)
            assert info.value.kafka_message.offset() == 12
            assert info.value.kafka_message.value() == b"bad"
            assert received == [10, 11, 12]
            rest = await c.poll(0)
            assert rest is not None and (rest.offset(), rest.value()) == (13, "D")
            assert received == [10, 11, 12, 13]
            assert await c.consume(10, 0) == []
        finally:
            await c.close()

    asyncio.run(run())


def test_async_records_of_a_cancelled_decode_are_kept_raw_for_the_next_call():
    async def run() -> None:
        gate = asyncio.Event()
        calls: list[bytes] = []

        async def slow(data: bytes | None, ctx: SerializationContext) -> Any:
            assert data is not None
            calls.append(data)
            if len(calls) == 2:
                await gate.wait()
            return data.decode()

        c = await AsyncDeserializingConsumer({**ON, "value.deserializer": slow})
        batch = [_msg(1, b"k", b"a"), _msg(2, b"k", b"b")]
        received: list[int] = []

        async def fetch(method: str, *args: Any, **kwargs: Any) -> Any:
            out, batch[:] = list(batch), []
            return out

        c._fetch = fetch  # type: ignore[method-assign]
        c._consumer._received = lambda got: received.extend(m.offset() for m in got)  # type: ignore[method-assign]
        try:
            task = asyncio.ensure_future(c.consume(10, 0))
            for _ in range(10_000):
                if len(calls) >= 2:
                    break
                await asyncio.sleep(0)
            assert len(calls) >= 2, calls
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert received == []
            gate.set()
            got = await c.consume(10, 0)
            assert [(m.offset(), m.value()) for m in got] == [(1, "a"), (2, "b")]
            assert received == [1, 2]
        finally:
            await c.close()

    asyncio.run(run())
