"""What the conformance suite compares: the same call on confluent-kafka's consumer and on
ours (mode off and on), reduced to an outcome that must be equal.

An outcome is the value returned (``TopicPartition`` lists as tuples, a ``Message`` as its
coordinates) or the exception raised: its type, and for a ``KafkaException`` its error
code (confluent-kafka prefixes some texts, "Commit failed: ..."), else its text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaException, Message, TopicPartition

import fastrebalance

#: The consumers compared: confluent-kafka's, and ours with the mode off and on.
FLAVOURS = ("confluent", "off", "on")
#: Nothing listens there: the "no broker" cases (librdkafka retries it quietly).
UNREACHABLE = "127.0.0.1:1"


def base_class(flavour: str) -> type:
    return confluent_kafka.Consumer if flavour == "confluent" else fastrebalance.Consumer


def config(flavour: str, **conf: Any) -> dict[str, Any]:
    """``conf`` with the mode key of ``flavour`` (none for confluent-kafka's)."""
    out: dict[str, Any] = {"log_level": 0, **conf}
    if flavour != "confluent":
        out["enable.parallel.rebalance"] = flavour == "on"
    return out


def make(flavour: str, cls: type | None = None, **conf: Any) -> Any:
    return (cls or base_class(flavour))(config(flavour, **conf))


def value(v: Any) -> Any:
    if isinstance(v, TopicPartition):
        return ("tp", v.topic, v.partition, v.offset, v.metadata, v.error)
    if isinstance(v, Message):
        return ("msg", v.topic(), v.partition(), v.offset(), v.error())
    if isinstance(v, list | tuple):
        return tuple(value(x) for x in v)
    if isinstance(v, bytes):  # consumer_group_metadata(): an opaque handle
        return "bytes"
    return v


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", value(call()))
    except KafkaException as exc:
        return ("raised", "KafkaException", exc.args[0].code())
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


def tp(topic: str = "t", partition: int = 0, offset: int | None = None) -> TopicPartition:
    return TopicPartition(topic, partition) if offset is None else TopicPartition(
        topic, partition, offset
    )


#: One call per public method of confluent_kafka.Consumer, with arguments that need no
#: broker to be judged (timeouts short).
CALLS: dict[str, Callable[[Any], Any]] = {
    "assign": lambda c: c.assign([tp()]),
    "assignment": lambda c: c.assignment(),
    "cluster_id": lambda c: c.cluster_id(0.1),
    "commit": lambda c: c.commit(offsets=[tp(offset=3)]),
    "committed": lambda c: c.committed([tp()], 0.1),
    "consume": lambda c: c.consume(1, 0),
    "consumer_group_metadata": lambda c: c.consumer_group_metadata(),
    "get_watermark_offsets": lambda c: c.get_watermark_offsets(tp(), 0.1),
    "incremental_assign": lambda c: c.incremental_assign([tp()]),
    "incremental_unassign": lambda c: c.incremental_unassign([tp()]),
    "list_topics": lambda c: c.list_topics(None, 0.1),
    "memberid": lambda c: c.memberid(),
    "offsets_for_times": lambda c: c.offsets_for_times([tp(offset=5)], 0.1),
    "pause": lambda c: c.pause([tp()]),
    "poll": lambda c: c.poll(0),
    "position": lambda c: c.position([tp()]),
    "resume": lambda c: c.resume([tp()]),
    "seek": lambda c: c.seek(tp(offset=5)),
    "set_sasl_credentials": lambda c: c.set_sasl_credentials("u", "p"),
    "store_offsets": lambda c: c.store_offsets(offsets=[tp(offset=3)]),
    "subscribe": lambda c: c.subscribe(["t"]),
    "unassign": lambda c: c.unassign(),
    "unsubscribe": lambda c: c.unsubscribe(),
    "close": lambda c: c.close(),
}
