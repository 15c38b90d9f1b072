"""Which partitions a query reads: ``subscribe``, ``subscribePattern`` or ``assign``.

Pure (no Kafka): the driver hands it the cluster's metadata and gets back the partitions, so
that the three forms behave as in Spark's Kafka source and can be tested without a broker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Subscription", "parse_subscription"]

TopicPartitionKey = tuple[str, int]

_KINDS = ("subscribe", "subscribePattern", "assign")


@dataclass(frozen=True)
class Subscription:
    """One of Spark's three ways to name what to read.

    ``subscribe``: a fixed list of topics, all their partitions (new ones too).
    ``subscribePattern``: every topic whose whole name matches the regular expression (a
    Java regex in Spark; Python's ``re`` here, the same for the usual ``orders-.*``), topics
    created later too; internal topics (``__consumer_offsets``...) never match.
    ``assign``: fixed partitions, nothing else, ever.
    """

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartitionKey, ...] = ()

    def covers_topic(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "assign":
            return any(t == topic for t, _ in self.assigned)
        return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None

    def select(self, metadata: Mapping[str, Iterable[int]]) -> list[TopicPartitionKey]:
        """The partitions to read, from ``{topic: partitions}`` of the cluster, sorted."""
        if self.kind == "assign":
            return sorted(tp for tp in self.assigned if tp[1] in set(metadata.get(tp[0], ())))
        return sorted(
            (topic, p)
            for topic, parts in metadata.items()
            if self.covers_topic(topic)
            for p in parts
        )

    def missing(self, metadata: Mapping[str, Iterable[int]]) -> list[TopicPartitionKey]:
        """Assigned partitions the cluster does not have (``assign`` only)."""
        if self.kind != "assign":
            return []
        return sorted(tp for tp in self.assigned if tp[1] not in set(metadata.get(tp[0], ())))

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "assign":
            return f"assign={sorted(self.assigned)}"
        return f"subscribePattern={self.pattern}"


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    """From lower-cased options: exactly one of the three, as Spark's Kafka source requires."""
    given = [k for k in _KINDS if k.lower() in options]
    if len(given) != 1:
        raise ValueError(
            "exactly one of the options subscribe, subscribePattern and assign must be set"
            f" (as in Spark's Kafka source); got {given or 'none'}"
        )
    kind = given[0]
    raw = options[kind.lower()].strip()
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise ValueError("option subscribe must list at least one topic, comma-separated")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        if not raw:
            raise ValueError("option subscribePattern must be a regular expression")
        try:
            re.compile(raw)
        except re.error as exc:
            raise ValueError(f"option subscribePattern={raw!r} is not a regex: {exc}") from None
        return Subscription(kind, pattern=raw)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError(
            f'option assign={raw!r} must be a JSON object like {{"topicA": [0, 1], "topicB": [2]}}'
        )
    assigned: set[TopicPartitionKey] = set()
    for topic, parts in parsed.items():
        if not isinstance(parts, list) or not all(type(p) is int and p >= 0 for p in parts):
            raise ValueError(f"option assign: the partitions of {topic!r} must be a list of ints")
        assigned.update((topic, p) for p in parts)
    if not assigned:
        raise ValueError("option assign names no partition")
    return Subscription(kind, assigned=tuple(sorted(assigned)))
