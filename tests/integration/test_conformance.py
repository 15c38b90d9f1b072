"""Differential conformance on a broker (issue 44): the same calls on confluent-kafka's
consumer and on ours, mode off and on, compared: return values, exception types and
error codes, and what they leave in the group (committed offsets and metadata).

The part without a broker is tests/conformance/test_no_broker.py. This one runs on the
embedded cluster (``make test``) and on Apache Kafka 3.9 and 4 (``make test-kafka``,
``make test-kafka4``): commit metadata was measured differently there than on the mock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from tests.conformance._differential import FLAVOURS, make, outcome

from .helpers import produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka4, pytest.mark.timeout(300)]

RECORDS = 20


@pytest.fixture
def topic(topic_factory: Callable[..., str], kafka_cluster: Any) -> str:
    name = topic_factory(1)
    produce(kafka_cluster.bootstrap_servers, name, RECORDS)
    return name


def consumer(flavour: str, bootstrap: str, group: str, **extra: Any) -> Any:
    return make(
        flavour,
        **{
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
            **extra,
        },
    )


def first_record(c: Any, seconds: float = 60.0) -> Message:
    """The first record of a topic just made: a loaded machine running both brokers' passes
    took more than 30 s once on Kafka 4 (which consumer it was is not known), so 60 s."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            return m
    if type(c).__module__.startswith("confluent_kafka") or type(c).__module__ == "cimpl":
        # the reference itself read nothing (twice on Kafka 4, the module's first test on
        # a worker): nothing to compare ours with
        pytest.skip(f"confluent-kafka's own consumer read no record in {seconds} s")
    raise AssertionError(f"no record in {seconds} s ({type(c).__module__}.{type(c).__name__})")


def against_confluent(run: Callable[[str], Any]) -> dict[str, Any]:
    got = {f: run(f) for f in FLAVOURS}
    differ = {f: got[f] for f in FLAVOURS[1:] if got[f] != got["confluent"]}
    assert not differ, f"confluent-kafka: {got['confluent']}, ours: {differ}"
    return got


# -- 4: commit metadata round-trips, "" included ---------------------------------------------
@pytest.mark.parametrize("metadata", [None, "", "text", "ünï€ ✓"], ids=repr)
def test_commit_metadata_round_trips_as_confluent_kafka_s(
    kafka_cluster: Any, topic: str, unique_group: str, metadata: str | None
) -> None:
    def run(flavour: str) -> tuple[Any, ...]:
        c = consumer(flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}")
        try:
            c.assign([TopicPartition(topic, 0)])
            first_record(c)
            offset = TopicPartition(topic, 0, 7)
            if metadata is not None:
                offset = TopicPartition(topic, 0, 7, metadata)
            c.commit(offsets=[offset], asynchronous=False)
            (got,) = c.committed([TopicPartition(topic, 0)], timeout=30)
            return got.offset, got.metadata, got.error
        finally:
            c.close()

    got = against_confluent(run)
    assert got["on"] == (7, metadata, None)


# -- 5: hand-built messages, asynchronous commits of nothing ----------------------------------
def test_hand_built_messages_and_asynchronous_commits_of_nothing(
    kafka_cluster: Any, topic: str, unique_group: str
) -> None:
    def run(flavour: str) -> dict[str, Any]:
        c = consumer(flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}")
        try:
            c.assign([TopicPartition(topic, 0)])
            first_record(c)
            built = {
                "full": Message(topic=topic, partition=0, offset=5),
                "topic only": Message(topic=topic),
                "no offset": Message(topic=topic, partition=0),
                "error": Message(
                    topic=topic, partition=0, offset=5, error=KafkaError(KafkaError._PARTITION_EOF)
                ),
            }
            out = {}
            for name, m in built.items():
                out[f"commit {name}"] = outcome(lambda m=m: c.commit(message=m))
                out[f"store {name}"] = outcome(lambda m=m: c.store_offsets(message=m))
            for name, offsets in {
                "logical": [TopicPartition(topic, 0)],
                "empty": [],
            }.items():
                out[f"async {name}"] = outcome(lambda o=offsets: c.commit(offsets=o))
                out[f"sync {name}"] = outcome(
                    lambda o=offsets: c.commit(offsets=o, asynchronous=False)
                )
            return out
        finally:
            c.close()

    got = against_confluent(run)
    assert got["on"]["commit full"] == ("returned", None)
    assert got["on"]["async logical"] == ("returned", None)


