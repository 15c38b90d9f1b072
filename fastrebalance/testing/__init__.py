"""Kafka clusters for tests, examples, the demo and the benchmark.

``open_test_cluster()`` picks the backend (see its docstring); ``EmbeddedKafka`` needs nothing
but the confluent-kafka wheel, so tests run on machines without Docker or a broker.
"""

from fastrebalance.testing._clusters import (
    DockerKafka,
    ExternalKafka,
    KafkaCluster,
    docker_available,
    open_test_cluster,
    transactions_supported,
)
from fastrebalance.testing._embedded import EmbeddedKafka

__all__ = [
    "DockerKafka",
    "EmbeddedKafka",
    "ExternalKafka",
    "KafkaCluster",
    "docker_available",
    "open_test_cluster",
    "transactions_supported",
]
