"""``DeserializingConsumer``: the twin of ``confluent_kafka.DeserializingConsumer``.

Teams on Avro, Protobuf or JSON Schema read through confluent-kafka's
``DeserializingConsumer`` and the ``confluent_kafka.schema_registry`` deserializers; this
class takes the same config and keeps the same ``poll()`` contract over a
``fastrebalance.Consumer``, so switching is an import.

It holds a ``Consumer`` rather than subclassing confluent-kafka's class, for the reason
``Consumer`` holds its handles (docs/api.md, "Not a subclass"): an inherited librdkafka
handle would be a third, unused consumer. Every method of ``Consumer`` is forwarded to it
by name at call time, because with the mode off the inner ``Consumer`` binds
confluent-kafka's own methods on the instance.

**A record whose deserialization fails counts as delivered**, as in confluent-kafka:
``poll()`` raises ``KeyDeserializationError``/``ValueDeserializationError`` with the raw
record in ``kafka_message``, so the application has it (to dead-letter it, say), and a
bare ``commit()`` claims it with every record handed out before it, whichever stream it
came from (fresh or backlog). An application that wants to stop at the record instead
commits only what it processed (``commit(message=...)`` of the last good one) and seeks
back to it. No record is claimed that the application was not given, in a message or in
an exception.

Thread ownership: as ``Consumer``'s: the inner ``Consumer`` and its handles belong to the
thread that calls this object's methods; the deserializers run on that thread too, inside
``poll()``, and so does the cluster-id lookup some Schema Registry deserializers make
through the inner consumer's ``cluster_id()``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

from confluent_kafka import Message, TopicPartition

# confluent-kafka's own handling of the deserializer keys (a ready-made deserializer or a
# ``.builder``, owned and closed by the consumer when built here): used, not re-written,
# so that a config means the same to both classes. A private module: the unit tests run
# the builder path, so a change to it on upgrade fails there.
from confluent_kafka._serde_builder import (
    SharedClusterIdResolver,
    build_serdes,
    close_serdes,
    pop_serde_props,
    propagate_cluster_id_resolver,
)
from confluent_kafka.error import (
    ConsumeError,
    KeyDeserializationError,
    ValueDeserializationError,
)
from confluent_kafka.serialization import MessageField, SerializationContext

from ._closed import CLOSED
from ._consumer import Consumer

if TYPE_CHECKING:
    # PEP 696 defaults: an unparameterized DeserializingConsumer(conf) infers Any, Any
    from typing_extensions import TypeVar as DefaultTypeVar

    K = DefaultTypeVar("K", default=Any)
    V = DefaultTypeVar("V", default=Any)
else:
    K = TypeVar("K")
    V = TypeVar("V")

__all__ = ["DeserializingConsumer", "decoded", "decoded_async"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


def decoded(msg: Message, key_deserializer: Any, value_deserializer: Any) -> tuple[Any, Any]:
    """The record's key and value through the deserializers, the record left untouched.

    Untouched so that a record whose value fails reaches the application raw (the key is
    not half-decoded in it) and, in the asyncio twin, so that a record put back after a
    cancellation is decoded again from its bytes. The key goes first, as in
    confluent-kafka: a key deserializer may leave state for the value's (the Schema
    Registry's DLQ action).

    Raises:
        KeyDeserializationError, ValueDeserializationError: carrying the raw record.
    """
    ctx = SerializationContext(msg.topic() or "", MessageField.KEY, msg.headers())
    key: Any = msg.key()
    if key_deserializer is not None:
        try:
            key = key_deserializer(key, ctx)
        except Exception as exc:
            raise KeyDeserializationError(exception=exc, kafka_message=msg) from exc
    value: Any = msg.value()
    if value_deserializer is not None:
        ctx.field = MessageField.VALUE
        try:
            value = value_deserializer(value, ctx)
        except Exception as exc:
            raise ValueDeserializationError(exception=exc, kafka_message=msg) from exc
    return key, value


async def _maybe_await(result: Any) -> Any:
    return await result if isinstance(result, Awaitable) else result


async def decoded_async(
    msg: Message, key_deserializer: Any, value_deserializer: Any
) -> tuple[Any, Any]:
    """``decoded()`` for the asyncio twin: a deserializer may be an asyncio one (its call
    returns an awaitable) or a blocking one (run on the event loop, as confluent-kafka's
    AsyncDeserializingConsumer runs it)."""
    ctx = SerializationContext(msg.topic() or "", MessageField.KEY, msg.headers())
    key: Any = msg.key()
    if key_deserializer is not None:
        try:
            key = await _maybe_await(key_deserializer(key, ctx))
        except Exception as exc:
            raise KeyDeserializationError(exception=exc, kafka_message=msg) from exc
    value: Any = msg.value()
    if value_deserializer is not None:
        ctx.field = MessageField.VALUE
        try:
            value = await _maybe_await(value_deserializer(value, ctx))
        except Exception as exc:
            raise ValueDeserializationError(exception=exc, kafka_message=msg) from exc
    return key, value


def _forward(
    method: Callable[Concatenate[Consumer, _P], _R],
) -> Callable[Concatenate[DeserializingConsumer[Any, Any], _P], _R]:
    """``method`` of the inner ``Consumer``, looked up at each call (a subclass of
    ``Consumer`` may override it)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: DeserializingConsumer[Any, Any], /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = getattr(self._consumer, name)(*args, **kwargs)
        return result

    return call