# -- a sequence: what it returns and what it leaves in the group ------------------------------
def test_a_consume_commit_sequence_leaves_the_same_group_offsets(
    kafka_cluster: Any, topic: str, unique_group: str
) -> None:
    def run(flavour: str) -> list[Any]:
        group = f"{unique_group}-{flavour}"
        c = consumer(flavour, kafka_cluster.bootstrap_servers, group)
        steps: list[Any] = []
        try:
            c.assign([TopicPartition(topic, 0)])
            steps.append(outcome(c.assignment))
            got: list[Message] = []
            deadline = time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                got += [m for m in c.consume(5 - len(got), 0.5) if m.error() is None]
            steps.append([m.offset() for m in got])
            steps.append(outcome(lambda: c.commit(message=got[-1], asynchronous=False)[0].offset))
            steps.append(outcome(lambda: c.committed([TopicPartition(topic, 0)], timeout=30)))
            steps.append(outcome(lambda: c.position([TopicPartition(topic, 0)])))
            steps.append(outcome(lambda: c.store_offsets(message=got[-1])))
            steps.append(outcome(lambda: c.committed([TopicPartition(topic, 0)], timeout=30)))
            steps.append(outcome(lambda: c.get_watermark_offsets(TopicPartition(topic, 0), 30)))
            steps.append(outcome(c.unassign))
            steps.append(outcome(c.assignment))
        finally:
            c.close()
        steps.append(outcome(c.close))
        steps.append(outcome(c.assignment))
        return steps

    against_confluent(run)


# -- callbacks that raise ---------------------------------------------------------------------
class Boom(Exception):
    pass


def _poll_until_boom(c: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            c.poll(0.2)
        except Boom:
            return True
    return False


@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_an_on_assign_that_raises_leaves_poll_and_the_consumer_goes_on(
    kafka_cluster: Any, topic: str, unique_group: str, protocol: str
) -> None:
    kip848 = protocol == "kip848-consumer"  # (skips where not served: tests/conftest.py)
    group_conf = {"group.protocol": "consumer"} if kip848 else {"session.timeout.ms": 6000}

    def run(flavour: str) -> list[Any]:
        raised = []

        def on_assign(consumer: Any, partitions: list[TopicPartition]) -> None:
            if not raised:
                raised.append(True)
                (consumer.incremental_assign if kip848 else consumer.assign)(partitions)
                raise Boom("on_assign")

        c = consumer(
            flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}", **group_conf
        )
        try:
            c.subscribe([topic], on_assign=on_assign)
            out = [_poll_until_boom(c), first_record(c).topic() == topic]
        finally:
            out.append(outcome(c.close))
        return out

    against_confluent(run)


@pytest.mark.parametrize("key", ["stats_cb", "on_commit"])
def test_a_callback_that_raises_leaves_poll_and_close_closes(
    kafka_cluster: Any, topic: str, unique_group: str, key: str
) -> None:
    def run(flavour: str) -> list[Any]:
        def cb(*_args: Any) -> None:
            raise Boom(key)

        extra = {key: cb, "statistics.interval.ms": 100 if key == "stats_cb" else 0}
        c = consumer(flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}", **extra)
        c.assign([TopicPartition(topic, 0)])
        m = None
        deadline = time.monotonic() + 30
        while m is None and time.monotonic() < deadline:
            with contextlib.suppress(Boom):
                m = c.poll(0.2)
        assert m is not None and m.error() is None
        if key == "on_commit":
            c.commit(message=m)
        out = [_poll_until_boom(c)]
        with contextlib.suppress(Boom):  # confluent-kafka's raises one pending; it closed
            c.close()
        out.append(outcome(lambda: c.poll(0)))
        out.append(outcome(c.close))
        return out

    got = against_confluent(run)
    assert got["on"][0] is True


@pytest.mark.xfail(strict=True, reason="known difference, not fixed yet (issue 44's report)")
def test_known_difference_a_stored_offset_below_the_committed_one(
    kafka_cluster: Any, topic: str, unique_group: str
) -> None:
    """librdkafka commits a stored offset only above the committed one (a bare commit()
    after storing a lower one raises _NO_OFFSET); with the mode on it is written (a
    rewind)."""

    def run(flavour: str) -> tuple[Any, ...]:
        c = consumer(flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}")
        try:
            c.assign([TopicPartition(topic, 0)])
            first_record(c)
            c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
            c.store_offsets(offsets=[TopicPartition(topic, 0, 3)])
            return outcome(lambda: c.commit(asynchronous=False))
        finally:
            c.close()

    against_confluent(run)


@pytest.mark.xfail(strict=True, reason="known difference, not fixed yet (issue 44's report)")
def test_known_difference_a_synchronous_commit_of_a_message_returns_what_was_stored(
    kafka_cluster: Any, topic: str, unique_group: str
) -> None:
    """confluent-kafka returns the offsets it committed; with the mode on, a commit of a
    record that leaves the safe offset where it was returns []."""

    def run(flavour: str) -> tuple[Any, ...]:
        c = consumer(flavour, kafka_cluster.bootstrap_servers, f"{unique_group}-{flavour}")
        try:
            c.assign([TopicPartition(topic, 0)])
            first_record(c)
            m = Message(topic=topic, partition=0, offset=5)
            return outcome(lambda: c.commit(message=m, asynchronous=False))
        finally:
            c.close()

    against_confluent(run)
