"""fastrebalance: KIP-333 faster rebalancing for confluent-kafka consumers.

``from fastrebalance import Consumer`` is a drop-in for ``confluent_kafka.Consumer``;
set ``enable.parallel.rebalance=true`` so that, after a crash or a rebalance, fresh
records flow at once while a child consumer catches up on the backlog in parallel.
``DeserializingConsumer`` is the same for ``confluent_kafka.DeserializingConsumer``.
"""

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from ._consumer import CatchupStatus, Consumer
from ._deserializing import DeserializingConsumer

#: The one place the version is written: the build reads it from here (pyproject.toml's
#: [tool.setuptools.dynamic], statically, without importing the package), so the installed
#: metadata and this attribute cannot disagree.
__version__ = "0.1.0"

__all__ = [
    "CatchupStatus",
    "Consumer",
    "DeserializingConsumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "TopicPartition",
    "__version__",
]
