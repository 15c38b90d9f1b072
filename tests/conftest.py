"""Shared fixtures: one Kafka cluster per test session, fresh topics and groups per test.

The cluster is whatever ``open_test_cluster()`` picks (embedded unless the environment says
otherwise); unique names let tests share it without seeing each other's records or groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from uuid import uuid4

import pytest

from fastrebalance.testing import (
    KafkaCluster,
    kip848_supported,
    open_test_cluster,
    transactions_supported,
)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    cluster = open_test_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def topic_factory(kafka_cluster: KafkaCluster) -> Callable[..., str]:
    def make(partitions: int = 1) -> str:
        name = f"t-{uuid4().hex[:10]}"
        kafka_cluster.create_topic(name, partitions)
        return name

    return make


@pytest.fixture
def unique_group() -> str:
    return f"g-{uuid4().hex[:10]}"


@pytest.fixture
def transactional_cluster(kafka_cluster: KafkaCluster) -> KafkaCluster:
    """The session's cluster, if it stores transactional offsets; skip otherwise.

    librdkafka's mock acknowledges TxnOffsetCommit and drops it, so exactly-once end to
    end can only be checked on a real broker (FASTREBALANCE_TEST_BOOTSTRAP or Docker)."""
    ok, why = transactions_supported(kafka_cluster)
    if not ok:
        pytest.skip(why)
    return kafka_cluster


@pytest.fixture(scope="session")
def kip848(kafka_cluster: KafkaCluster) -> tuple[bool, str]:
    """Whether this cluster serves KIP-848 to librdkafka, and why not (asked once)."""
    return kip848_supported(kafka_cluster)


@pytest.fixture
def kip848_cluster(kafka_cluster: KafkaCluster, kip848: tuple[bool, str]) -> KafkaCluster:
    """The session's cluster, if ``group.protocol=consumer`` works on it; skip otherwise
    (Apache Kafka 3.9 serves librdkafka no KIP-848: the embedded cluster and Kafka 4.x do)."""
    if not kip848[0]:
        pytest.skip(kip848[1])
    return kafka_cluster


@pytest.fixture(autouse=True)
def _kip848_cases_need_kip848(request: pytest.FixtureRequest) -> None:
    """A case parametrized with ``protocol="kip848-consumer"`` skips where KIP-848 is not
    served, with the reason; every other case runs as written."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("protocol") == "kip848-consumer":
        supported, why = request.getfixturevalue("kip848")
        if not supported:
            pytest.skip(why)
