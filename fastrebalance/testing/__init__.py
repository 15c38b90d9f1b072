"""Kafka clusters for tests, examples, the demo and the benchmark.

``open_test_cluster()`` picks the backend (see its docstring); ``EmbeddedKafka`` needs nothing
but the confluent-kafka wheel, so tests run on machines without Docker or a broker.
"""

from fastrebalance.testing._apache import ApacheKafka
from fastrebalance.testing._clusters import (
    DockerKafka,
    ExternalKafka,
    KafkaCluster,
    OwnCluster,
    docker_available,
    kip848_supported,
    open_own_cluster,
    open_test_cluster,
    set_consumer_group_timeouts,
    transactions_supported,
)
from fastrebalance.testing._embedded import EmbeddedKafka

__all__ = [
    "ApacheKafka",
    "DockerKafka",
    "EmbeddedKafka",
    "ExternalKafka",
    "KafkaCluster",
    "OwnCluster",
    "docker_available",
    "kip848_supported",
    "open_own_cluster",
    "open_test_cluster",
    "set_consumer_group_timeouts",
    "transactions_supported",
]
