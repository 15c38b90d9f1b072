"""The embedded cluster and the backend chooser: round trips, pause, lifetime, fallbacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from uuid import uuid4

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import fastrebalance.testing
from fastrebalance.testing import (
    DockerKafka,
    EmbeddedKafka,
    ExternalKafka,
    KafkaCluster,
    docker_available,
    open_test_cluster,
)

pytestmark = pytest.mark.integration

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(fastrebalance.testing.__file__)))


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedKafka]:
    """A cluster of our own: these tests pause it, which must not hurt the session cluster."""
    with EmbeddedKafka() as kafka:
        yield kafka


def produce(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(10) == 0


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 15.0):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid4().hex[:10]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.2):
                assert message.error() is None, message.error()
                records.append(message)
    finally:
        consumer.close()
    return records


def partition_count(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return len(metadata.topics[topic].partitions)


def round_trip(bootstrap: str, topic: str, partitions: int, count: int = 100) -> None:
    produce(bootstrap, topic, partitions, count)
    records = consume(bootstrap, topic, partitions, count)
    assert sorted(m.value() for m in records) == sorted(f"v{i}".encode() for i in range(count))
    expected = Counter(i % partitions for i in range(count))
    assert Counter(m.partition() for m in records) == expected


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (killed but not yet reaped by init) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_round_trip_three_partitions(embedded: EmbeddedKafka) -> None:
    assert embedded.bootstrap_servers.startswith("127.0.0.1:")
    assert isinstance(embedded, KafkaCluster)
    embedded.create_topic("round-trip", 3)
    assert partition_count(embedded.bootstrap_servers, "round-trip") == 3
    round_trip(embedded.bootstrap_servers, "round-trip", 3)


def test_create_topic_failure_names_the_topic(embedded: EmbeddedKafka) -> None:
    embedded.create_topic("twice", 2)
    with pytest.raises(RuntimeError, match="'twice'"):
        embedded.create_topic("twice", 2)


def test_pause_resume_keeps_data(embedded: EmbeddedKafka) -> None:
    embedded.create_topic("paused", 2)
    produce(embedded.bootstrap_servers, "paused", 2, 10)

    embedded.pause()
    try:
        assert embedded.paused and "paused" in repr(embedded)
        admin = AdminClient({"bootstrap.servers": embedded.bootstrap_servers})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=0.5)  # the broker no longer answers
        time.sleep(0.5)
    finally:
        embedded.resume()

    embedded.ping()
    assert len(consume(embedded.bootstrap_servers, "paused", 2, 10)) == 10


def test_broker_down_and_up(embedded: EmbeddedKafka) -> None:
    if not embedded.c_api:
        pytest.skip(f"fault injection needs the C mock API: {embedded.c_api_error}")
    embedded.broker_down(1)
    try:
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": embedded.bootstrap_servers}).list_topics(timeout=1)
    finally:
        embedded.broker_up(1)
    AdminClient({"bootstrap.servers": embedded.bootstrap_servers}).list_topics(timeout=5)


def test_server_exits_on_close() -> None:
    with EmbeddedKafka() as kafka:
        pid = kafka.pid
        assert alive(pid)
    assert "closed" in repr(kafka)
    assert not alive(pid)
    kafka.close()  # idempotent


_CHILD = """
import sys, threading, time
from fastrebalance.testing import EmbeddedKafka
if sys.argv[1] == "from-thread":
    box = []
    thread = threading.Thread(target=lambda: box.append(EmbeddedKafka()))
    thread.start()
    thread.join()
    kafka = box[0]
else:
    kafka = EmbeddedKafka()
if sys.argv[1] == "paused":
    kafka.pause()
print(kafka.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("mode", ["running", "paused", "from-thread"])
def test_server_exits_when_parent_is_killed(mode: str) -> None:
    """Running: stdin EOF (and, on Linux, the parent-death signal) ends the server. Paused: only
    the parent-death signal can. From a thread: no parent-death signal, stdin EOF alone."""
    if mode == "paused" and not sys.platform.startswith("linux"):
        pytest.skip("a paused server only dies with its parent on Linux (PR_SET_PDEATHSIG)")
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        server_pid = int(child.stdout.readline())
        assert alive(server_pid)
    finally:
        child.kill()
        child.wait()
    assert wait_until(lambda: not alive(server_pid), timeout=10), f"server {server_pid} lingers"


def test_fallback_without_c_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTREBALANCE_MOCK_C_API", "0")
    with EmbeddedKafka() as kafka:
        assert not kafka.c_api
        assert kafka.c_api_error
        kafka.create_topic("four", 4)
        round_trip(kafka.bootstrap_servers, "four", 4, count=20)
        with pytest.raises(RuntimeError, match=r"'three'.*4-partition"):
            kafka.create_topic("three", 3)
        with pytest.raises(RuntimeError, match="C mock API"):
            kafka.broker_down(1)


def test_session_fixtures(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str], unique_group: str
) -> None:
    topic = topic_factory(2)
    assert topic != topic_factory(2)
    assert unique_group.startswith("g-")
    assert partition_count(kafka_cluster.bootstrap_servers, topic) == 2
    round_trip(kafka_cluster.bootstrap_servers, topic, 2, count=10)


def test_open_test_cluster_choice(embedded: EmbeddedKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTREBALANCE_TEST_BOOTSTRAP", embedded.bootstrap_servers)
    cluster = open_test_cluster()
    assert isinstance(cluster, ExternalKafka) and cluster.kind == "external"
    cluster.close()

    monkeypatch.delenv("FASTREBALANCE_TEST_BOOTSTRAP")
    monkeypatch.setenv("FASTREBALANCE_TEST_DOCKER", "1")
    if docker_available()[0]:
        pytest.skip("a Docker engine is available; the fallback path is not reachable")
    with pytest.warns(RuntimeWarning, match="embedded"):
        cluster = open_test_cluster()
    try:
        assert isinstance(cluster, EmbeddedKafka) and cluster.kind == "embedded"
    finally:
        cluster.close()


@pytest.mark.docker
def test_docker_backend() -> None:
    ok, reason = docker_available()
    if not ok:
        pytest.skip(reason)
    with DockerKafka() as kafka:
        kafka.create_topic("docker-round-trip", 3)
        round_trip(kafka.bootstrap_servers, "docker-round-trip", 3)
