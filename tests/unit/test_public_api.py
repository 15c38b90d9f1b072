"""The public face: pinned, so a change to it is a deliberate one."""

from __future__ import annotations

import inspect

import confluent_kafka
import pytest

import fastrebalance
from fastrebalance import Consumer


def test_exported_names_are_pinned():
    assert sorted(fastrebalance.__all__) == sorted(
        [
            "CatchupStatus",
            "Consumer",
            "DeserializingConsumer",
            "KafkaError",
            "KafkaException",
            "Message",
            "TopicPartition",
            "__version__",
        ]
    )
    assert fastrebalance.TopicPartition is confluent_kafka.TopicPartition
    assert fastrebalance.KafkaException is confluent_kafka.KafkaException
    assert fastrebalance.KafkaError is confluent_kafka.KafkaError


def test_every_confluent_consumer_method_exists():
    theirs = {n for n in dir(confluent_kafka.Consumer) if not n.startswith("_")}
    ours = {n for n in dir(Consumer) if not n.startswith("_")}
    assert theirs <= ours, theirs - ours
    assert {"__enter__", "__exit__"} <= set(dir(Consumer))


@pytest.mark.parametrize(
    "kip, snake",
    [
        ("commitSync", "commit_sync"),
        ("commitAsync", "commit_async"),
        ("childConsumerIsAlive", "child_consumer_is_alive"),
    ],
)
def test_kip_names_are_twins_of_snake_case(kip, snake):
    assert getattr(Consumer, kip) is getattr(Consumer, snake)


def test_keyword_signatures_match_confluent_kafka():
    sig = inspect.signature(Consumer.commit)
    assert list(sig.parameters)[1:] == ["message", "offsets", "asynchronous"]
    assert sig.parameters["asynchronous"].default is True
    assert list(inspect.signature(Consumer.subscribe).parameters)[1:] == [
        "topics",
        "on_assign",
        "on_revoke",
        "on_lost",
    ]
    assert list(inspect.signature(Consumer.consume).parameters)[1:] == [
        "num_messages",
        "timeout",
    ]


def test_disabled_consumer_needs_no_broker_and_is_confluent_kafka():
    c = Consumer({"group.id": "g", "bootstrap.servers": "127.0.0.1:1"})
    try:
        assert c._reader is c._primary  # poll()/consume(): one frame, then its own
        # no bound method copied onto the instance: a subclass's override runs (issue 44)
        methods = {n for n, v in vars(Consumer).items() if callable(v)}
        assert methods >= {"poll", "consume", "commit", "assign", "unassign"}
        assert not set(vars(c)) & methods
        assert not c.child_consumer_is_alive()
        assert "plain" in repr(c)
    finally:
        c.close()
    c.close()  # idempotent


def test_enabled_without_group_id_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"group\.id"):
        Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.parallel.rebalance": True})


def test_the_asyncio_twin_is_confluent_kafka_s_with_the_kip_333_calls():
    import asyncio

    import confluent_kafka.aio

    from fastrebalance.aio import AIOConsumer

    assert issubclass(AIOConsumer, confluent_kafka.aio.AIOConsumer)
    theirs = {n for n in dir(confluent_kafka.aio.AIOConsumer) if not n.startswith("_")}
    assert theirs <= set(dir(AIOConsumer))
    for name in ("child_consumer_is_alive", "catchup_status", "commit_sync", "commit_async"):
        assert asyncio.iscoroutinefunction(getattr(AIOConsumer, name)), name
    assert AIOConsumer.childConsumerIsAlive is AIOConsumer.child_consumer_is_alive
    their_init = inspect.signature(confluent_kafka.aio.AIOConsumer.__init__)
    assert list(inspect.signature(AIOConsumer.__init__).parameters) == list(their_init.parameters)
