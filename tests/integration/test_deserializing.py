"""DeserializingConsumer and AsyncDeserializingConsumer on a cluster, with confluent-kafka's
Schema Registry serdes (Avro, JSON Schema, Protobuf) against its in-process mock registry.

Each story has a backlog (read by the child) and fresh records (the primary's), and a
record that cannot be deserialized counts as delivered: a bare commit claims it, and a
restart goes on after it, neither re-reading nor skipping anything else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer
from confluent_kafka.error import ValueDeserializationError
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fastrebalance import DeserializingConsumer, TopicPartition
from fastrebalance.aio import AsyncDeserializingConsumer

from .helpers import base_conf, group_offsets

pytestmark = pytest.mark.integration

AVRO = """{"type": "record", "name": "User", "namespace": "fastrebalance.test",
 "fields": [{"name": "name", "type": "string"}, {"name": "n", "type": "long"}]}"""
JSON_SCHEMA = """{"title": "User", "type": "object", "required": ["name", "n"],
 "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}"""


def _protobuf_user() -> Any:
    """A ``User`` message class made at run time from its FileDescriptorProto (no
    generated code): ``string name = 1; int64 n = 2;``."""
    pool = descriptor_pool.Default()
    name = "fastrebalance.test.User"
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        pass
    field = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="fastrebalance_test_user.proto", package="fastrebalance.test", syntax="proto3"
    )
    user = fdp.message_type.add(name="User")
    user.field.add(name="name", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    user.field.add(name="n", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


Serde = tuple[Callable[[int], Any], Any, Any, Callable[[Any], tuple[str, int]]]


def _serdes(kind: str, registry: SchemaRegistryClient) -> Serde:
    """(make the n-th object, serializer, deserializer, the object as (name, n))."""
    if kind == "avro":
        return (
            lambda n: {"name": f"user-{n}", "n": n},
            AvroSerializer(registry, AVRO),
            AvroDeserializer(registry),
            lambda obj: (obj["name"], obj["n"]),
        )
    if kind == "json":
        return (
            lambda n: {"name": f"user-{n}", "n": n},
            JSONSerializer(JSON_SCHEMA, registry),
            JSONDeserializer(JSON_SCHEMA, schema_registry_client=registry),
            lambda obj: (obj["name"], obj["n"]),
        )
    user = _protobuf_user()
    conf = {"use.deprecated.format": False}
    return (
        lambda n: user(name=f"user-{n}", n=n),
        ProtobufSerializer(user, registry, conf),
        ProtobufDeserializer(user, conf),
        lambda obj: (obj.name, obj.n),
    )


def _registry(group: str) -> SchemaRegistryClient:
    # new_client(): the constructor itself speaks HTTP, mock:// URLs included
    return SchemaRegistryClient.new_client({"url": f"mock://{group}"})


def _produce(
    bs: str, topic: str, offsets: range, serializer: Any, make: Callable[[int], Any], bad=()
) -> None:
    """Records at ``offsets`` (from an empty or known log end), serialized; those in
    ``bad`` are raw bytes no deserializer reads (no magic byte)."""
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5})
    ctx = SerializationContext(topic, MessageField.VALUE)
    for n in offsets:
        value = b"not a registry record" if n in bad else serializer(make(n), ctx)
        p.produce(topic, key=str(n).encode(), value=value, partition=0)
    assert p.flush(30) == 0


def _crash_with_committed(bs: str, group: str, topic: str, committed: int) -> None:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
    c.close()


def _poll_until(
    c: DeserializingConsumer, wanted: set[int], timeout: float = 30.0
) -> tuple[dict[int, Any], list[ValueDeserializationError]]:
    """poll() until every offset of ``wanted`` came, as a record or inside an error."""
    got: dict[int, Any] = {}
    errors: list[ValueDeserializationError] = []
    deadline = time.monotonic() + timeout
    while not wanted <= set(got) | {e.kafka_message.offset() for e in errors}:
        assert time.monotonic() < deadline, f"missing {sorted(wanted - set(got))[:5]}"
        try:
            m = c.poll(0.2)
        except ValueDeserializationError as exc:
            errors.append(exc)
            continue
        if m is not None:
            assert m.offset() not in got, f"{m.offset()} delivered twice"
            got[m.offset()] = m.value()
    return got, errors


