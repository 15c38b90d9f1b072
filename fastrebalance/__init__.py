"""fastrebalance: KIP-333 faster rebalancing for confluent-kafka consumers.

``from fastrebalance import Consumer`` is a drop-in for ``confluent_kafka.Consumer``;
set ``enable.parallel.rebalance=true`` so that, after a crash or a rebalance, fresh
records flow at once while a child consumer catches up on the backlog in parallel.
"""

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from ._consumer import CatchupStatus, Consumer

__version__ = "0.1.0"

__all__ = [
    "CatchupStatus",
    "Consumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "TopicPartition",
    "__version__",
]
