"""Argument checks of the facade: a wrongly typed argument is refused with the exception
``confluent_kafka.Consumer`` raises for it, and its text.

With the mode off the methods are confluent-kafka's own, so its C layer refuses such calls;
with the mode on our code reads the arguments first (``message.topic()``,
``timeout <= 0.2``), and without these checks the same mistake surfaced as an
``AttributeError`` or a comparison's ``TypeError`` from inside the library, or passed
silently. An application that catches what confluent-kafka raises must see the same thing
whichever way the mode is set. The checks run before anything changes, as the C layer's do.

Pure: nothing here touches a handle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Message, TopicPartition

__all__ = [
    "callback",
    "config_dict",
    "message",
    "message_or_offsets",
    "partition",
    "partition_list",
    "timeout_s",
    "topic_list",
]


def timeout_s(value: object) -> float:
    """A timeout in seconds read as confluent-kafka's C layer reads one (a real number: a
    float, an int, anything with ``__float__`` or ``__index__``; not text, not None).

    Raises:
        TypeError: ``must be real number, not <type>``, as confluent-kafka's.
        OverflowError: an int too large for a float, as confluent-kafka's.
    """
    if isinstance(value, float):
        return value
    kind = type(value)
    if isinstance(value, str | bytes | bytearray) or not (
        hasattr(kind, "__float__") or hasattr(kind, "__index__")
    ):
        raise TypeError(f"must be real number, not {kind.__name__}")
    return float(value)  # type: ignore[arg-type]


def partition(value: object) -> TopicPartition:
    """Raises: TypeError, as confluent-kafka's for anything but a TopicPartition."""
    if not isinstance(value, TopicPartition):
        raise TypeError("expected cimpl.TopicPartition")
    return value


def partition_list(value: object) -> list[TopicPartition]:
    """A list (not any sequence: confluent-kafka refuses a tuple) of TopicPartition.

    Raises:
        TypeError: ``requires list of TopicPartition``, or ``expected
            cimpl.TopicPartition`` for an element, as confluent-kafka's.
    """
    if not isinstance(value, list):
        raise TypeError("requires list of TopicPartition")
    for item in value:
        partition(item)
    return value


def message(value: object) -> Message | None:
    """Raises: TypeError, as confluent-kafka's for anything but a Message or None."""
    if value is not None and not isinstance(value, Message):
        raise TypeError("expected confluent_kafka.cimpl.Message")
    return value


def message_or_offsets(msg: object, offsets: object, *, required: bool) -> None:
    """``commit()`` and ``store_offsets()`` take one of ``message`` and ``offsets``
    (``store_offsets()`` needs one), checked before their types, in confluent-kafka's order.

    Raises:
        ValueError: both given, or neither where one is required, as confluent-kafka's.
        TypeError: the one given has the wrong type.
    """
    if msg is not None and offsets is not None:
        raise ValueError("message and offsets are mutually exclusive")
    if msg is not None:
        message(msg)
    elif offsets is not None:
        partition_list(offsets)
    elif required:
        raise ValueError("expected either message or offsets")


def callback(name: str, value: object) -> None:
    """A rebalance callback: None (ours: no callback) or callable.

    Raises:
        TypeError: ``<name> expects a callable``, as confluent-kafka's.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{name} expects a callable")


def config_dict(config: object, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer's configuration: a dict, and/or keyword arguments merged into it, as
    confluent-kafka's constructor takes it (a copy: the caller's dict is never changed).

    Raises:
        TypeError: ``expected configuration dict``, for anything but a dict (a string, a
            list of pairs, another mapping) or for no configuration at all.
    """
    if config is None:
        if not kwargs:
            raise TypeError("expected configuration dict")
        return dict(kwargs)
    if not isinstance(config, dict):
        raise TypeError("expected configuration dict")
    return {**config, **kwargs}


def topic_list(value: object) -> list[str]:
    """Raises: TypeError for anything but a list, as confluent-kafka's (which reads each
    topic itself)."""
    if not isinstance(value, list):
        raise TypeError("expected list of topic unicode strings")
    return value