class DeserializingConsumer(Generic[K, V]):
    """``confluent_kafka.DeserializingConsumer`` over a ``fastrebalance.Consumer``.

    Args:
        conf: confluent-kafka's ``DeserializingConsumer`` config: ``key.deserializer`` and
            ``value.deserializer`` (a callable ``(bytes, SerializationContext) -> obj``,
            such as ``confluent_kafka.schema_registry.avro.AvroDeserializer``), or their
            ``.builder`` counterparts; the rest is a ``fastrebalance.Consumer`` config
            (``enable.parallel.rebalance``, ``parallel.rebalance.*`` included). Not
            modified.

    Raises:
        ValueError: a deserializer and its builder both configured; what
            ``fastrebalance.Consumer`` raises for the rest of the config.

    Deserializers built here from a ``.builder`` are closed by :meth:`close`; ready-made
    ones stay the application's.
    """

    # Before (or without: a subclass whose __init__ skips ours) __init__: every method is
    # confluent-kafka's "Consumer closed", and close() succeeds, as there (see _closed).
    _consumer: Consumer = CLOSED
    _owned_serdes: list[Any] = []  # read, never changed in place

    def __init__(self, conf: dict[str, Any]) -> None:
        specs, rest = pop_serde_props(conf, "key.deserializer", "value.deserializer")
        serdes, self._owned_serdes, rest = build_serdes(specs, rest)
        self._key_deserializer, self._value_deserializer = serdes
        try:
            # The inner consumer. Owner: the thread calling this object's methods.
            self._consumer = Consumer(rest)
            # resolved lazily, by a deserializer on its first lookup, on the owner thread
            resolver = SharedClusterIdResolver(self._consumer.cluster_id)
            propagate_cluster_id_resolver(resolver, serdes)
        except BaseException:
            owned, self._owned_serdes = self._owned_serdes, []
            with contextlib.suppress(Exception):  # the construction error is the one to report
                close_serdes(owned)
            raise

    # -- reading ------------------------------------------------------------------------------
    def poll(self, timeout: float = -1) -> Message[K, V] | None:
        """One record (fresh first, as ``Consumer.poll()``), its key and value deserialized
        in place: ``key()``/``value()`` and ``deserialized_key()``/``deserialized_value()``
        return the objects.

        Args:
            timeout: seconds to wait; negative: no limit.

        Returns:
            The record, or None when the timeout passed with none.

        Raises:
            KeyDeserializationError, ValueDeserializationError: the record could not be
                deserialized; ``kafka_message`` is the raw record, which counts as
                delivered (a bare ``commit()`` claims it: see the module's docstring).
            ConsumeError: ``poll()`` returned an error event (``kafka_message`` holds it).
        """
        msg = self._consumer.poll(timeout)
        if msg is None:
            return None
        error = msg.error()
        if error is not None:
            raise ConsumeError(error, kafka_message=msg)
        key, value = decoded(msg, self._key_deserializer, self._value_deserializer)
        msg.set_key(key)
        msg.set_value(value)
        return msg  # type: ignore[return-value]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message[K, V]]:
        """Not implemented, as in confluent-kafka's ``DeserializingConsumer``: use
        :meth:`poll`. (A batch cannot raise for its one bad record without taking the
        others from the application.)

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError

    # -- subscription ---------------------------------------------------------------------------
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """As ``Consumer.subscribe()``; the callbacks receive this consumer, as
        confluent-kafka's receive its ``DeserializingConsumer``."""
        self._consumer.subscribe(
            topics, self._relay(on_assign), self._relay(on_revoke), self._relay(on_lost)
        )

    def _relay(self, cb: RebalanceCallback | None) -> RebalanceCallback | None:
        if not callable(cb):
            return cb  # None, or what Consumer.subscribe() refuses with its own error
        return lambda _inner, partitions: cb(self, partitions)

    # -- every other method: the inner Consumer's -------------------------------------------------
    assign = _forward(Consumer.assign)
    assignment = _forward(Consumer.assignment)
    incremental_assign = _forward(Consumer.incremental_assign)
    incremental_unassign = _forward(Consumer.incremental_unassign)
    unassign = _forward(Consumer.unassign)
    unsubscribe = _forward(Consumer.unsubscribe)
    commit = _forward(Consumer.commit)
    commit_sync = _forward(Consumer.commit_sync)
    commit_async = _forward(Consumer.commit_async)
    commitSync = commit_sync
    commitAsync = commit_async
    store_offsets = _forward(Consumer.store_offsets)
    committed = _forward(Consumer.committed)
    send_offsets_to_transaction = _forward(Consumer.send_offsets_to_transaction)
    commit_transaction = _forward(Consumer.commit_transaction)
    abort_transaction = _forward(Consumer.abort_transaction)
    position = _forward(Consumer.position)
    seek = _forward(Consumer.seek)
    pause = _forward(Consumer.pause)
    resume = _forward(Consumer.resume)
    get_watermark_offsets = _forward(Consumer.get_watermark_offsets)
    offsets_for_times = _forward(Consumer.offsets_for_times)
    list_topics = _forward(Consumer.list_topics)
    memberid = _forward(Consumer.memberid)
    consumer_group_metadata = _forward(Consumer.consumer_group_metadata)
    cluster_id = _forward(Consumer.cluster_id)
    set_sasl_credentials = _forward(Consumer.set_sasl_credentials)
    child_consumer_is_alive = _forward(Consumer.child_consumer_is_alive)
    childConsumerIsAlive = child_consumer_is_alive
    catchup_status = _forward(Consumer.catchup_status)
    catchup_metrics = _forward(Consumer.catchup_metrics)
    metrics_snapshot = _forward(Consumer.metrics_snapshot)

    # -- close --------------------------------------------------------------------------------
    def close(self) -> None:
        """``Consumer.close()``, then the deserializers built from a ``.builder`` (with the
        Schema Registry clients they made). Safe to call again; if the consumer's close
        raises, the deserializers are kept (it may still use them) for the next call."""
        self._consumer.close()
        owned, self._owned_serdes = self._owned_serdes, []
        close_serdes(owned)

    def __enter__(self) -> DeserializingConsumer[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastrebalance.DeserializingConsumer over {self._consumer!r}>"
