"""Choosing the Kafka cluster that tests, examples, the demo and the benchmark run against."""

from __future__ import annotations

import logging
import os
import re
import uuid
import warnings
from typing import Any, Literal, Protocol, runtime_checkable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
)

from fastrebalance.testing._apache import ApacheKafka, kafka_home
from fastrebalance.testing._embedded import EmbeddedKafka, wait_for_partitions

ClusterKind = Literal["embedded", "docker", "external", "apache"]

BOOTSTRAP_ENV = "FASTREBALANCE_TEST_BOOTSTRAP"
#: A cluster a test may pause and take down (``open_own_cluster()``).
OwnCluster = EmbeddedKafka | ApacheKafka
DOCKER_ENV = "FASTREBALANCE_TEST_DOCKER"


@runtime_checkable
class KafkaCluster(Protocol):
    """What callers may rely on whichever backend ``open_test_cluster()`` picked."""

    bootstrap_servers: str

    @property
    def kind(self) -> ClusterKind: ...

    def create_topic(self, name: str, partitions: int = 1) -> None: ...

    def close(self) -> None: ...


def _admin_create_topic(
    admin: AdminClient, name: str, partitions: int, replication_factor: int, timeout: float
) -> None:
    """Create through the admin API; an existing topic is fine if its partition count matches."""
    future = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )[name]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"could not create topic {name!r}: {exc}") from exc
    wait_for_partitions(admin, name, partitions, timeout)


class ExternalKafka:
    """A cluster someone else runs (``FASTREBALANCE_TEST_BOOTSTRAP``), e.g. a CI service.

    Topics are never deleted: the cluster may be shared and the test topics are uniquely named.
    ``replication_factor=-1`` lets the brokers apply their default.
    """

    kind: Literal["external"] = "external"

    def __init__(
        self, bootstrap_servers: str, *, replication_factor: int = -1, timeout: float = 30.0
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.replication_factor = replication_factor
        self.timeout = timeout
        self._admin: AdminClient | None = AdminClient({"bootstrap.servers": bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        if self._admin is None:
            raise RuntimeError(f"{self!r} is closed")
        _admin_create_topic(self._admin, name, partitions, self.replication_factor, self.timeout)

    def close(self) -> None:
        self._admin = None

    def __enter__(self) -> ExternalKafka:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ExternalKafka(bootstrap_servers={self.bootstrap_servers!r})"


class DockerKafka:
    """A real Apache Kafka broker in a testcontainers container.

    Opt-in only (``FASTREBALANCE_TEST_DOCKER=1``): it is slower to start, and the test timings
    and known differences in our docs were measured against the embedded mock cluster.
    """

    kind: Literal["docker"] = "docker"

    def __init__(self, image: str | None = None, *, timeout: float = 60.0) -> None:
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers < 4.14 ships it at the top level
            from testcontainers.kafka import KafkaContainer

        kwargs: dict[str, Any] = {"image": image} if image else {}
        self.timeout = timeout
        self._container = KafkaContainer(**kwargs)
        self._container.start()
        self.bootstrap_servers: str = self._container.get_bootstrap_server()
        self._admin: AdminClient | None = AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        if self._admin is None:
            raise RuntimeError(f"{self!r} is closed")
        _admin_create_topic(self._admin, name, partitions, 1, self.timeout)

    def close(self) -> None:
        if self._admin is not None:
            self._admin = None
            self._container.stop()

    def __enter__(self) -> DockerKafka:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerKafka(bootstrap_servers={self.bootstrap_servers!r})"


def docker_available(timeout: float = 2.0) -> tuple[bool, str]:
    """Whether a Docker engine answers, and why not.

    A docker CLI or SDK without a reachable daemon is common (CI sandboxes, this repo's dev
    machines), so only a successful ping counts.
    """
    try:
        import docker
    except ImportError:
        return False, "the docker SDK is not installed (pip install 'testcontainers[kafka]')"
    try:
        client = docker.from_env(timeout=max(1, round(timeout)))
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return False, f"no Docker engine answered: {exc}"
    return True, "Docker engine answered ping"


def transactions_supported(cluster: KafkaCluster, timeout: float = 20.0) -> tuple[bool, str]:
    """Whether ``cluster`` stores offsets committed in a transaction, and why not.

    Exactly-once tests need it. librdkafka's mock cluster acknowledges TxnOffsetCommit
    and drops it (it also filters no aborted records under read_committed and checks no
    generation), so on it they would fail for the cluster's sake, not the library's.
    Asked of the cluster, not of its kind: an external cluster may be either.
    """
    topic = f"fastrebalance-txn-probe-{uuid.uuid4().hex[:8]}"
    group = f"{topic}-group"
    cluster.create_topic(topic, 1)
    bs = cluster.bootstrap_servers
    producer = Producer({"bootstrap.servers": bs, "transactional.id": topic})
    member = Consumer({"bootstrap.servers": bs, "group.id": group})
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 1, "probe")], member.consumer_group_metadata(), timeout
        )
        producer.commit_transaction(timeout)
        (tp,) = member.committed([TopicPartition(topic, 0)], timeout=timeout)
    except KafkaException as exc:
        return False, f"transactions failed on this cluster: {exc}"
    finally:
        member.close()
    if tp.offset != 1:
        return False, (
            "this cluster does not store offsets committed in a transaction (librdkafka's "
            "mock cluster acknowledges TxnOffsetCommit and drops it)"
        )
    return True, "offsets committed in a transaction are stored"