@pytest.mark.parametrize("kind", ["avro", "json", "protobuf"])
def test_backlog_and_fresh_records_come_back_as_objects(
    kafka_cluster, topic_factory, unique_group, kind
):
    """Crash with 0 committed, log end 40: the child reads [0, 40) while the primary
    delivers 40..44, produced after the restart; every value is the object serialized."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    make, serializer, deserializer, fields = _serdes(kind, _registry(unique_group))
    _produce(bs, topic, range(40), serializer, make)
    _crash_with_committed(bs, unique_group, topic, 0)
    conf = base_conf(bs, unique_group, **{"value.deserializer": deserializer})
    with DeserializingConsumer(conf) as c:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status()[(topic, 0)].pending_ranges == ((0, 40),)
        _produce(bs, topic, range(40, 45), serializer, make)
        got, errors = _poll_until(c, set(range(45)))
        assert not errors
        assert {n: fields(v) for n, v in got.items()} == {n: (f"user-{n}", n) for n in range(45)}
        c.commit(asynchronous=False)
    assert group_offsets(bs, unique_group, topic) == [45]


def _restart_delivers(bs: str, group: str, topic: str, deserializer: Any, expected: range):
    """A new member of the group is handed exactly ``expected`` (nothing claimed comes
    again, nothing unclaimed is missing)."""
    conf = base_conf(bs, group, **{"value.deserializer": deserializer})
    with DeserializingConsumer(conf) as c:
        c.assign([TopicPartition(topic, 0)])
        got, errors = _poll_until(c, set(expected))
        assert not errors
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # and nothing more
            m = c.poll(0.1)
            assert m is None, m.offset()
        assert sorted(got) == list(expected)


def test_a_backlog_record_that_fails_counts_as_delivered(
    kafka_cluster, topic_factory, unique_group
):
    """Crash with 0 committed, log end 30, the record at 12 unreadable: the child
    delivers 0..11, then poll() raises for 12 with the raw record; a bare commit claims
    0..12 (the group stores 13), and a restart delivers 13..29, never 12."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    make, serializer, deserializer, _ = _serdes("avro", _registry(unique_group))
    _produce(bs, topic, range(30), serializer, make, bad={12})
    _crash_with_committed(bs, unique_group, topic, 0)
    conf = base_conf(bs, unique_group, **{"value.deserializer": deserializer})
    with DeserializingConsumer(conf) as c:
        c.assign([TopicPartition(topic, 0)])
        got, errors = _poll_until(c, set(range(13)))
        (error,) = errors
        raw = error.kafka_message
        assert (raw.offset(), raw.value()) == (12, b"not a registry record")
        assert sorted(got) == list(range(12))
        # the child's record: the primary started at the log end
        status = c.catchup_status()[(topic, 0)]
        assert status.pending_ranges and status.pending_ranges[0][1] == 30
        c.commit(asynchronous=False)
        assert c.committed([TopicPartition(topic, 0)])[0].offset == 13
    assert group_offsets(bs, unique_group, topic) == [13]
    _restart_delivers(bs, unique_group, topic, deserializer, range(13, 30))


def test_a_fresh_record_that_fails_counts_as_delivered(kafka_cluster, topic_factory, unique_group):
    """No backlog (committed 5 = log end); fresh records 5..11 with 8 unreadable: poll()
    raises for 8, a bare commit claims it (the group stores 9), a restart delivers 9..11."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    make, serializer, deserializer, _ = _serdes("json", _registry(unique_group))
    _produce(bs, topic, range(5), serializer, make)
    _crash_with_committed(bs, unique_group, topic, 5)
    conf = base_conf(bs, unique_group, **{"value.deserializer": deserializer})
    with DeserializingConsumer(conf) as c:
        c.assign([TopicPartition(topic, 0)])
        assert c.catchup_status() == {}, "no backlog: the primary's records only"
        _produce(bs, topic, range(5, 12), serializer, make, bad={8})
        got, errors = _poll_until(c, set(range(5, 9)))
        (error,) = errors
        assert error.kafka_message.offset() == 8
        assert sorted(got) == [5, 6, 7]
        c.commit(asynchronous=False)
    assert group_offsets(bs, unique_group, topic) == [9]
    _restart_delivers(bs, unique_group, topic, deserializer, range(9, 12))


def test_async_twin_backlog_with_a_bad_record_mid_batch(kafka_cluster, topic_factory, unique_group):
    """The asyncio twin, Protobuf: crash with 0 committed, log end 30, 12 unreadable.
    consume() never hands out a batch past 12 with it: the record raises in its own call
    (delivered), the records after it come next; a bare commit right after the exception
    claims 0..12 only, and a restart delivers 13..29."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    make, serializer, deserializer, fields = _serdes("protobuf", _registry(unique_group))
    _produce(bs, topic, range(30), serializer, make, bad={12})
    _crash_with_committed(bs, unique_group, topic, 0)

    async def run() -> None:
        conf = base_conf(bs, unique_group, **{"value.deserializer": deserializer})
        c = await AsyncDeserializingConsumer(conf)
        try:
            await c.assign([TopicPartition(topic, 0)])
            got: dict[int, Any] = {}
            deadline = time.monotonic() + 30
            while 12 not in got:
                assert time.monotonic() < deadline, sorted(got)
                try:
                    for m in await c.consume(100, 0.2):
                        got[m.offset()] = fields(m.value())
                except ValueDeserializationError as exc:
                    got[exc.kafka_message.offset()] = None
                    assert sorted(got) == list(range(13)), "12 comes after 0..11, alone"
                    await c.commit(asynchronous=False)
                    (tp,) = await c.committed([TopicPartition(topic, 0)])
                    assert tp.offset == 13, "the records kept for the next call are not claimed"
            assert {n: v for n, v in got.items() if n != 12} == {
                n: (f"user-{n}", n) for n in range(12)
            }
        finally:
            await c.close()

    asyncio.run(run())
    assert group_offsets(bs, unique_group, topic) == [13]
    _restart_delivers(bs, unique_group, topic, deserializer, range(13, 30))
