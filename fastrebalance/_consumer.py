"""``Consumer``: a drop-in for ``confluent_kafka.Consumer`` implementing KIP-333.

With ``enable.parallel.rebalance=false`` (the default) every public method is the
primary handle's own bound method: the same behaviour at the same speed.

With it on, a partition gained with a backlog larger than the threshold is read
by two consumers: the *primary* (the user's group member) jumps to the log end
so fresh records flow at once, and the *child* reads the skipped range
``[committed, log end)`` until it reaches its end. ``poll()``/``consume()`` merge
both, fresh first; ``commit()`` routes each offset to the stream it came from and
writes both commit logs; the user's group only ever stores the safe offset.

Thread ownership: the primary and child librdkafka handles are both owned by the
thread that calls this object's methods, exactly as a ``confluent_kafka.Consumer``
is; do not share one ``Consumer`` between threads. Rebalance callbacks run inside
``poll()``/``consume()`` on that same thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as _RdConsumer

from ._child import Child, ChildState, call_bounded
from ._config import ParallelConfig, child_config, split_config
from ._ranges import RangeSet
from ._retry import Budget, call_with_retries
from ._state import PartitionState, plan_assignment, restore
from ._token import TokenTooLargeError, encode_group_token

__all__ = ["CatchupStatus", "Consumer"]

log = logging.getLogger("fastrebalance.consumer")
_monotonic = time.monotonic  # a global lookup, not an attribute one, on the hot path

Key = tuple[str, int]
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

#: While both streams have records, at least one delivered record in this many
#: comes from the child: fresh records keep priority, the backlog never starves.
CHILD_SHARE = 8
#: Longest single wait on the primary while the child may have records, seconds.
_SLICE_S = 0.01
#: Longest single wait on the primary when the child is idle: a rebalance inside
#: that wait may start a catch-up, which must not wait for the user's whole timeout.
_IDLE_SLICE_S = 0.2
#: Broker round trips made on the user's behalf (committed offsets, watermarks).
_REQUEST_TIMEOUT_S = 10.0
#: All the round trips that plan one assignment (both commit logs, the watermarks) share
#: this: they run inside a rebalance callback, so they hold the user's poll().
_PLAN_BUDGET_S = 30.0

#: Errors meaning the partition does not exist (any more).
_UNKNOWN = (
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)

_PASSTHROUGH = (
    "assign", "assignment", "close", "cluster_id", "commit", "committed", "consume",
    "consumer_group_metadata", "get_watermark_offsets", "incremental_assign",
    "incremental_unassign", "list_topics", "memberid", "offsets_for_times", "pause", "poll",
    "position", "resume", "seek", "set_sasl_credentials", "store_offsets", "unassign",
    "unsubscribe",
)  # fmt: skip


@dataclass(frozen=True)
class CatchupStatus:
    """Catch-up progress of one partition, as ``catchup_status()`` reports it.

    Attributes:
        pending_ranges: backlog ranges ``[start, end)`` not yet committed as processed.
        child_position: next offset the child will deliver; None when it is not
            reading this partition (finished, or never needed).
        records_remaining: offsets pending at or after ``child_position``.
        child_alive: the child consumer exists and is running (reading or standby).
    """

    pending_ranges: tuple[tuple[int, int], ...]
    child_position: int | None
    records_remaining: int
    child_alive: bool


def _socket_timeout_s(conf: dict[str, Any]) -> float:
    try:
        return max(int(conf.get("socket.timeout.ms", 60000)), 10) / 1000.0
    except (TypeError, ValueError):  # librdkafka has already rejected such a value
        return 60.0


def _rest(timeout: float | None, since: float) -> float | None:
    """What is left of a poll()/consume() timeout that started at ``since``."""
    if timeout is None or timeout < 0:
        return None  # wait forever, as confluent-kafka does
    return max(timeout - (_monotonic() - since), 0.0)


def _key(tp: TopicPartition) -> Key:
    return (tp.topic, tp.partition)


def _tp(key: Key, offset: int, metadata: str | None = None) -> TopicPartition:
    if metadata:
        return TopicPartition(key[0], key[1], offset, metadata=metadata)
    return TopicPartition(key[0], key[1], offset)


class Consumer:
    """A ``confluent_kafka.Consumer`` with KIP-333 faster rebalancing.

    Args:
        config: the confluent-kafka configuration dict, plus our keys
            (``enable.parallel.rebalance``, ``parallel.rebalance.*``; see docs).
        **kwargs: merged into ``config``, as confluent-kafka allows (``logger=``).

    Raises:
        ValueError: one of our keys is invalid or unknown (the message names it).
        KafkaException: librdkafka rejected the rest of the config.
    """

    def __init__(self, config: dict[str, Any] | None = None, /, **kwargs: Any) -> None:
        conf = dict(config or {})
        conf.update(kwargs)
        self._settings: ParallelConfig
        self._settings, primary_conf = split_config(conf)
        user_stats_cb = primary_conf.get("stats_cb")
        child_conf = child_config(primary_conf, self._settings) if self._settings.enabled else {}
        if self._settings.enabled and user_stats_cb is not None:
            # librdkafka calls it from poll(), on the user's thread: our state is safe to read
            primary_conf["stats_cb"] = lambda stats: user_stats_cb(self._merge_stats(stats))
        # The primary handle: the user's group member. Owner: the user's thread.
        self._primary = _RdConsumer(primary_conf)
        self._closed = False
        self._user_callbacks: tuple[Any, Any, Any] = (None, None, None)
        if not self._settings.enabled:
            for name in _PASSTHROUGH:
                if name not in ("close", "subscribe"):
                    setattr(self, name, getattr(self._primary, name))
            self._child: Child | None = None
            return
        self._error_cb = conf.get("error_cb")
        # librdkafka's own network request timeout bounds our synchronous commits, and
        # twice it our close(): with a hung broker librdkafka alone would block forever.
        self._commit_timeout_s = _socket_timeout_s(primary_conf)
        # The child handle, created on the first backlog. Owner: the user's thread.
        self._child = Child(
            child_conf, self._report_deleted, commit_timeout_s=self._commit_timeout_s
        )
        self._stats_at: tuple[float, int] = (time.monotonic(), 0)
        self._states: dict[Key, PartitionState] = {}
        self._stored: dict[Key, int] = {}  # store_offsets() when auto store is off
        self._stored_child: dict[Key, int] = {}
        self._prepared: dict[Key, PartitionState] = {}  # planned during a rebalance
        self._added: dict[Key, tuple[int, int]] = {}  # ranges planned: see Child.retire_stale
        self._in_rebalance = False
        self._assigned_in_callback = False
        self._subscribed = False
        self._fair = 0
        # The child's partitions being read (its own dict, shared): empty in steady state.
        self._reading = self._child._cursors
        self._auto_due = (
            time.monotonic() + self._settings.auto_commit_interval_s
            if self._settings.auto_commit
            else float("inf")
        )

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        mode = "parallel" if self._settings.enabled else "plain"
        return f"<fastrebalance.Consumer {mode} child={self._child_state().value}>"

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _child_state(self) -> ChildState:
        return self._child.state if self._child is not None else ChildState.NOT_STARTED

    def child_consumer_is_alive(self) -> bool:
        """True once the child consumer has started and while it runs (reading a
        backlog or on standby for the next crash); False before any catch-up,
        after close(), and while it restarts after a failure."""
        return self._child is not None and self._child.alive

    childConsumerIsAlive = child_consumer_is_alive

    def catchup_status(self) -> dict[Key, CatchupStatus]:
        """Per assigned (topic, partition) with a backlog: ranges, child progress."""
        if self._child is None:
            return {}
        alive = self._child.alive
        out = {}
        for key, st in self._states.items():
            if not st.ranges:
                continue
            pos = self._child.position(key)
            remaining = st.ranges.copy()
            if st.child_delivered is not None:
                remaining.remove_below(st.child_delivered)
            out[key] = CatchupStatus(st.ranges.as_tuple(), pos, remaining.count(), alive)
        return out

    def _merge_stats(self, stats: str) -> str:
        """librdkafka's statistics JSON plus a ``fastrebalance`` object, so that an
        existing stats pipeline picks up catch-up progress with no new plumbing."""
        try:
            data = json.loads(stats)
        except ValueError:
            return stats
        data["fastrebalance"] = self.catchup_metrics()
        return json.dumps(data)

    def catchup_metrics(self) -> dict[str, Any]:
        """Catch-up counters as plain JSON-ready data (also merged into ``stats_cb``).

        Fresh (primary) record counts are librdkafka's own (``rxmsgs`` in the stats):
        counting them here would put work on the hot path.
        """
        if self._child is None:  # plain mode: nothing to catch up, ever
            return {"version": 1, "child_state": ChildState.NOT_STARTED.value}
        now = time.monotonic()
        delivered = self._child.records_delivered
        then, before = self._stats_at
        rate = (delivered - before) / (now - then) if now > then else 0.0
        self._stats_at = (now, delivered)
        partitions: dict[str, dict[str, Any]] = {}
        for (topic, partition), st in self.catchup_status().items():
            partitions.setdefault(topic, {})[str(partition)] = {
                "pending_ranges": [list(r) for r in st.pending_ranges],
                "records_remaining": st.records_remaining,
                "child_position": st.child_position,
            }
        return {
            "version": 1,
            "child_state": self._child.state.value,
            "child_alive": self._child.alive,
            "child_handles_created": self._child.handles_created,
            "backlog_records_delivered": delivered,
            "backlog_records_per_second": round(rate, 1),
            "ranges": sum(
                len(p["pending_ranges"]) for t in partitions.values() for p in t.values()
            ),
            "records_remaining": sum(
                p["records_remaining"] for t in partitions.values() for p in t.values()
            ),
            "partitions": partitions,
        }

    # ------------------------------------------------------------ subscribe
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """As confluent-kafka's; callbacks receive this Consumer, not the inner handle."""
        self._user_callbacks = (on_assign, on_revoke, on_lost)
        if not self._settings.enabled:
            kwargs = {}
            for name, cb in (
                ("on_assign", on_assign),
                ("on_revoke", on_revoke),
                ("on_lost", on_lost),
            ):
                if cb is not None:
                    kwargs[name] = self._relay(cb)
            self._primary.subscribe(topics, **kwargs)
            return
        self._subscribed = True
        self._primary.subscribe(
            topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _relay(self, cb: RebalanceCallback) -> RebalanceCallback:
        return lambda _handle, partitions: cb(self, partitions)

    def unsubscribe(self) -> None:
        self._primary.unsubscribe()

    # ----------------------------------------------------------- rebalances
    def _on_assign(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance, self._assigned_in_callback = True, False
        try:
            planned = self._prepare(partitions)
            if self._user_callbacks[0] is not None:
                self._user_callbacks[0](self, planned)
            if not self._assigned_in_callback:
                self._apply_assignment(planned, incremental=self._settings.incremental)
        finally:
            self._in_rebalance = False
            self._prepared.clear()
            self._added = {}

    def _on_revoke(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance = True
        try:
            if self._user_callbacks[1] is not None:
                self._user_callbacks[1](self, partitions)
            keys = [_key(tp) for tp in partitions]
            if self._settings.auto_commit:
                self._commit_quietly(self._delivered(keys), asynchronous=False)
            self._forget(keys)
        finally:
            self._in_rebalance = False

    def _on_lost(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        # confluent-kafka calls on_revoke when no on_lost is given: so do we
        user_cb = self._user_callbacks[2] or self._user_callbacks[1]
        if user_cb is not None:
            user_cb(self, partitions)
        keys = [_key(tp) for tp in partitions]
        if self._settings.auto_commit and self._child is not None:
            # The group commit would be fenced; the child's own log still accepts
            # its checkpoints, so the next owner resumes the backlog from there.
            updates = [u for u in self._delivered(keys) if self._is_child_update(u)]
            self._commit_quietly(updates, asynchronous=False, group=False)
        self._forget(keys)

    def _is_child_update(self, update: tuple[Key, int, str | None]) -> bool:
        st = self._states.get(update[0])
        return st is not None and st.is_child_offset(update[1] - 1)

    def _forget(self, keys: list[Key]) -> None:
        assert self._child is not None
        self._child.forget(keys)
        for k in keys:
            self._states.pop(k, None)
            self._stored.pop(k, None)
            self._stored_child.pop(k, None)

    def _prepare(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Read both commit logs and the watermarks; decide each partition's start.

        Returns copies of ``partitions`` with the primary's start offsets filled in
        (the log end for a partition that catches up).
        """
        assert self._child is not None
        if self._closed:
            # An assignment delivered inside close(), revoked right after: planning would
            # only wait on a group that is leaving (librdkafka answers no OffsetFetch while
            # it terminates: 3 timeouts). Nothing is read, so nothing needs a plan.
            for tp in partitions:
                self._prepared[_key(tp)] = PartitionState(None, RangeSet(), None)
            self._added = {}
            return [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        budget = Budget(_PLAN_BUDGET_S)
        self._added = {}
        todo = [tp for tp in partitions if tp.offset in (OFFSET_INVALID, OFFSET_STORED)]
        out = []
        committed: dict[Key, TopicPartition] = {}
        if todo:
            try:
                got = call_with_retries(
                    lambda: self._primary.committed(
                        [TopicPartition(tp.topic, tp.partition) for tp in todo],
                        timeout=budget.request_timeout(_REQUEST_TIMEOUT_S),
                    ),
                    max_seconds=budget.remaining(),
                )
                committed = {_key(tp): tp for tp in got}
            except KafkaException as exc:
                # Without committed offsets there is nothing to plan: let librdkafka
                # resume from them itself, as a plain consumer would.
                log.error("cannot read committed offsets, no catch-up this time: %s", exc)
        needs_child_log = [
            k for k, tp in committed.items() if tp.metadata and tp.metadata.startswith("~fr")
        ]
        checkpoints = {}
        if needs_child_log:
            try:
                raw = call_with_retries(
                    lambda: self._child.handle().committed(
                        [TopicPartition(*k) for k in needs_child_log],
                        timeout=budget.request_timeout(_REQUEST_TIMEOUT_S),
                    ),
                    max_seconds=budget.remaining(),
                )
                checkpoints = {_key(tp): tp for tp in raw}
            except KafkaException as exc:
                log.warning("cannot read the child's commit log; backlog re-read: %s", exc)
        restored_by_key = {}
        for tp in partitions:
            key = _key(tp)
            g = committed.get(key)
            if g is None:
                continue
            c = checkpoints.get(key)
            restored = restore(
                g.offset, g.metadata, c.offset if c else -1, c.metadata if c else None
            )
            if restored.problem:
                log.warning(
                    "%s [%d]: %s; using offset %d", key[0], key[1], restored.problem, g.offset
                )
            elif g.metadata and not g.metadata.startswith("~fr") and g.offset >= 0:
                log.info(
                    "%s [%d]: committed metadata is not a fastrebalance token (another tool's "
                    "or the application's): offset %d used as is, metadata kept",
                    key[0],
                    key[1],
                    g.offset,
                )
            restored_by_key[key] = restored
        watermarks = self._watermarks(
            [k for k, r in restored_by_key.items() if r.position is not None], budget
        )
        for tp in partitions:
            key = _key(tp)
            if key not in restored_by_key:
                self._prepared[key] = PartitionState(None, RangeSet(), None)
                out.append(TopicPartition(tp.topic, tp.partition, tp.offset))
                continue
            start, state, new_range = self._plan_one(key, restored_by_key[key], watermarks.get(key))
            self._prepared[key] = state
            out.append(TopicPartition(tp.topic, tp.partition, start))
            if new_range is not None:
                self._added[key] = new_range
        return out

    def _watermarks(
        self, keys: list[Key], budget: Budget
    ) -> dict[Key, tuple[int, int] | KafkaException]:
        """Both ends of every partition's log: two round trips for the whole assignment.

        ``get_watermark_offsets`` asks per partition, so planning a large assignment cost
        one broker round trip per partition inside the rebalance callback. A ListOffsets
        for the earliest and the latest offsets of all partitions at once answers the same
        question; a partition it has no answer for is asked again on its own, so a
        per-partition error (unknown partition, leader moving) is retried and reported
        exactly as before.
        """
        out: dict[Key, tuple[int, int] | KafkaException] = {}
        if not keys:
            return out
        ends: dict[Key, list[int]] = {k: [] for k in keys}
        spent = KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"planning took its whole {_PLAN_BUDGET_S:g}s")
        )
        try:
            for which in (OFFSET_BEGINNING, OFFSET_END):
                got = call_with_retries(
                    lambda which=which: self._primary.offsets_for_times(
                        [TopicPartition(k[0], k[1], which) for k in keys],
                        timeout=budget.request_timeout(_REQUEST_TIMEOUT_S),
                    ),
                    max_seconds=budget.remaining(),
                )
                for tp in got:
                    if tp.error is None and tp.offset >= 0 and _key(tp) in ends:
                        ends[_key(tp)].append(tp.offset)
        except KafkaException as exc:
            log.debug("batched watermarks failed (%s): asking per partition", exc)
        for key in keys:
            pair = ends[key]
            if len(pair) == 2:
                out[key] = (pair[0], pair[1])
                continue
            if budget.remaining() == 0:
                out[key] = spent
                continue
            try:
                out[key] = call_with_retries(
                    lambda key=key: self._primary.get_watermark_offsets(
                        TopicPartition(*key),
                        timeout=budget.request_timeout(_REQUEST_TIMEOUT_S),
                        cached=False,
                    ),
                    max_seconds=budget.remaining(),
                )
            except KafkaException as exc:
                out[key] = exc
        return out

    def _plan_one(
        self, key: Key, restored: Any, watermarks: tuple[int, int] | KafkaException | None
    ) -> tuple[int, PartitionState, tuple[int, int] | None]:
        """The primary's start, the partition's state, and the range this plan added."""
        if restored.position is None:
            return OFFSET_INVALID, PartitionState(None, RangeSet(), None), None
        if isinstance(watermarks, tuple):
            low, high = watermarks
        else:
            assert watermarks is not None  # asked for every partition with a position
            exc = watermarks
            log.warning("%s [%d]: no watermarks (%s): resuming without a new catch-up", *key, exc)
            low, high = 0, restored.position
            if restored.ranges and exc.args[0].code() in _UNKNOWN:
                self._report(
                    exc.args[0].code(),
                    f"{key[0]} [{key[1]}] is unknown to the cluster (topic deleted?): its "
                    f"pending backlog {restored.ranges.as_tuple()[:5]} cannot be read; it "
                    "stays pending, so the committed offset does not move past it",
                )
        if restored.position > high:
            log.warning(
                "%s [%d]: committed offset %d is beyond the log end %d (committed by hand? "
                "topic recreated? log truncated?): the primary starts there and librdkafka "
                "applies auto.offset.reset; its commits below %d do not move the group offset",
                *key,
                restored.position,
                high,
                restored.position,
            )
        plan = plan_assignment(restored, low, high, self._settings.lag_threshold)
        for start, end in plan.deleted:
            self._report_deleted(key[0], key[1], start, end)
        if plan.caught_up is not None:
            log.info(
                "%s [%d]: committed %d, log end %d: primary starts at %d, child reads [%d, %d)",
                key[0],
                key[1],
                restored.position,
                high,
                plan.start,
                *plan.caught_up,
            )
        assert plan.start is not None
        state = PartitionState(plan.start, plan.ranges, plan.start, restored.user_metadata)
        return plan.start, state, plan.caught_up

    def _apply_assignment(self, planned: list[TopicPartition], incremental: bool) -> None:
        """Hand the planned offsets to the primary, then start the child's ranges."""
        assert self._child is not None
        if incremental:
            self._primary.incremental_assign(planned)
        else:
            self._primary.assign(planned)
            keep = {_key(tp) for tp in planned}
            self._forget([k for k in self._states if k not in keep])
        added, self._added = self._added, {}
        for tp in planned:
            key = _key(tp)
            state = self._prepared.pop(key, None) or PartitionState(None, RangeSet(), None)
            self._states[key] = state
            if state.ranges:
                self._child.start(key, state)
            if key in added and not state.ranges.range_containing(added[key][1] - 1):
                del added[key]  # the application chose its own offset: nothing to read
        if added:
            # After the fetches started (they overlap these round trips), before anything
            # can be committed: we still hold the user's thread.
            self._child.retire_stale(added)
        if self._in_rebalance:
            self._assigned_in_callback = True

    def _with_overrides(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Offsets given by the application win; the plan covers the rest."""
        planned = []
        for tp in partitions:
            key = _key(tp)
            state = self._prepared.get(key)
            if state is None or tp.offset in (OFFSET_INVALID, OFFSET_STORED):
                start = state.floor if state is not None and state.floor is not None else tp.offset
                planned.append(TopicPartition(tp.topic, tp.partition, start))
                continue
            if tp.offset < 0:  # OFFSET_BEGINNING / OFFSET_END: a plain consumer's choice
                self._prepared[key] = PartitionState(None, RangeSet(), None)
            # An absolute offset only moves where the primary reads: what was processed
            # is unchanged; offsets both streams now read come twice, none is skipped.
            planned.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        return planned

    # -------------------------------------------------------- assignment API
    def assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        self._assign(partitions, incremental=False)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        self._assign(partitions, incremental=True)

    def _assign(self, partitions: list[TopicPartition], incremental: bool) -> None:
        if self._in_rebalance:  # called from the application's on_assign: plan exists
            self._apply_assignment(self._with_overrides(partitions), incremental)
            return
        planned = self._prepare(partitions)
        try:
            self._apply_assignment(planned, incremental)
        finally:
            self._prepared.clear()
            self._added = {}

    def unassign(self) -> None:
        self._forget(list(self._states))
        self._primary.unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._forget([_key(tp) for tp in partitions])
        self._primary.incremental_unassign(partitions)

    def assignment(self) -> list[TopicPartition]:
        return self._primary.assignment()

    # -------------------------------------------------------------- reading
    def poll(self, timeout: float | None = None) -> Message | None:
        """One record or event, fresh first; at least 1 in CHILD_SHARE from the backlog."""
        # The hot path: no range being read and no auto-commit due, which is every call
        # in steady state. It is the primary's own poll() behind two checks; a long wait
        # is cut into _IDLE_SLICE_S slices (a rebalance inside one may start a catch-up,
        # whose records must not wait for the rest of the user's timeout).
        now = _monotonic()
        if self._reading or now >= self._auto_due:
            return self._poll_slow(timeout)
        if timeout is not None and 0 <= timeout <= _IDLE_SLICE_S:
            return self._primary.poll(timeout)
        m = self._primary.poll(_IDLE_SLICE_S)
        if m is not None:
            return m
        return self._poll_slow(_rest(timeout, now))

    def _poll_slow(self, timeout: float | None) -> Message | None:
        child = self._child
        assert child is not None
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            if now >= self._auto_due:
                self._auto_commit(now)
            if child.active:
                if self._fair >= CHILD_SHARE:
                    got = child.consume(1)
                    if got:
                        self._fair = 0
                        return got[0]
                m = self._primary.poll(0)
                if m is not None:
                    self._fair += 1
                    return m
                got = child.consume(1)
                if got:
                    self._fair = 0
                    return got[0]
                wait = _SLICE_S
            else:
                wait = _IDLE_SLICE_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                wait = min(wait, remaining)
            m = self._primary.poll(wait)
            if m is not None:
                self._fair += 1
                return m
            now = time.monotonic()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, fresh first, at least 1/CHILD_SHARE of a
        full batch from the backlog while it has records."""
        # The hot path, as in poll(): a batch is returned when it is full or a slice ends
        # with records in it, as the slow path does.
        now = _monotonic()
        if self._reading or now >= self._auto_due:
            return self._consume_slow(num_messages, timeout)
        if timeout is not None and 0 <= timeout <= _IDLE_SLICE_S:
            return self._primary.consume(num_messages, timeout)
        msgs = self._primary.consume(num_messages, _IDLE_SLICE_S)
        if msgs:
            return msgs
        return self._consume_slow(num_messages, _rest(timeout, now))

    def _consume_slow(self, num: int, timeout: float | None) -> list[Message]:
        child = self._child
        assert child is not None
        if not isinstance(num, int) or num < 1:
            # let confluent-kafka raise its own error for bad arguments
            return self._primary.consume(num, 0)
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            if now >= self._auto_due:
                self._auto_commit(now)
            if child.active:
                reserve = num // CHILD_SHARE
                if reserve == 0 and self._fair >= CHILD_SHARE:
                    reserve = 1
                fresh = self._primary.consume(num - reserve, 0) if num > reserve else []
                backlog = child.consume(num - len(fresh))
                if len(fresh) + len(backlog) < num and len(fresh) == num - reserve and reserve:
                    fresh += self._primary.consume(num - len(fresh) - len(backlog), 0)
                if backlog:
                    self._fair = 0
                elif fresh:
                    self._fair += 1
                if fresh or backlog:
                    return fresh + backlog
                wait = _SLICE_S
            else:
                wait = _IDLE_SLICE_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                wait = min(wait, remaining)
            msgs = self._primary.consume(num, wait)
            if msgs:
                self._fair += 1
                return msgs
            now = time.monotonic()

    # ------------------------------------------------------------- commits
    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit processed offsets, routed to the stream each came from.

        A backlog (child) offset goes to the child's commit log; every other one to
        the primary's. The user's group always stores the *safe* offset (lowest
        unprocessed), with the primary's position and pending ranges in its
        metadata. Without arguments, commits what each stream has delivered.

        Returns:
            For a synchronous commit, the partitions as the group stored them.
        """
        if message is not None and offsets is not None:
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, "commit() takes message or offsets, not both")
            )
        if message is not None:
            if message.error() is not None:
                raise KafkaException(
                    KafkaError(KafkaError._INVALID_ARG, "cannot commit an error event")
                )
            updates = [((message.topic(), message.partition()), message.offset() + 1, None)]
        elif offsets is not None:
            updates = [(_key(tp), tp.offset, tp.metadata) for tp in offsets]
        else:
            updates = self._delivered(list(self._states))
            if not updates:  # as librdkafka: nothing consumed, nothing to commit
                raise KafkaException(KafkaError(KafkaError._NO_OFFSET, "No offset stored"))
        return self._commit(updates, asynchronous)

    def commit_sync(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None
    ) -> list[TopicPartition] | None:
        """KIP-333's commitSync(): commit(..., asynchronous=False)."""
        return self.commit(message=message, offsets=offsets, asynchronous=False)

    def commit_async(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """KIP-333's commitAsync(): commit(..., asynchronous=True)."""
        self.commit(message=message, offsets=offsets, asynchronous=True)

    commitSync = commit_sync
    commitAsync = commit_async

    def store_offsets(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """As confluent-kafka's (enable.auto.offset.store=false); kept per stream."""
        if message is not None:
            self._primary.store_offsets(message=message)
            items = [((message.topic(), message.partition()), message.offset() + 1)]
        else:
            self._primary.store_offsets(offsets=offsets)
            items = [(_key(tp), tp.offset) for tp in offsets or []]
        for key, offset in items:
            st = self._states.get(key)
            if st is not None and st.is_child_offset(offset - 1):
                self._stored_child[key] = offset
            else:
                self._stored[key] = offset

    def _delivered(self, keys: list[Key]) -> list[tuple[Key, int, str | None]]:
        """What each stream has handed to the application (or it stored)."""
        updates: list[tuple[Key, int, str | None]] = []
        if self._settings.auto_offset_store:
            if keys:
                tps = self._primary.position([TopicPartition(*k) for k in keys])
                updates += [(_key(tp), tp.offset, None) for tp in tps if tp.offset >= 0]
            for k in keys:
                st = self._states.get(k)
                if st is not None and st.child_delivered is not None:
                    updates.append((k, st.child_delivered, None))
        else:
            updates += [(k, self._stored[k], None) for k in keys if k in self._stored]
            updates += [(k, self._stored_child[k], None) for k in keys if k in self._stored_child]
        return updates

    def _auto_commit(self, now: float) -> None:
        self._auto_due = now + self._settings.auto_commit_interval_s
        # Positions read before this poll fetches anything: the records they cover
        # were returned by earlier calls, so the application is done with them.
        self._commit_quietly(self._delivered(list(self._states)), asynchronous=True)

    def _commit_quietly(
        self, updates: list[tuple[Key, int, str | None]], asynchronous: bool, group: bool = True
    ) -> None:
        try:
            self._commit(updates, asynchronous, group=group)
        except (KafkaException, RuntimeError) as exc:
            log.warning("automatic commit failed (offsets stay safe, records may repeat): %s", exc)

    def _commit(
        self,
        updates: list[tuple[Key, int, str | None]],
        asynchronous: bool,
        group: bool = True,
    ) -> list[TopicPartition] | None:
        assert self._child is not None
        plain: list[TopicPartition] = []
        touched: list[Key] = []
        checkpoints = {}
        for key, offset, metadata in updates:
            st = self._states.get(key)
            if st is None or offset < 0:
                plain.append(_tp(key, offset, metadata))
                continue
            if metadata is not None and not st.is_child_offset(offset - 1):
                st.user_metadata = metadata
            cp = st.commit(offset)
            if cp is not None:
                checkpoints[key] = cp
            if key not in touched:
                touched.append(key)
        # One budget for both logs: a synchronous commit() returns within socket.timeout.ms
        # (and a second at most: the group commit, which carries the same progress in its
        # token, is always tried).
        budget = Budget(self._commit_timeout_s)
        if checkpoints:
            try:
                self._child.commit(checkpoints, asynchronous, timeout_s=budget.remaining())
            except KafkaException as exc:
                # The group commit below carries the same progress in its token.
                log.warning("child checkpoint commit failed: %s", exc)
        if not group:
            return None
        offsets = plain + [tp for tp in (self._group_offset(k) for k in touched) if tp is not None]
        if not offsets:
            return None if asynchronous else []
        if asynchronous:
            self._primary.commit(offsets=offsets, asynchronous=True)
            return None

        def commit() -> list[TopicPartition] | None:
            return call_with_retries(
                lambda: self._primary.commit(offsets=offsets, asynchronous=False)
            )

        if self._in_rebalance:
            # librdkafka is serving this handle's rebalance on this very thread: a commit
            # from another thread is not answered until the callback returns (measured:
            # close() stalled for the whole timeout). The caller (poll() or close()) is
            # bounded already.
            return commit()
        return call_bounded(
            commit, budget.request_timeout(self._commit_timeout_s, shortest=1.0), "commit"
        )

    def _group_offset(self, key: Key) -> TopicPartition | None:
        st = self._states[key]
        token = st.token()
        if token is None:
            if st.position is None:
                return None
            return _tp(key, st.position, st.user_metadata)
        try:
            text, written = encode_group_token(token, self._settings.metadata_max_bytes)
        except TokenTooLargeError as exc:
            raise KafkaException(
                KafkaError(KafkaError.OFFSET_METADATA_TOO_LARGE, str(exc))
            ) from None
        if written.ranges != token.ranges:
            log.info(
                "%s [%d]: %d pending ranges coalesced to %d to fit %d bytes of metadata",
                key[0],
                key[1],
                len(token.ranges),
                len(written.ranges),
                self._settings.metadata_max_bytes,
            )
            st.ranges = RangeSet(written.ranges)
            assert self._child is not None
            self._child.refresh(key)
        return TopicPartition(key[0], key[1], written.safe_offset, metadata=text)

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """Per partition, the lowest offset not yet processed, from both commit logs:
        the child's progress while a range is pending, the primary's offset after."""
        assert self._child is not None
        kwargs = {} if timeout is None else {"timeout": timeout}
        group = self._primary.committed(partitions, **kwargs)
        ours = [tp for tp in group if tp.metadata and tp.metadata.startswith("~fr")]
        child = {}
        if ours:
            child = {
                _key(tp): tp
                for tp in self._child.handle().committed(
                    [TopicPartition(tp.topic, tp.partition) for tp in ours], **kwargs
                )
            }
        out = []
        for tp in group:
            c = child.get(_key(tp))
            restored = restore(
                tp.offset, tp.metadata, c.offset if c else -1, c.metadata if c else None
            )
            offset = restored.safe_offset
            out.append(
                _tp(_key(tp), tp.offset if offset is None else offset, restored.user_metadata)
            )
        return out

    # ------------------------------------------------------------ positions
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The primary's position; the child takes no part (KIP-333)."""
        return self._primary.position(partitions)

    def seek(self, partition: TopicPartition) -> None:
        """Seek the primary. The child keeps its ranges: seeking changes what is read,
        not what was processed, so a backward seek into a range re-reads (duplicates)
        and a later commit can never claim the range processed on the seek's word."""
        self._primary.seek(partition)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._primary.pause(partitions)
        assert self._child is not None
        self._child.pause([_key(tp) for tp in partitions])

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._primary.resume(partitions)
        assert self._child is not None
        self._child.resume([_key(tp) for tp in partitions])

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        kwargs = {"cached": cached}
        if timeout is not None:
            kwargs["timeout"] = timeout
        return self._primary.get_watermark_offsets(partition, **kwargs)

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        if timeout is None:
            return self._primary.offsets_for_times(partitions)
        return self._primary.offsets_for_times(partitions, timeout=timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._primary.list_topics(topic, timeout)

    def memberid(self) -> str | None:
        return self._primary.memberid()

    def consumer_group_metadata(self) -> Any:
        return self._primary.consumer_group_metadata()

    def cluster_id(self, timeout: float = -1) -> str | None:
        return self._primary.cluster_id(timeout)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self._primary.set_sasl_credentials(username, password)
        if self._child is not None and self._child.alive:
            self._child.handle().set_sasl_credentials(username, password)

    # ---------------------------------------------------------------- close
    def close(self) -> None:
        """Commit (if auto-commit is on), leave the group, close both handles.

        Returns within twice ``socket.timeout.ms`` even when the broker is unreachable
        (librdkafka's own close() waits for outstanding commits forever): the handles are
        closed on a helper thread while this one waits, and are left to finish there if
        the broker never answers. Rebalance callbacks run inside close(), on that thread.
        """
        if self._closed:
            return
        self._closed = True
        if self._child is None:
            self._primary.close()
            return
        child = self._child

        def shutdown() -> None:
            try:
                if self._settings.auto_commit and not self._subscribed:
                    self._commit_quietly(self._delivered(list(self._states)), asynchronous=False)
                # A subscribed primary runs on_revoke inside close(): that commits both
                # logs while the child is still open.
                self._primary.close()
            finally:
                child.close()

        try:
            call_bounded(shutdown, 2 * self._commit_timeout_s, "close()")
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._TIMED_OUT:
                raise
            log.error(
                "close() gave up waiting: %s. Uncommitted progress is not lost: the committed "
                "offsets stay safe and those records will be delivered again.",
                exc.args[0].str(),
            )

    # ------------------------------------------------------------- reports
    def _report(self, code: int, msg: str) -> None:
        log.error(msg)
        if self._error_cb is not None:
            self._error_cb(KafkaError(code, msg))

    def _report_deleted(self, topic: str, partition: int, start: int, end: int) -> None:
        msg = (
            f"records {topic} [{partition}] offsets [{start}, {end}) were deleted by "
            "retention before the catch-up consumer read them"
        )
        log.error(msg)
        if self._error_cb is not None:
            self._error_cb(KafkaError(KafkaError.OFFSET_OUT_OF_RANGE, msg))