def open_own_cluster() -> OwnCluster:
    """A cluster of one test module's own, which it may pause or take down.

    When the suite runs against a real broker (``FASTREBALANCE_TEST_BOOTSTRAP``) and a Kafka
    distribution is at hand (``FASTREBALANCE_KAFKA_HOME``, or ``../shared/kafka`` beside the
    checkout), a real Apache Kafka on a free port, so that the faults hit the broker users run;
    otherwise the embedded cluster, as on a fresh clone.
    """
    if os.environ.get(BOOTSTRAP_ENV, "").strip() and kafka_home() is not None:
        return ApacheKafka()
    return EmbeddedKafka()


def kip848_supported(cluster: KafkaCluster, timeout: float = 10.0) -> tuple[bool, str]:
    """Whether librdkafka can use ``group.protocol=consumer`` (KIP-848) on ``cluster``.

    librdkafka needs ConsumerGroupHeartbeat v1, which Apache Kafka serves from 4.0 (3.9 has
    only v0: a member then never gets an assignment, and nothing reports an error). The broker's
    ApiVersions answer tells it, read from librdkafka's own feature log.
    """
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(f"fastrebalance.probe.{uuid.uuid4().hex[:8]}")
    logger.addHandler(_Keep())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    conf: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "debug": "feature",
        "logger": logger,
    }
    admin = AdminClient(conf)
    admin.list_topics(timeout=timeout)
    admin.poll(0.2)
    versions = [
        int(m.group(1))
        for line in lines
        if (m := re.search(r"ConsumerGroupHeartbeat \(68\) Versions \d+\.\.(\d+)", line))
    ]
    if not versions:
        return False, "the cluster serves no ConsumerGroupHeartbeat: KIP-848 is not available"
    if max(versions) < 1:
        return False, (
            "KIP-848 (group.protocol=consumer) with librdkafka needs ConsumerGroupHeartbeat v1,"
            " served from Apache Kafka 4.0; this cluster serves v0 only (Kafka 3.x)"
        )
    return True, "the cluster serves ConsumerGroupHeartbeat v1"


def open_test_cluster() -> KafkaCluster:
    """The cluster for this run, in the documented order.

    1. ``FASTREBALANCE_TEST_BOOTSTRAP=host:port``: an existing cluster.
    2. A real Apache Kafka in Docker (testcontainers) when a Docker engine answers;
       ``FASTREBALANCE_TEST_DOCKER=0`` opts out.
    3. Otherwise the embedded mock cluster, which needs nothing installed.
    """
    bootstrap = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if bootstrap:
        return ExternalKafka(bootstrap)
    if os.environ.get(DOCKER_ENV, "") != "0":
        ok, reason = docker_available()
        if ok:
            return DockerKafka()
        if os.environ.get(DOCKER_ENV, "") == "1":
            warnings.warn(
                f"{DOCKER_ENV}=1 but {reason}; using the embedded cluster",
                RuntimeWarning,
                stacklevel=2,
            )
    return EmbeddedKafka()


def set_consumer_group_timeouts(
    bootstrap: str, group: str, session_timeout_ms: int, timeout: float = 10.0
) -> tuple[bool, str]:
    """Give one KIP-848 group its own session timeout (and a heartbeat a third of it, at
    most 1 s), as an operator would with ``kafka-configs --entity-type groups``.

    Under ``group.protocol=consumer`` the client cannot set ``session.timeout.ms``: the
    broker's ``group.consumer.session.timeout.ms`` (45 s by default) decides how long a
    SIGKILLed member keeps its partitions. Apache Kafka 4 takes a per-group override
    (``consumer.session.timeout.ms``, IncrementalAlterConfigs on a GROUP resource); the
    embedded cluster has one timeout for every group, set when it starts. Returns whether
    the broker took it, and why not."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    heartbeat_ms = max(100, min(1000, session_timeout_ms // 3))
    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in (
            ("consumer.session.timeout.ms", session_timeout_ms),
            ("consumer.heartbeat.interval.ms", heartbeat_ms),
        )
    ]
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for future in admin.incremental_alter_configs(
            [resource], request_timeout=timeout
        ).values():
            future.result(timeout)
    except (KafkaException, TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""
