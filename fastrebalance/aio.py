"""``AIOConsumer``: the asyncio twin of ``fastrebalance.Consumer``.

A drop-in for ``confluent_kafka.aio.AIOConsumer``: it *is* that class (a subclass, with
the same constructor, awaitable methods, executor and re-entrancy model), holding a
``fastrebalance.Consumer`` where confluent-kafka's holds a ``confluent_kafka.Consumer``,
plus the KIP-333 calls (``child_consumer_is_alive()``, ``catchup_status()``, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Message, TopicPartition
from confluent_kafka.aio import AIOConsumer as _AIOConsumer
from confluent_kafka.aio import _common

from ._consumer import CatchupStatus, Consumer

__all__ = ["AIOConsumer"]

# the identity confluent-kafka's per-handle call gate admits (see _child.call_bounded)
from confluent_kafka.cimpl import _reentry_identity_var as _GATE_IDENTITY

Key = tuple[str, int]


class AIOConsumer(_AIOConsumer):
    """``confluent_kafka.aio.AIOConsumer`` with KIP-333 faster rebalancing.

    Args:
        consumer_conf: a ``fastrebalance.Consumer`` config (confluent-kafka's keys plus
            ``enable.parallel.rebalance`` and ``parallel.rebalance.*``). Its callbacks
            (``error_cb``, ``stats_cb``, ``throttle_cb``, ``on_commit``, ``logger``) and the
            rebalance callbacks given to ``subscribe()`` are coroutines run on the event
            loop, as confluent-kafka's AIOConsumer runs them.
        max_workers: size of the executor created when none is given.
        executor: the executor every blocking call runs on.

    Thread ownership: every call runs on one of the executor's worker threads, as in
    confluent-kafka's AIOConsumer. Calls are serialized here, because the facade keeps
    Python state beside its two librdkafka handles: a call starts when the previous one
    has *finished* (even if its awaiting caller was cancelled), and for its duration its
    worker thread owns the facade and both handles. A call made from a callback of the
    call in flight (``on_assign`` awaiting ``assign()``) belongs to that call and runs at
    once, on another worker while the first one waits for the callback, as confluent-kafka
    admits it at its own per-handle gate; so the executor needs two workers or more.

    Cancellation: an awaiting ``poll()``/``consume()`` that is cancelled leaves its call to
    finish; the records it returns are kept and handed out, in order, by the next
    ``poll()``/``consume()``, and until then no ``commit()`` without arguments (nor the
    auto-commit) claims them.
    """

    def __init__(
        self,
        consumer_conf: dict[str, Any],
        max_workers: int = 100,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        # confluent-kafka's constructor, with our Consumer: the executor, then the config's
        # callbacks wrapped to run on this event loop, then the consumer.
        self._closed = False
        self._owns_executor = False
        if executor is not None:
            self.executor = executor
        else:
            if max_workers < 1:
                raise ValueError("max_workers must be at least 1")
            self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)
            self._owns_executor = True
        loop = asyncio.get_running_loop()
        _common.wrap_common_callbacks(loop, consumer_conf)
        _common.wrap_conf_callback(loop, consumer_conf, "on_commit")
        self._consumer: Consumer = Consumer(consumer_conf)  # type: ignore[assignment]
        self._serial = asyncio.Lock()
        # One identity at confluent-kafka's per-handle gate for every top-level call (they
        # never overlap: self._serial): a synchronous commit abandoned after its bound keeps
        # the gate on a helper thread under the identity of the call that made it, and a
        # fresh identity per call made the next call wait for the broker (a poll(1.0) took
        # 60 s on a paused broker); the sync facade's owner thread is one identity too.
        self._identity = _common.ReentryContext.get_or_generate_id()
        # Records of poll()/consume() calls whose caller was cancelled, to hand out next.
        self._stash: deque[Message] = deque()

    # -- serialization --------------------------------------------------------------------
    async def _call(self, blocking_task: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _GATE_IDENTITY.get():
            # made from a callback of the call in flight, which holds the serialization
            return await super()._call(blocking_task, *args, **kwargs)
        call = asyncio.ensure_future(self._serialized(blocking_task, *args, **kwargs))
        # A cancelled caller leaves the call to finish, still serialized: the facade is
        # never used by two calls at once.
        return await asyncio.shield(call)

    async def _serialized(
        self, blocking_task: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        async with self._serial:
            token = _GATE_IDENTITY.set(self._identity)  # this task's context only
            try:
                return await super()._call(blocking_task, *args, **kwargs)
            finally:
                _GATE_IDENTITY.reset(token)

    # -- reading ----------------------------------------------------------------------------
    async def _take(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call = asyncio.ensure_future(self._call(self._consumer._hand, method, *args, **kwargs))
        try:
            got = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(self._keep)
            raise
        self._consumer._received(got)
        return got

    def _keep(self, call: asyncio.Future[Any]) -> None:
        """The records of a call whose caller was cancelled: handed out next."""
        if call.cancelled() or call.exception() is not None:
            return
        got = call.result()
        if isinstance(got, list):
            self._stash.extend(got)
        elif got is not None:
            self._stash.append(got)

    def _handed(self, msgs: list[Message]) -> list[Message]:
        self._consumer._received(msgs)
        return msgs

    async def poll(self, *args: Any, **kwargs: Any) -> Any:
        """As confluent-kafka's (see its performance note: prefer consume())."""
        if self._stash:
            return self._handed([self._stash.popleft()])[0]
        return await self._take("poll", *args, **kwargs)

    async def consume(self, *args: Any, **kwargs: Any) -> Any:
        """As confluent-kafka's; records of a cancelled call come first."""
        if self._stash:
            num = args[0] if args else kwargs.get("num_messages", 1)
            out = [self._stash.popleft() for _ in range(min(num, len(self._stash)))]
            return self._handed(out)
        return await self._take("consume", *args, **kwargs)

    # -- KIP-333 --------------------------------------------------------------------------
    async def child_consumer_is_alive(self) -> bool:
        """KIP-333's childConsumerIsAlive() (see ``Consumer.child_consumer_is_alive``)."""
        return bool(await self._call(self._consumer.child_consumer_is_alive))

    childConsumerIsAlive = child_consumer_is_alive

    async def catchup_status(self) -> dict[Key, CatchupStatus]:
        """See ``Consumer.catchup_status``."""
        result: dict[Key, CatchupStatus] = await self._call(self._consumer.catchup_status)
        return result

    async def catchup_metrics(self) -> dict[str, Any]:
        """See ``Consumer.catchup_metrics``."""
        result: dict[str, Any] = await self._call(self._consumer.catchup_metrics)
        return result

    async def commit_sync(
        self, message: Message[Any, Any] | None = None, offsets: list[TopicPartition] | None = None
    ) -> list[TopicPartition] | None:
        """KIP-333's commitSync(): commit(..., asynchronous=False)."""
        result: list[TopicPartition] | None = await self.commit(
            message=message, offsets=offsets, asynchronous=False
        )
        return result

    async def commit_async(
        self, message: Message[Any, Any] | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """KIP-333's commitAsync(): commit(..., asynchronous=True)."""
        await self.commit(message=message, offsets=offsets, asynchronous=True)

    commitSync = commit_sync
    commitAsync = commit_async
