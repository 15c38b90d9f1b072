"""``Consumer``: a drop-in for ``confluent_kafka.Consumer`` implementing KIP-333.

With ``enable.parallel.rebalance=false`` (the default) every public method is the
primary handle's own bound method: the same behaviour at the same speed.

With it on, a partition gained with a backlog larger than the threshold is read by two
consumers: the *primary* (the user's group member) jumps to the log end so fresh
records flow at once, and the *child* reads the skipped range ``[committed, log end)``
until it reaches its end. ``poll()``/``consume()`` merge both, fresh first.

This module is the facade: it wires the pieces and owns the calls' time bounds.

* ``_planner``/``_planning`` read both commit logs when partitions are gained and decide
  where each stream starts;
* ``_ledger`` keeps, per partition, what is unprocessed (the only thing the group's
  offset is derived from);
* ``_routing`` records what each stream handed out, so that a commit claims exactly
  what the application's call says was processed, whenever and wherever it comes from;
* ``_commits`` turns a ledger into the two writes, ``_child`` is the second consumer.

Thread ownership: the primary and child librdkafka handles are both owned by the
thread that calls this object's methods, exactly as a ``confluent_kafka.Consumer`` is;
do not share one ``Consumer`` between threads. Rebalance callbacks run inside
``poll()``/``consume()`` on that same thread. ``call_bounded`` lends a handle to a helper
thread only while the owner waits (a synchronous commit, ``close()``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as _RdConsumer

from ._child import Child, ChildState, call_bounded
from ._commits import Change, apply_change, group_write
from ._config import ParallelConfig, child_config, split_config
from ._ledger import Ledger
from ._planner import PLAN_BUDGET_S, UNKNOWN_PARTITION, Planner, Reading
from ._planning import Plan, plan_assignment
from ._retry import Budget, call_with_retries
from ._routing import UNKNOWN_START, Claim, Epoch, History
from ._token import ChildCheckpoint, TokenTooLargeError, encode_child_checkpoint, is_ours
from ._transactions import OpenTransaction

__all__ = ["CatchupStatus", "Consumer"]

log = logging.getLogger("fastrebalance.consumer")

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
#: How long close() serves the group for its revoke before closing the handles.
_REVOKE_WAIT_S = 10.0
#: ...in slices this long: librdkafka's poll() does not return once it served the revoke,
#: so a slice is what close() takes at least (50 ms made close() 50x plain's).
_REVOKE_SLICE_S = 0.01
#: How often a catch-up publishes its metrics snapshot (fastrebalance.metrics), seconds.
_PUBLISH_S = 1.0
#: Exactly-once: how long planning inside the rebalance callback may wait for the commit
#: logs before the partitions are deferred (assigned paused, planned by later calls). An
#: open transaction holding offsets for the group (a dead producer's until its
#: transaction.timeout.ms, or this member's own) makes the read wait until it ends.
_EOS_PLAN_S = 2.0
#: ...then each later attempt gets this long, doubling up to _DEFERRED_MAX_S, as does the
#: pause between attempts: a deferred partition costs its member at most a share of its time.
_DEFERRED_FIRST_S = 0.25
_DEFERRED_MAX_S = 2.0

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
        records_remaining: pending offsets the child has still to read.
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


def _after_a_slice(timeout: float) -> float:
    """What is left of a timeout once a whole idle slice went by with nothing.

    librdkafka's poll()/consume() come back empty only when their timeout is over (or
    when a callback yields, earlier): so at most this much is left, never more, and the
    hot path reads no clock to know it."""
    return timeout if timeout < 0 else max(timeout - _IDLE_SLICE_S, 0.0)


def _key(tp: TopicPartition) -> Key:
    return (tp.topic, tp.partition)


def _tp(key: Key, offset: int, metadata: str = "") -> TopicPartition:
    if metadata:
        return TopicPartition(key[0], key[1], offset, metadata=metadata)
    return TopicPartition(key[0], key[1], offset)


def _transit_entries(got: Any) -> list[tuple[str, int, int]]:
    msgs = got if isinstance(got, list) else () if got is None else (got,)
    return [(m.topic(), m.partition(), m.offset()) for m in msgs if m.error() is None]


def _clip(claims: list[Claim], limit: int) -> list[Claim]:
    """The claims, cut at ``limit``: nothing at or beyond it is claimed."""
    return [
        Claim(c.start, min(c.end, limit), c.child, c.exact) for c in claims if c.start < limit
    ]


def _record(message: Message) -> tuple[Key, int]:
    """The partition and offset of a record the application commits or stores."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if message.error() is not None or topic is None or partition is None or offset is None:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "not a record: cannot commit"))
    return (topic, partition), offset


def _no_offset() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._NO_OFFSET, "No offset stored"))


class _Assigned:
    """A partition of the current assignment."""

    __slots__ = ("checkpoint", "epoch", "ledger", "stored", "stored_as", "written")

    def __init__(self, ledger: Ledger | None, epoch: Epoch) -> None:
        #: What is unprocessed; None: the group's offset could not be read when the
        #: partition was gained (the first commit reads it before writing anything).
        self.ledger = ledger
        self.epoch = epoch  #: what both streams handed out in this assignment
        self.stored = False  #: store_offsets() claimed something not yet committed
        #: the last store_offsets(offsets=)'s offset and metadata: as librdkafka's stored
        #: offset, the next commit writes no more than it (a rewind), with its metadata
        self.stored_as: tuple[int | None, str] = (None, "")
        self.checkpoint: ChildCheckpoint | None = None  #: ... and this child checkpoint
        self.written: tuple[int, str] | None = None  #: the last group commit sent


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
        self._client_id = str(primary_conf.get("client.id", "rdkafka"))
        self._group_id = str(primary_conf.get("group.id", ""))
        self._closed = False
        self._user_callbacks: tuple[Any, Any, Any] = (None, None, None)
        # Records handed to a wrapper (fastrebalance.aio) that has not given them to the
        # application yet, counted per (topic, partition, offset): no bare commit claims
        # them. Added by the thread making the call, removed by the wrapper's event loop
        # thread: hence the lock.
        self._in_transit: Counter[tuple[str, int, int]] = Counter()
        self._transit_lock = threading.Lock()
        self._published: dict[str, Any] = {}  # metrics_snapshot(): nothing with the mode off
        # Exactly-once: each open transaction's claims, by its producer (applied once it
        # commits), and the stale catch-up checkpoints the next transaction must clear.
        self._txns: dict[int, OpenTransaction] = {}
        self._txn_retire: dict[Key, TopicPartition] = {}
        # ... and which producer's transaction last claimed each partition (a producer per
        # partition: an abort that claimed nothing rewinds only what may be its own)
        self._claimed_by: dict[Key, int] = {}
        # Exactly-once: assigned partitions not planned yet (their commit logs could not be
        # read), paused in the primary, with the offset the assignment asked for.
        self._deferred: dict[Key, int] = {}
        self._deferred_at = 0.0  # the next attempt to plan them, and the attempts so far
        self._deferred_tries = 0
        if not self._settings.enabled:
            # The primary handle: the user's group member. Owner: the user's thread.
            self._primary = _RdConsumer(primary_conf)
            for name in _PASSTHROUGH:
                if name not in ("close", "subscribe"):
                    setattr(self, name, getattr(self._primary, name))
            self._child: Child | None = None
            return
        child_conf = child_config(primary_conf, self._settings)
        user_stats_cb = primary_conf.get("stats_cb")
        self._child_stats: str | None = None
        if user_stats_cb is not None:
            # librdkafka calls these from poll(), on the user's thread: our state is safe
            # to read. The user's callback sees one document per interval, the primary's,
            # with the child's inside (see _merge_stats).
            primary_conf["stats_cb"] = lambda stats: user_stats_cb(self._merge_stats(stats))
            child_conf["stats_cb"] = self._keep_child_stats
        self._error_cb = conf.get("error_cb")
        # The group's commit results: counted (metrics), then the application's callback.
        self._user_on_commit = primary_conf.get("on_commit")
        primary_conf["on_commit"] = self._on_group_commit
        # librdkafka's own network request timeout bounds our synchronous commits and,
        # twice over, our close(): with a hung broker librdkafka alone would block forever.
        self._commit_timeout_s = _socket_timeout_s(primary_conf)
        # The primary handle: the user's group member. Owner: the user's thread.
        self._primary = _RdConsumer(primary_conf)
        # The child handle, created on the first backlog. Owner: the user's thread.
        self._child = Child(
            child_conf,
            self._report_deleted,
            report=self._report_error,
            close_timeout_s=self._commit_timeout_s,
        )
        self._planner = Planner(self._primary, self._child)
        self._history: dict[Key, History] = {}
        self._assigned: dict[Key, _Assigned] = {}
        self._plan_budget = Budget(0)  # shared by every round trip of one assignment
        self._in_rebalance = False
        self._assigned_in_callback = False
        # True while librdkafka's position() may count records the application has not
        # been handed: inside the primary's consume() (records collected for the batch),
        # and while close() drains the last rebalance (records fetched, then dropped).
        self._untrusted_position = False
        self._revoked_in_call: set[Key] = set()
        # Assigned partitions whose primary run starts at its first record (unplanned at
        # a logical offset): the slow path looks at each record until it came.
        self._unresolved: set[Key] = set()
        self._leaving = False  # close() is serving the last rebalance
        self._subscribed = False
        self._fair = 0
        self._warned_offsets = False
        self._stats_at: tuple[float, int] = (time.monotonic(), 0)
        # Metrics (fastrebalance.metrics): counters kept by this thread, and the snapshot
        # it publishes for any thread to read (a new dict each time: never mutated).
        self._coalescings = 0
        self._group_commit_failures = 0
        self._token_bytes: dict[Key, int] = {}
        self._token_warned: set[Key] = set()
        self._token_warnings = 0
        self._primary_handed_closed = 0
        self._published_at = 0.0
        # The last assignment's plan (partitions, seconds in all, seconds of round trips):
        # it runs inside the rebalance callback, so it is what a rebalance costs the
        # application's poll() on top of librdkafka's own work.
        self._last_plan: dict[str, Any] | None = None
        # The child's partitions being read (its own dict, shared): empty in steady state.
        self._reading = self._child._cursors
        # The hot path's one check: True while no range is being read and no auto-commit
        # is due. Set by this thread; cleared by the auto-commit timer's thread too (a
        # bool store: it only ever sends the next call down the slow path).
        # Exactly-once stays off it: an abort goes back to the first record of a partition
        # that never committed, and only the slow path sees every first record.
        self._steady = not self._settings.transactional
        self._due = False
        self._timer: threading.Timer | None = None
        self._primary_poll = self._primary.poll
        self._arm_auto_commit()
        self._publish()

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
        for key, a in self._assigned.items():
            pos = self._child.position(key)
            ranges = a.ledger.ranges if a.ledger is not None else None
            if not ranges and pos is None:
                continue
            remaining = 0
            if pos is not None and ranges:
                remaining = sum(e - max(s, pos) for s, e in ranges if e > pos)
            out[key] = CatchupStatus(ranges.as_tuple() if ranges else (), pos, remaining, alive)
        return out

    def _keep_child_stats(self, stats: str) -> None:
        self._child_stats = stats

    def _merge_stats(self, stats: str) -> str:
        """librdkafka's statistics JSON plus a ``fastrebalance`` object (with the child
        handle's own statistics under ``child``), so that an existing stats pipeline picks
        up catch-up progress with no new plumbing and counts every client once."""
        try:
            data = json.loads(stats)
        except ValueError:
            return stats
        ours = self.catchup_metrics()
        if self._child_stats is not None:
            with contextlib.suppress(ValueError):
                ours["child"] = json.loads(self._child_stats)
        data["fastrebalance"] = ours
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
            "last_plan": self._last_plan,
            "partitions": partitions,
        }

    def metrics_snapshot(self) -> dict[str, Any]:
        """The catch-up metrics as last published, safe to read from any thread (a
        metrics exporter's): this consumer's thread publishes them at every commit and
        rebalance, and every second while a catch-up runs (``fastrebalance.metrics``)."""
        return self._published

    def _publish(self) -> None:
        """Publish the metrics snapshot (this consumer's thread only)."""
        child = self._child
        assert child is not None
        partitions = {}
        for key, a in self._assigned.items():
            ranges = a.ledger.ranges if a.ledger is not None else None
            partitions[key] = {
                "pending_records": ranges.count() if ranges else 0,
                "pending_ranges": len(ranges) if ranges else 0,
                "child_position": child.position(key),
                "token_bytes": self._token_bytes.get(key, 0),
            }
        primary = self._primary_handed_closed + sum(
            run.next - run.start for a in self._assigned.values() for run in a.epoch.primary
        )
        self._published = {
            "client_id": self._client_id,
            "group_id": self._group_id,
            "child_alive": child.alive,
            "partitions": partitions,
            "records_delivered": {"primary": primary, "child": child.records_delivered},
            "catchups_started": child.catchups_started,
            "catchups_finished": child.catchups_finished,
            "coalescings": self._coalescings,
            "token_budget_bytes": self._settings.metadata_max_bytes,
            "token_budget_warnings": self._token_warnings,
            "commit_failures": {
                "group": self._group_commit_failures,
                "catchup": child.commit_failures,
            },
            "last_plan": self._last_plan,
        }
        self._published_at = time.monotonic()

    def _on_group_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None or any(tp.error is not None for tp in partitions):
            self._group_commit_failures += 1
        if self._user_on_commit is not None:
            self._user_on_commit(err, partitions)

    def _note_token(self, key: Key, metadata: str) -> None:
        """Token size per partition (metrics), and a warning at 75 % of the budget: past
        the budget, ranges are coalesced and processed records are re-read."""
        size = len(metadata.encode("utf-8")) if is_ours(metadata) else 0
        self._token_bytes[key] = size
        budget = self._settings.metadata_max_bytes
        if size > 0.75 * budget:
            if key not in self._token_warned:
                self._token_warned.add(key)
                self._token_warnings += 1
                log.warning(
                    "%s [%d]: the range token takes %d of %d bytes of commit metadata "
                    "(parallel.rebalance.metadata.max.bytes): past it, the pending ranges "
                    "closest together are merged and records between them are re-read",
                    *key,
                    size,
                    budget,
                )
        elif size < 0.5 * budget:
            self._token_warned.discard(key)

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
            if self._user_callbacks[0] is not None:
                # What confluent-kafka would pass. The commit logs are read after the
                # callback, when these are handed to assign() or when it returns: what
                # the callback itself commits (a rewind, say) is what the plan starts from,
                # as librdkafka fetches the committed offsets only once assign() is made.
                given = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
                self._user_callbacks[0](self, given)
            if not self._assigned_in_callback:
                self._apply_assignment(partitions, incremental=self._settings.incremental)
        finally:
            self._in_rebalance = False

    def _on_revoke(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance = True
        try:
            if self._user_callbacks[1] is not None:
                self._user_callbacks[1](self, partitions)
            keys = [_key(tp) for tp in partitions]
            if self._settings.auto_commit:
                self._auto_commit(keys)
            self._retire(keys)
        finally:
            self._in_rebalance = False

    def _on_lost(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance = True
        try:
            # confluent-kafka calls on_revoke when no on_lost is given: so do we
            user_cb = self._user_callbacks[2] or self._user_callbacks[1]
            if user_cb is not None:
                user_cb(self, partitions)
            keys = [_key(tp) for tp in partitions]
            if self._settings.auto_commit:
                # The group commit would be fenced; the child's own log still accepts
                # its checkpoints, so the next owner resumes the backlog from there.
                self._auto_commit(keys, group=False)
            self._retire(keys)
        finally:
            self._in_rebalance = False

    def _retire(self, keys: Iterable[Key]) -> None:
        """The partitions leave the assignment: freeze what the primary handed out (their
        history stays, for late commits), stop the child, and never return their records
        from the call under way."""
        keys = list(keys)
        for k in keys:
            self._deferred.pop(k, None)  # never planned, nothing handed out
        keys = [k for k in keys if k in self._assigned]
        if not keys:
            return
        self._observe(keys, leaving=True)
        self._unresolved.difference_update(keys)
        for k in keys:
            epoch = self._assigned.pop(k).epoch
            epoch.close()
            self._primary_handed_closed += sum(run.next - run.start for run in epoch.primary)
            self._token_bytes.pop(k, None)
        assert self._child is not None
        self._child.forget(keys)
        self._revoked_in_call.update(keys)
        self._recheck()
        self._publish()

    def _read(self, partitions: list[TopicPartition]) -> dict[Key, Reading]:
        if self._closed or self._leaving:
            # An assignment delivered inside close(), revoked right after: reading would
            # only wait on a group that is leaving (librdkafka answers no OffsetFetch while
            # it terminates) and spend close()'s bound. Nothing is read, so nothing is
            # planned: nothing is handed out before the revoke either.
            return {}
        if self._settings.transactional:
            # A partition this member's own open transaction sent offsets for cannot be
            # read (the broker answers UNSTABLE_OFFSET_COMMIT until it ends): deferred
            # without a try, so that the application can end the transaction meanwhile.
            partitions = [tp for tp in partitions if not self._in_open_txn(_key(tp))]
            self._plan_budget = Budget(_EOS_PLAN_S)
        else:
            self._plan_budget = Budget(PLAN_BUDGET_S)
        return self._planner.read(partitions, self._plan_budget)

    def _plan(self, key: Key, reading: Reading, requested: int) -> Plan | None:
        restored = reading.restored
        if restored is None:
            return None
        marks = reading.watermarks
        if isinstance(marks, tuple):
            low, high = marks
        else:
            low, high = 0, restored.position if restored.position is not None else 0
            if restored.position is not None:
                log.warning(
                    "%s [%d]: no watermarks (%s): resuming without a new catch-up", *key, marks
                )
                if (
                    restored.ranges
                    and isinstance(marks, KafkaException)
                    and marks.args[0].code() in UNKNOWN_PARTITION
                ):
                    self._report(
                        marks.args[0].code(),
                        f"{key[0]} [{key[1]}] is unknown to the cluster (topic deleted?): its "
                        f"pending backlog {restored.ranges.as_tuple()[:5]} cannot be read; it "
                        "stays pending, so the committed offset does not move past it",
                    )
        if restored.position is not None and restored.position > high:
            log.warning(
                "%s [%d]: committed offset %d is beyond the log end %d (committed by hand? "
                "topic recreated? log truncated?): the primary starts there and librdkafka "
                "applies auto.offset.reset; its commits below %d do not move the group offset",
                *key,
                restored.position,
                high,
                restored.position,
            )
        exact = self._settings.metadata_max_bytes if self._settings.transactional else None
        plan = plan_assignment(
            restored, low, high, self._settings.lag_threshold, requested, exact_token_bytes=exact
        )
        if plan.declined is not None:
            log.warning(
                "%s [%d]: no catch-up this time: one more pending range would not fit the "
                "range token (%d bytes, parallel.rebalance.metadata.max.bytes), and "
                "exactly-once cannot coalesce it; the primary reads [%d, %d) in order",
                *key,
                self._settings.metadata_max_bytes,
                *plan.declined,
            )
        for start, end in plan.deleted:
            self._report_deleted(key[0], key[1], start, end)
        if plan.caught_up is not None:
            log.info(
                "%s [%d]: committed %d, log end %d: primary starts at %d, child reads [%d, %d)",
                key[0],
                key[1],
                restored.position,
                high,
                plan.floor,
                *plan.caught_up,
            )
        return plan

    def _apply_assignment(self, partitions: list[TopicPartition], incremental: bool) -> None:
        """Plan each partition (unless the application chose its offset), hand the
        starts to the primary, open the partitions' epochs, start the child's ranges."""
        assert self._child is not None
        if incremental:
            self._refuse_as_librdkafka(partitions, assigned=True)
        began = time.monotonic()
        readings = self._read(list(partitions))
        read_s = time.monotonic() - began
        plans: dict[Key, tuple[Plan | None, int]] = {}
        deferred: list[TopicPartition] = []
        starts = []
        for tp in partitions:
            key = _key(tp)
            plan = self._plan(key, readings.get(key, Reading(None)), tp.offset)
            if plan is None:
                # A partition is never read before it is planned: it waits, paused, where
                # it can fetch nothing it could hand out (see _defer).
                deferred.append(tp)
                starts.append(TopicPartition(tp.topic, tp.partition, OFFSET_END))
                continue
            plans[key] = (plan, tp.offset)
            start = tp.offset if plan is None or plan.start is None else plan.start
            starts.append(TopicPartition(tp.topic, tp.partition, start))
        # Before the primary's assignment changes, close the epochs it ends: what the
        # primary handed out is read while it still has the partitions. A partition
        # assigned again starts a new epoch; one assign() drops is retired.
        if incremental:
            self._primary.incremental_assign(starts)
        else:
            self._retire([*self._assigned, *self._deferred])
            self._primary.assign(starts)
        if deferred:
            self._defer(deferred)
        self._open(plans)
        if self._in_rebalance:
            self._assigned_in_callback = True
        self._last_plan = {
            "partitions": len(partitions),
            "seconds": time.monotonic() - began,
            "read_seconds": read_s,
        }
        self._publish()

    def _open(self, plans: dict[Key, tuple[Plan | None, int]]) -> None:
        """Open the epochs of partitions the primary now reads (assigned, or a deferred
        one just planned and sought), with each plan's ledger; start their catch-ups."""
        assert self._child is not None
        added: dict[Key, tuple[int, int]] = {}
        catchups: list[tuple[Key, Ledger, Epoch]] = []
        for key, (plan, requested) in plans.items():
            history = self._history.setdefault(key, History())
            self._revoked_in_call.discard(key)
            if plan is None:
                # Unplanned: no ledger yet, and the primary's stream is the only one. It
                # begins where the primary starts: the application's offset, else (the
                # committed offset, a logical one) its first record. Not at 0: the
                # group's log may hold a pending backlog this member cannot read now.
                start = requested if requested >= 0 else UNKNOWN_START
                floor = start
            elif (
                self._settings.transactional
                and plan.ledger.position is None
                and (plan.start is None or plan.start < 0)
            ):
                # Nothing committed, the primary starts where auto.offset.reset puts it:
                # its first record says where, which an abort must go back to (nothing
                # else needs it: a first commit defines the group's offset whatever the
                # start, so other modes keep the hot path meanwhile).
                floor = start = UNKNOWN_START
            else:
                floor, start = plan.floor, plan.run_start  # OFFSET_TAIL: UNKNOWN_START
            epoch = history.begin(floor, start)
            if epoch.unresolved:  # its first record will say where it starts
                self._unresolved.add(key)
            self._assigned[key] = _Assigned(plan.ledger if plan is not None else None, epoch)
            if plan is None:
                continue
            first = plan.ledger.ranges.first()
            if first is not None and plan.run_start > first:
                catchups.append((key, plan.ledger, epoch))
            if plan.caught_up is not None:
                added[key] = plan.caught_up
        if catchups:
            self._child.start_all(catchups)
        if added:
            # After the fetches started (they overlap these round trips), before anything
            # can be committed: we still hold the user's thread.
            retired = self._child.retire_stale(
                added, self._plan_budget, write=not self._settings.transactional
            )
            if self._settings.transactional:
                self._txn_retire.update({_key(tp): tp for tp in retired})
        self._note_stale_positions(list(plans))
        self._recheck()

    # ------------------------------------------------------------ deferred plans
    def _defer(self, tps: list[TopicPartition]) -> None:
        """Hold partitions whose commit logs could not be read, paused, until a later
        poll()/consume() can plan them (``_plan_deferred``), then seek them to the plan.

        Resuming one unplanned would leave its start to librdkafka's own committed-offset
        fetch, which gives up for good on NOT_COORDINATOR when it is made while the broker
        is down (measured on Apache Kafka 3.9: the partition, plain confluent-kafka's
        too, delivered nothing for 90 s after the broker was back). And in exactly-once
        mode it would resume at the committed offset, which this library makes the *safe*
        offset (the first pending backlog record): fresh records above it whose output is
        already committed would be processed again. Reading what the logs say is the only
        exact start; under read_committed it waits for any open transaction that holds
        offsets for the group, as plain confluent-kafka's fetch of stable offsets does."""
        for tp in tps:
            self._deferred[_key(tp)] = tp.offset
        self._primary.pause([TopicPartition(tp.topic, tp.partition) for tp in tps])
        self._deferred_tries = 0
        self._deferred_at = time.monotonic() + _DEFERRED_FIRST_S
        log.warning(
            "%d partition(s) not planned yet (the commit logs could not be read: a broker "
            "that does not answer, or an open transaction holding offsets for the group): "
            "they stay paused until planned, e.g. %s",
            len(tps),
            [f"{tp.topic} [{tp.partition}]" for tp in tps[:3]],
        )

    def _plan_deferred(self) -> None:
        """Try once more to plan the deferred partitions; open those it can."""
        assert self._child is not None
        wait = min(_DEFERRED_FIRST_S * 2**self._deferred_tries, _DEFERRED_MAX_S)
        self._deferred_tries += 1
        keys = [k for k in self._deferred if not self._in_open_txn(k)]
        readings: dict[Key, Reading] = {}
        if keys:
            self._plan_budget = Budget(wait)
            readings = self._planner.read(
                [TopicPartition(*k) for k in keys], self._plan_budget, quiet=True
            )
        plans: dict[Key, tuple[Plan | None, int]] = {}
        for key in keys:
            requested = self._deferred[key]
            plan = self._plan(key, readings.get(key, Reading(None)), requested)
            if plan is None:
                continue
            target = plan.start if plan.start is not None else self._settings.reset_offset
            try:
                self._primary.seek(_tp(key, target))
            except KafkaException as exc:
                log.warning("%s [%d]: planned, but the seek failed (%s): retrying", *key, exc)
                continue
            del self._deferred[key]
            plans[key] = (plan, requested)
        if plans:
            self._open(plans)
            self._primary.resume(
                [TopicPartition(*k) for k in plans if not self._child.is_paused(k)]
            )
            log.info("%d deferred partition(s) planned", len(plans))
            self._publish()
        self._deferred_at = time.monotonic() + wait

    def _in_open_txn(self, key: Key) -> bool:
        return any(key in txn.claims for txn in self._txns.values())

    def _note_stale_positions(self, keys: list[Key]) -> None:
        """Right after assign(), librdkafka's position() may still report where the
        partition's previous assignment had got to (seen with plain confluent-kafka too):
        nothing of the new assignment was handed out yet, so any position now is that
        one, and observing it later must not credit the new run with it."""
        try:
            tps = self._primary.position([TopicPartition(*k) for k in keys])
        except (KafkaException, RuntimeError):
            return
        for tp in tps:
            a = self._assigned.get(_key(tp))
            if a is not None and tp.offset >= 0:
                a.epoch.live.stale = tp.offset

    # -------------------------------------------------------- assignment API
    def assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        self._apply_assignment(partitions, incremental=False)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        self._apply_assignment(partitions, incremental=True)

    def unassign(self) -> None:
        """As confluent-kafka's, with its auto-commit of what was handed out."""
        keys = list(self._assigned)
        if self._settings.auto_commit and keys:
            self._auto_commit(keys)
        self._retire(keys)
        self._primary.unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's, with its auto-commit of what was handed out."""
        self._refuse_as_librdkafka(partitions, assigned=False)
        keys = [_key(tp) for tp in partitions]
        if self._settings.auto_commit:
            self._auto_commit(keys)
        self._retire(keys)
        self._primary.incremental_unassign(partitions)

    def assignment(self) -> list[TopicPartition]:
        return self._primary.assignment()

    def _refuse_as_librdkafka(self, partitions: list[TopicPartition], assigned: bool) -> None:
        """librdkafka refuses a whole incremental (un)assign that adds a partition already
        assigned, or removes one that is not, and leaves its assignment unchanged. The
        refusal must come before anything here changes (a partition retired while
        librdkafka keeps it would stop its catch-up and drop its commits), with the same
        error."""
        current = {_key(tp) for tp in self._primary.assignment()}
        clash = next((tp for tp in partitions if (_key(tp) in current) is assigned), None)
        if clash is None:
            return
        if assigned:
            code, why = KafkaError._CONFLICT, "is already part of the current assignment"
        else:
            code = KafkaError._INVALID_ARG
            why = "can't be unassigned since it is not in the current assignment"
        raise KafkaException(KafkaError(code, f"{clash.topic} [{clash.partition}] {why}"))

    # -------------------------------------------------------------- reading
    def poll(self, timeout: float | None = None) -> Message | None:
        """One record or event, fresh first; at least 1 in CHILD_SHARE from the backlog."""
        # The hot path: no range being read, nothing unresolved, no auto-commit due, which
        # is every call in steady state: the primary's own poll() behind one flag (the
        # auto-commit's timer clears it) in one frame, with no clock read. A queued record
        # is taken without looking at the timeout at all (the commonest call under load,
        # and the one whose cost shows). A wait is cut into slices: a rebalance inside one
        # may start a catch-up, whose records must not wait for the rest of the timeout.
        if self._steady:
            m = self._primary_poll(0)
            if m is None:
                if not self._steady:  # a rebalance callback inside that call began a catch-up
                    return self._poll_slow(timeout)
                if timeout is not None and 0 <= timeout <= _IDLE_SLICE_S:
                    m = self._primary_poll(timeout)
                    if m is None:
                        return None
                else:
                    m = self._primary_poll(_IDLE_SLICE_S)
                    if m is None:
                        return self._poll_slow(
                            timeout if timeout is None else _after_a_slice(timeout)
                        )
            # A rebalance callback inside the call may have begun a run of unknown start:
            # m may be its first record, which says where it starts.
            if self._unresolved:
                self._resolve([m])
            return m
        return self._poll_slow(timeout)

    def _poll_slow(self, timeout: float | None) -> Message | None:
        # Each step returns as soon as it has a record: a record is never held while
        # another call that may run a rebalance callback is made.
        child = self._child
        assert child is not None
        try:
            return self._poll_slices(child, timeout)
        finally:
            self._recheck()

    def _poll_slices(self, child: Child, timeout: float | None) -> Message | None:
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            if self._due:
                self._tick_auto_commit()
            if now - self._published_at >= _PUBLISH_S:
                self._publish()
            if self._deferred and now >= self._deferred_at:
                self._plan_deferred()
            if child.active:
                if self._fair >= CHILD_SHARE:
                    got = child.consume(1)
                    if got:
                        self._fair = 0
                        return got[0]
                m = self._admit(self._primary.poll(0))
                if m is not None:
                    self._fair += 1
                    if self._unresolved:
                        self._resolve([m])
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
            m = self._admit(self._primary.poll(wait))
            if m is not None:
                self._fair += 1
                if self._unresolved:
                    self._resolve([m])
                return m
            now = time.monotonic()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, fresh first, at least 1/CHILD_SHARE of a
        full batch from the backlog while it has records."""
        # The hot path, as in poll(): a batch is returned when it is full or a slice ends
        # with records in it, as the slow path does.
        if self._steady:
            if timeout is not None and 0 <= timeout <= _IDLE_SLICE_S:
                return self._batch(num_messages, timeout)
            msgs = self._batch(num_messages, _IDLE_SLICE_S)
            if msgs:
                return msgs
            if timeout is not None:
                timeout = _after_a_slice(timeout)
        return self._consume_slow(num_messages, timeout)

    def _batch(self, num: int, timeout: float) -> list[Message]:
        """The primary's consume(). A rebalance callback inside it sees a position()
        that counts records collected for this batch, so it must not trust it; records
        of partitions revoked inside it are not returned (the new owner reads them)."""
        self._untrusted_position = True
        try:
            msgs = self._primary.consume(num, timeout)
        finally:
            self._untrusted_position = False
        if self._revoked_in_call:
            gone, self._revoked_in_call = self._revoked_in_call, set()
            msgs = [m for m in msgs if (m.topic(), m.partition()) not in gone]
        if self._deferred:
            msgs = [m for m in msgs if (m.topic(), m.partition()) not in self._deferred]
        if self._unresolved:
            self._resolve(msgs)
        return msgs

    def _admit(self, m: Message | None) -> Message | None:
        """A record of the primary's, unless it belongs to a deferred partition (paused
        at once, so nothing should come; whatever does is not handed out: nothing of the
        partition is until it is planned and sought)."""
        if m is not None and self._deferred and (m.topic(), m.partition()) in self._deferred:
            return None
        return m

    def _resolve(self, msgs: list[Message]) -> None:
        """The first record of an unplanned partition's primary run is where its stream
        begins (see ``Epoch.resolve``)."""
        for m in msgs:
            key = (m.topic(), m.partition())
            if key not in self._unresolved or m.error() is not None:
                continue
            offset = m.offset()
            a = self._assigned.get(key)
            if a is not None and offset is not None:
                a.epoch.resolve(offset)
                self._unresolved.discard(key)
        if not self._unresolved:
            self._recheck()

    def _consume_slow(self, num: int, timeout: float | None) -> list[Message]:
        child = self._child
        assert child is not None
        if not isinstance(num, int) or num < 1:
            # let confluent-kafka raise its own error for bad arguments
            return self._primary.consume(num, 0)
        try:
            return self._consume_slices(child, num, timeout)
        finally:
            self._recheck()

    def _consume_slices(self, child: Child, num: int, timeout: float | None) -> list[Message]:
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            if self._due:
                self._tick_auto_commit()
            if now - self._published_at >= _PUBLISH_S:
                self._publish()
            if self._deferred and now >= self._deferred_at:
                self._plan_deferred()
            if child.active:
                # One call on the primary (which may run a rebalance callback), then the
                # child's: never back to the primary while records are held for the batch.
                reserve = num // CHILD_SHARE
                if reserve == 0 and self._fair >= CHILD_SHARE:
                    reserve = 1
                fresh = self._batch(num - reserve, 0) if num > reserve else []
                backlog = child.consume(num - len(fresh))
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
            msgs = self._batch(num, wait)
            if msgs:
                self._fair += 1
                return msgs
            now = time.monotonic()

    # -------------------------------------------------------- what was handed
    def _observe(self, keys: Iterable[Key], leaving: bool = False) -> None:
        """Record in each assigned partition's live primary run what librdkafka's position
        says the primary handed out (the hot path records nothing per record). Inside a
        consume() batch the position also counts records collected for the batch, so there
        it is only an upper bound of what was handed out. ``leaving``: the partition leaves
        the assignment, and librdkafka may already have forgotten its position (-1001 in a
        revoke callback): the run may then reach the log end it had fetched up to."""
        assigned = [k for k in keys if k in self._assigned]
        if not assigned:
            return
        try:
            tps = self._primary.position([TopicPartition(*k) for k in assigned])
        except (KafkaException, RuntimeError):
            tps = [TopicPartition(k[0], k[1], -1001) for k in assigned]
            leaving = True
        for tp in tps:
            key = _key(tp)
            a = self._assigned.get(key)
            if a is None:
                continue
            live = a.epoch.live
            if live.stale is not None:
                if tp.offset == live.stale:
                    tp.offset = -1001  # the previous assignment's: nothing known of this one
                else:
                    live.stale = None  # this run's own positions from here on
            if tp.offset < 0:
                if leaving:
                    live.widen(self._fetched_up_to(key))
                continue  # nothing consumed yet: nothing handed out
            if tp.offset < live.next and live.start != UNKNOWN_START:
                self._reset_underneath(key, a, tp.offset)
                continue
            if self._untrusted_position:
                live.widen(tp.offset)
            else:
                live.advance(tp.offset)

    def _reset_underneath(self, key: Key, a: _Assigned, position: int) -> None:
        """The primary's position went back with no seek: librdkafka reset it because its
        offset left the log (the topic was deleted and recreated, the log truncated by an
        unclean leader election). The offsets it had handed out name records of a log that
        is gone; what the log holds now is unprocessed, from its start. So the ledger is
        rewound to it (the pending ranges, offsets of the old log, go too) and the
        primary's stream starts again where it is now: every claim from here is of the new
        log. Before this, commits kept the old log's position (400 on a log that now ended
        at 100): a restart skipped the next 300 records (adversary round 6)."""
        assert self._child is not None
        low = 0
        with contextlib.suppress(KafkaException, RuntimeError):
            low = max(self._primary.get_watermark_offsets(TopicPartition(*key), cached=True)[0], 0)
        low = min(low, position)
        log.warning(
            "%s [%d]: the primary's position went back from %d to %d with no seek (topic "
            "recreated? log truncated?): everything from offset %d is unprocessed again",
            *key,
            a.epoch.live.next,
            position,
            low,
        )
        if a.ledger is not None:
            a.ledger.rewind(low)
            self._child.refresh(key)
        # where the reset put the primary: the log start with auto.offset.reset=earliest;
        # otherwise the log end then, which is not known here: from where it is now
        restart = low if self._settings.reset_offset == OFFSET_BEGINNING else position
        a.epoch.seek(restart)
        a.epoch.live.advance(position)
        self._history[key].trim(a.epoch)

    def _fetched_up_to(self, key: Key) -> int | None:
        """An upper bound of what the primary fetched: the log end it last saw."""
        try:
            _, high = self._primary.get_watermark_offsets(TopicPartition(*key), cached=True)
        except (KafkaException, RuntimeError):
            return None
        return high if high >= 0 else None

    def _handed_changes(self, keys: list[Key]) -> dict[Key, Change]:
        """A bare commit: everything each stream handed out (or, with
        enable.auto.offset.store=false, what store_offsets() claimed)."""
        changes: dict[Key, Change] = {}
        auto_store = self._settings.auto_offset_store
        limits = self._transit_limits()
        if auto_store:
            self._observe(keys)
        for key in keys:
            a = self._assigned.get(key)
            if a is None:
                continue
            if auto_store:
                claims = a.epoch.handed_claims()
                if key in limits:
                    claims = _clip(claims, limits[key])
                if claims:
                    changes[key] = Change(claims)
            elif a.stored:
                change = changes[key] = Change()
                change.rewind, change.metadata = a.stored_as
        return changes

    def _transit_limits(self) -> dict[Key, int]:
        """Per partition, the lowest offset handed to a wrapper but not yet received."""
        limits: dict[Key, int] = {}
        if self._in_transit:
            with self._transit_lock:
                for topic, partition, offset in self._in_transit:
                    key = (topic, partition)
                    limits[key] = min(offset, limits.get(key, offset))
        return limits

    def _hand(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """poll() or consume() for a wrapper that hands the records on later (the asyncio
        twin, whose awaiting caller may be cancelled meanwhile): until ``_received()``
        says the application has them, no bare commit or auto-commit claims them."""
        got = getattr(self, method)(*args, **kwargs)
        entries = _transit_entries(got)
        if entries:
            with self._transit_lock:
                self._in_transit.update(entries)
        return got

    def _received(self, got: Any) -> None:
        """The application has the records ``_hand()`` returned (any thread)."""
        entries = _transit_entries(got)
        if entries:
            with self._transit_lock:
                self._in_transit.subtract(entries)
                for entry in entries:
                    if self._in_transit[entry] <= 0:
                        del self._in_transit[entry]

    def _record_claim(self, key: Key, offset: int) -> Claim:
        history = self._history.get(key)
        if history is None:
            return Claim(offset, offset + 1, exact=False)
        self._observe([key])
        return history.record_claim(offset)

    def _offset_changes(self, offsets: list[TopicPartition]) -> dict[Key, Change]:
        """commit(offsets=)/store_offsets(offsets=): each offset is a position of the
        primary's stream (see _routing.Epoch.position_claim), and a rewind below it."""
        changes: dict[Key, Change] = {}
        for tp in offsets:
            if tp.offset < 0:
                continue  # as librdkafka: a logical offset is not committed
            key = _key(tp)
            change = changes.setdefault(key, Change())
            change.metadata = tp.metadata or ""
            change.rewind = tp.offset
            history = self._history.get(key)
            if history is None:
                change.position = tp.offset
                continue
            self._observe([key])
            claim = history.position_claim(tp.offset)
            if claim is not None:
                change.claims.append(claim)
            a = self._assigned.get(key)
            if (
                not self._warned_offsets
                and a is not None
                and a.ledger is not None
                and tp.offset in a.ledger.ranges
            ):
                self._warned_offsets = True
                log.warning(
                    "%s [%d]: commit(offsets=) at %d, inside a pending backlog range, is a "
                    "position of the primary's stream (a rewind): it cannot say which backlog "
                    "records were processed. Commit backlog records with commit(message=), "
                    "store_offsets(message=) or commit() (logged once)",
                    *key,
                    tp.offset,
                )
        return changes

    # ------------------------------------------------------------- commits
    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit processed offsets; each claim follows the stream it came from.

        ``message``: that record and every record its stream delivered before it.
        ``offsets``: positions of the primary's stream (a backlog record is committed by
        message); a lower offset than before is a rewind, honoured. Nothing: everything
        both streams handed out. The user's group always stores the *safe* offset (lowest
        unprocessed) with the rest in a range token; works for partitions that already
        left the assignment too. A synchronous commit returns within ``socket.timeout.ms``.

        Returns:
            For a synchronous commit, the partitions as the group stored them.
        """
        if message is not None and offsets is not None:
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, "commit() takes message or offsets, not both")
            )
        self._refuse_outside_transactions("commit()")
        changes = self._changes([message] if message is not None else None, offsets)
        try:
            return self._write(changes, asynchronous)
        finally:
            self._publish()

    def _changes(
        self, messages: Sequence[Message] | None, offsets: list[TopicPartition] | None
    ) -> dict[Key, Change]:
        """What a commit of ``messages`` or ``offsets`` (or, with neither, of everything
        handed out) claims, per partition."""
        changes: dict[Key, Change] = {}
        if messages is not None:
            for message in messages:
                key, offset = _record(message)
                changes.setdefault(key, Change()).claims.append(self._record_claim(key, offset))
        elif offsets is not None:
            changes = self._offset_changes(offsets)
        else:
            changes = self._handed_changes(list(self._assigned))
        if not changes:  # as librdkafka: nothing consumed, nothing to commit
            raise _no_offset()
        return changes

    def _refuse_outside_transactions(self, what: str) -> None:
        if self._settings.transactional:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"{what}: parallel.rebalance.transactional=true writes offsets only "
                    "inside the producer's transaction: use send_offsets_to_transaction()",
                )
            )

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
        """As confluent-kafka's (enable.auto.offset.store=false); claims as commit() does,
        written by the next commit() or auto-commit."""
        self._refuse_outside_transactions("store_offsets()")
        changes: dict[Key, Change]
        if message is not None:
            self._primary.store_offsets(message=message)
            key, offset = _record(message)
            changes = {key: Change([self._record_claim(key, offset)])}
        else:
            self._primary.store_offsets(offsets=offsets)
            changes = self._offset_changes(offsets or [])
        for key, change in changes.items():
            a = self._assigned.get(key)
            if a is None or a.ledger is None:
                continue  # librdkafka stores only for assigned partitions
            cp = apply_change(a.ledger, change)
            if cp is not None:
                a.checkpoint = cp
            a.stored = True
            a.stored_as = (change.rewind, change.metadata)

    # --------------------------------------------------------- transactions
    def send_offsets_to_transaction(
        self,
        producer: Any,
        messages: Sequence[Message] | None = None,
        offsets: list[TopicPartition] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Add what ``messages`` claim (or ``offsets``, or with neither everything handed
        out) to ``producer``'s open transaction, for both commit logs.

        The exactly-once twin of ``commit()``: claims as ``commit()`` would, but the user's
        group (safe offset and token, under this member's generation, which fences a
        zombie) and the catch-up group (the checkpoint of backlog records) are written by
        the producer's transaction, atomically with its output. Nothing is claimed in
        this consumer until :meth:`commit_transaction`.

        Raises:
            KafkaException: what the producer raised (abort the transaction then);
                ``_STATE`` for a partition not assigned to this member (its records
                belong to the new owner now) or without parallel.rebalance.transactional;
                ``OFFSET_METADATA_TOO_LARGE`` when the token would need coalescing, which
                would make processed records pending again (their output written twice).
        """
        timeout_s = self._commit_timeout_s if self._child is not None else 30.0
        args = (timeout if timeout is not None else timeout_s,)
        if self._child is None:
            # Mode off: confluent-kafka's own loop, positions of the consumer.
            if messages is not None:
                ends: dict[Key, int] = {}
                for m in messages:
                    key, offset = _record(m)
                    ends[key] = max(ends.get(key, 0), offset + 1)
                offsets = [_tp(k, o) for k, o in ends.items()]
            elif offsets is None:
                offsets = self._primary.position(self._primary.assignment())
            producer.send_offsets_to_transaction(
                offsets, self._primary.consumer_group_metadata(), *args
            )
            return
        if not self._settings.transactional:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    "send_offsets_to_transaction() needs parallel.rebalance.transactional="
                    "true (and enable.auto.commit=false): offsets must travel only in "
                    "transactions",
                )
            )
        txn = self._txns.get(id(producer))
        if txn is None:
            txn = OpenTransaction(producer)
        changes = self._changes(messages, offsets)
        group_offsets: list[TopicPartition] = []
        child_offsets: dict[Key, TopicPartition] = {}
        staged: list[tuple[Key, Ledger, Change]] = []
        for key, change in changes.items():
            a = self._assigned.get(key)
            if a is None:
                why = (
                    "is not planned yet (its commit logs could not be read: an open "
                    "transaction holds offsets for the group), so nothing of it was handed out"
                    if key in self._deferred
                    else "is not assigned to this member: its records belong to its new "
                    "owner (commit the transaction in on_revoke)"
                )
                raise KafkaException(KafkaError(KafkaError._STATE, f"{key[0]} [{key[1]}] {why}"))
            other = next(
                (t for t in self._txns.values() if t is not txn and key in t.claims), None
            )
            if other is not None:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"{key[0]} [{key[1]}] has offsets in another open transaction (another "
                        "producer's): two transactions claiming records of one partition "
                        "cannot both be exact. Commit or abort that one first "
                        "(abort_transaction() also forgets a producer that failed fatally)",
                    )
                )
            if a.ledger is None:
                self._read_ledgers([key], Budget(timeout_s))
            ledger = a.ledger
            if ledger is None:
                raise _no_offset()
            view = txn.view(key, ledger)
            cp = apply_change(view, change)
            try:
                gw = group_write(
                    view, change.metadata, self._settings.metadata_max_bytes, change.rewind, True
                )
            except TokenTooLargeError as exc:
                raise KafkaException(
                    KafkaError(
                        KafkaError.OFFSET_METADATA_TOO_LARGE,
                        f"{key[0]} [{key[1]}]: {exc}; exactly-once cannot coalesce the range "
                        "token (processed records would be read again): commit in smaller "
                        "transactions, in order, or raise parallel.rebalance.metadata.max.bytes",
                    )
                ) from exc
            if gw is not None:
                group_offsets.append(_tp(key, gw.offset, gw.metadata))
            if cp is not None:
                child_offsets[key] = TopicPartition(
                    key[0], key[1], cp.offset, metadata=encode_child_checkpoint(cp)
                )
            staged.append((key, ledger, change))
        retire = {k: tp for k, tp in self._txn_retire.items() if k not in child_offsets}
        child_offsets.update(retire)
        # The user's group first: a zombie's commit fails there (its generation is
        # stale), and the application aborts before anything else is sent.
        if group_offsets:
            producer.send_offsets_to_transaction(
                group_offsets, self._primary.consumer_group_metadata(), *args
            )
        if child_offsets:
            producer.send_offsets_to_transaction(
                list(child_offsets.values()), self._child.group_metadata(), *args
            )
        for key, ledger, change in staged:
            txn.stage(key, ledger, change)
            self._claimed_by[key] = id(producer)
        txn.retired.update(child_offsets)
        self._txns[id(producer)] = txn

    def commit_transaction(self, producer: Any, timeout: float | None = None) -> None:
        """``producer.commit_transaction()``; once it returns, the claims sent with
        :meth:`send_offsets_to_transaction` through that producer are processed for this
        consumer too (each producer's transaction is its own: several may be open at once,
        on different partitions).

        Raises:
            KafkaException: what the producer raised. Retriable: call again. Abortable:
                call :meth:`abort_transaction`. Either way nothing was claimed here.
        """
        if timeout is None:
            producer.commit_transaction()
        else:
            producer.commit_transaction(timeout)
        txn = self._txns.pop(id(producer), None)
        if txn is None:
            return
        txn.settle()
        for key in txn.retired:
            self._txn_retire.pop(key, None)
        self._publish()

    def abort_transaction(
        self,
        producer: Any,
        timeout: float | None = None,
        messages: Sequence[Message] | None = None,
    ) -> None:
        """``producer.abort_transaction()``, then every record the transaction did not
        commit is delivered again: each partition it held has its primary sought back to
        the first record not committed, and the child re-reads its pending backlog. (With
        confluent-kafka alone, the application seeks to the committed offsets; with two
        streams that would re-read processed backlog records.)

        The partitions it held: those of ``messages`` (the records the aborted transaction
        was processing), else those it sent offsets for, else, if it sent none yet, every
        assigned partition that no other open transaction claims and that no other
        producer's transaction was the last to claim. With one producer that is every
        partition; with several (one per partition, say), pass ``messages`` when a
        transaction can fail before its first send_offsets_to_transaction(): a partition
        sought back while another producer still processes its records would have them
        written twice.

        The transaction is forgotten here even when the producer's abort fails: a producer
        that failed fatally cannot abort, and its transaction will never commit (the broker
        aborts it when it times out, or when the next producer with its transactional.id
        starts); its records are delivered again all the same.
        """
        if self._child is None:
            self._abort_plain(producer, timeout)
            return
        txn = self._txns.pop(id(producer), None)
        try:
            if timeout is None:
                producer.abort_transaction()
            else:
                producer.abort_transaction(timeout)
        finally:
            if messages is not None:
                keys = list(dict.fromkeys(_record(m)[0] for m in messages))
            elif txn is not None and txn.claims:
                keys = list(txn.claims)
            else:
                mine = id(producer)
                keys = [
                    k
                    for k in self._assigned
                    if not self._in_open_txn(k) and self._claimed_by.get(k, mine) == mine
                ]
            self._rewind_to_ledgers(keys)

    def _abort_plain(self, producer: Any, timeout: float | None) -> None:
        """Mode off: as Apache Kafka's exactly-once example, back to the committed offsets,
        and to the beginning where the group never committed (where this consumer began is
        not recorded with the mode off)."""
        if timeout is None:
            producer.abort_transaction()
        else:
            producer.abort_transaction(timeout)
        tps = self._primary.committed(self._primary.assignment(), timeout=30.0)
        for tp in tps:
            if tp.offset < 0:
                tp.offset = OFFSET_BEGINNING
            self._primary.seek(tp)

    def _rewind_to_ledgers(self, keys: list[Key]) -> None:
        """Deliver again what the ledgers do not count processed (an aborted or lost
        transaction): the primary from its ledger's position, the child from the first
        pending piece. With nothing committed (or the logs unread), the primary goes back
        to its first record of this assignment: nothing before it was handed out."""
        assert self._child is not None
        keys = [k for k in keys if k in self._assigned]
        self._observe(keys)
        for key in keys:
            a = self._assigned[key]
            if a.ledger is not None and a.ledger.position is not None:
                target = a.ledger.position
            else:
                target = a.epoch.primary[0].start
                if target == UNKNOWN_START:
                    continue  # no record yet: nothing to deliver again
            try:
                self.seek(_tp(key, target))
            except KafkaException as exc:
                # revoked meanwhile (the rebalance is served by the next poll): the next
                # owner starts from the committed logs anyway
                log.info("%s [%d]: not sought back after the abort: %s", *key, exc)
                continue
            if a.ledger is not None and a.ledger.ranges:
                self._child.start(key, a.ledger, a.epoch)
        self._recheck()

    def _auto_commit(self, keys: list[Key], group: bool = True) -> None:
        """librdkafka's auto-commit, emulated (its own would store the primary's position,
        past the backlog): asynchronous, so a revoke or an unassign on a hung broker is
        not held up, and unchanged partitions are not written again."""
        changes = self._handed_changes(keys)
        if not changes:
            return
        try:
            self._write(changes, asynchronous=True, group=group, only_changed=True, read=False)
        except (KafkaException, RuntimeError) as exc:
            log.warning("automatic commit failed (offsets stay safe, records may repeat): %s", exc)
        self._publish()

    def _tick_auto_commit(self) -> None:
        self._due = False
        self._arm_auto_commit()
        # Positions read before this poll fetches anything: the records they cover
        # were returned by earlier calls, so the application is done with them.
        self._auto_commit(list(self._assigned))

    def _arm_auto_commit(self) -> None:
        """The emulated auto-commit's schedule: a timer marks it due, so that the hot
        path reads no clock; the next poll()/consume() then takes the slow path."""
        if not self._settings.auto_commit or self._closed:
            return
        if self._settings.auto_commit_interval_s <= 0:
            # librdkafka: "0 = disable" the periodic commit; those on revoke, unassign()
            # and close() remain
            return
        timer = threading.Timer(self._settings.auto_commit_interval_s, self._mark_due)
        timer.daemon = True
        timer.name = "fastrebalance-auto-commit"
        self._timer = timer
        timer.start()

    def _mark_due(self) -> None:
        # the timer's thread: two bool stores, in this order (see _recheck)
        self._due = True
        self._steady = False

    def _recheck(self) -> None:
        """Whether the next call may take the hot path (this thread, after anything that
        may start or end a catch-up). ``_steady`` is written before ``_due`` is read, so
        a timer firing meanwhile always leaves it False."""
        self._steady = not (
            self._reading or self._unresolved or self._deferred or self._settings.transactional
        )
        if self._due:
            self._steady = False

    def _write(
        self,
        changes: dict[Key, Change],
        asynchronous: bool,
        group: bool = True,
        only_changed: bool = False,
        read: bool = True,
    ) -> list[TopicPartition] | None:
        """Apply ``changes`` and write both logs: the child's checkpoints (asynchronously:
        the group's token carries the same progress), then the group's safe offsets.

        A partition without a ledger (not ours any more, or never read) is written only
        after reading what the group stores (``read``); automatic commits skip it instead
        (never a round trip inside a rebalance callback or a poll())."""
        assert self._child is not None
        budget = Budget(self._commit_timeout_s)
        ledgers: dict[Key, Ledger] = {}
        unknown = []
        for key in changes:
            a = self._assigned.get(key)
            if a is not None and a.ledger is not None:
                ledgers[key] = a.ledger
            else:
                unknown.append(key)
        if unknown and read:
            # Not ours now (revoked, lost, never assigned) or never read: what the group
            # stores is read first, so the write keeps every pending range it holds.
            ledgers.update(self._read_ledgers(unknown, budget))
        checkpoints: dict[Key, ChildCheckpoint] = {}
        writes = []
        max_bytes = self._settings.metadata_max_bytes
        for key, change in changes.items():
            ledger = ledgers.get(key)
            if ledger is None:
                continue
            cp = apply_change(ledger, change)
            a = self._assigned.get(key)
            if a is not None:
                cp = cp or a.checkpoint
                a.checkpoint = None
            if cp is not None:
                checkpoints[key] = cp
            gw = group_write(ledger, change.metadata, max_bytes, change.rewind)
            if gw is None:
                continue
            if gw.coalesced is not None:
                log.info(
                    "%s [%d]: %d pending ranges coalesced to %d to fit %d bytes of metadata",
                    key[0],
                    key[1],
                    len(ledger.ranges),
                    len(gw.coalesced),
                    max_bytes,
                )
                ledger.pend(gw.coalesced)
                self._child.refresh(key)
                self._coalescings += 1
            if a is not None:
                self._note_token(key, gw.metadata)
            if only_changed and a is not None and a.written == (gw.offset, gw.metadata):
                continue
            writes.append((key, gw.offset, gw.metadata))
        if checkpoints:
            self._child.commit(checkpoints)
        if not group:
            return None
        if not writes:
            return None if asynchronous else []
        offsets = [_tp(k, offset, metadata) for k, offset, metadata in writes]
        try:
            result = self._commit_group(offsets, asynchronous, budget)
        except KafkaException:
            self._group_commit_failures += 1
            raise
        for key, offset, metadata in writes:
            a = self._assigned.get(key)
            if a is not None:
                a.written = (offset, metadata)
                a.stored, a.stored_as = False, (None, "")
        return result

    def _read_ledgers(self, keys: list[Key], budget: Budget) -> dict[Key, Ledger]:
        """Ledgers from what both logs store; an assigned partition adopts its own."""
        out: dict[Key, Ledger] = {}
        for key, restored in self._planner.read_logs(keys, budget).items():
            out[key] = restored.ledger()
            a = self._assigned.get(key)
            if a is not None:
                a.ledger = out[key]
        return out

    def _commit_group(
        self, offsets: list[TopicPartition], asynchronous: bool, budget: Budget
    ) -> list[TopicPartition] | None:
        if asynchronous:
            self._primary.commit(offsets=offsets, asynchronous=True)
            return None

        def commit() -> list[TopicPartition] | None:
            return call_with_retries(
                lambda: self._primary.commit(offsets=offsets, asynchronous=False),
                max_seconds=budget.remaining(),
            )

        # librdkafka queues an OffsetCommit until a coordinator answers: the wait is ours.
        return call_bounded(
            commit, budget.request_timeout(self._commit_timeout_s), "commit"
        )

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """Per partition, the lowest offset not yet processed, from both commit logs:
        the child's progress while a range is pending, the primary's offset after."""
        # confluent-kafka's committed() without a timeout waits forever on a hung broker;
        # ours gives up after socket.timeout.ms
        budget = Budget(timeout if timeout is not None and timeout >= 0 else self._commit_timeout_s)
        keys = [_key(tp) for tp in partitions]
        errors: dict[Key, TopicPartition] = {}
        restored = self._planner.read_logs(keys, budget, errors)
        out = []
        for key in keys:
            if key in errors:  # confluent-kafka's own answer, its error included
                out.append(errors[key])
                continue
            r = restored.get(key)
            safe = r.safe_offset if r is not None else None
            metadata = r.user_metadata if r is not None else ""
            out.append(_tp(key, -1001 if safe is None else safe, metadata))
        return out

    # ------------------------------------------------------------ positions
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The primary's position; the child takes no part (KIP-333)."""
        return self._primary.position(partitions)

    def seek(self, partition: TopicPartition) -> None:
        """Seek the primary. The child keeps its ranges: seeking changes what is read,
        not what was processed. A backward seek below where the primary started re-reads
        backlog records (they come twice) and claims them only once re-delivered; a
        forward seek skips fresh records as a plain consumer's does."""
        key = _key(partition)
        if key in self._deferred:
            # not planned yet: the seek is where its plan will start (the application's
            # own start, as in assign())
            self._deferred[key] = partition.offset
            return
        a = self._assigned.get(key)
        if a is not None:
            self._observe([key])
        self._primary.seek(partition)
        if a is None:
            return
        offset = partition.offset
        if offset < 0:
            low, high = -1, -1
            with contextlib.suppress(KafkaException):
                low, high = self._primary.get_watermark_offsets(
                    TopicPartition(*key), cached=True
                )
            if offset == OFFSET_END:
                offset = max(high, a.epoch.floor)
            elif offset == OFFSET_BEGINNING:
                offset = max(low, 0)  # a low mark only rises: never above the real start
            else:
                # where librdkafka lands is not known here: the run starts at its first
                # record (a guess, such as F, could credit it with the child's backlog)
                offset = UNKNOWN_START
        a.epoch.seek(offset)
        self._history[key].trim(a.epoch)
        if a.epoch.unresolved:  # a logical offset of an unplanned partition
            self._unresolved.add(key)
            self._recheck()

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._primary.pause(partitions)
        assert self._child is not None
        self._child.pause([_key(tp) for tp in partitions])

    def resume(self, partitions: list[TopicPartition]) -> None:
        # a deferred partition stays paused until it is planned (then resumed, unless
        # the application paused it meanwhile)
        self._primary.resume([tp for tp in partitions if _key(tp) not in self._deferred])
        assert self._child is not None
        self._child.resume([_key(tp) for tp in partitions])

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        kwargs: dict[str, Any] = {"cached": cached}
        if timeout is not None:
            kwargs["timeout"] = timeout
        low, high = self._primary.get_watermark_offsets(partition, **kwargs)
        return low, high

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

        Returns within ``2 * socket.timeout.ms`` plus ``_REVOKE_WAIT_S``, even when the
        broker is unreachable (librdkafka's own close() waits for outstanding commits): a
        subscribed member first leaves its assignment here, serving the revoke on this
        thread; the handles are then closed on a helper thread while this one waits, and
        are left to finish there if the broker never answers.
        """
        if self._closed:
            return
        if self._child is None:
            self._closed = True
            self._primary.close()
            return
        if self._timer is not None:
            self._timer.cancel()
        child = self._child
        if self._subscribed:
            self._leave_assignment()
        self._closed = True

        def shutdown() -> None:
            try:
                if self._settings.auto_commit and not self._subscribed:
                    self._auto_commit(list(self._assigned))
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

    def _leave_assignment(self) -> None:
        """Unsubscribe and serve the revoke here, before librdkafka's close().

        librdkafka 2.16 drops the reply to a rebalance request that reaches its group
        after the group terminated, and confluent-kafka waits for that reply in the
        rebalance callback holding the GIL: a revoke served inside close() (under load, a
        cooperative rebalance under way) then hangs the whole process, the thread waiting
        for close() included. Served here, while the group is alive, the revoke is always
        answered (on_revoke commits as usual), and close() has no rebalance left to run.
        Records fetched meanwhile are dropped: they were never handed out.
        """
        keys = list(self._assigned)
        self._observe(keys)  # what the application got, before anything else
        self._untrusted_position = self._leaving = True
        try:
            self._primary.unsubscribe()
            deadline = time.monotonic() + _REVOKE_WAIT_S
            while self._assigned and time.monotonic() < deadline:
                self._primary.poll(_REVOKE_SLICE_S)
        except (KafkaException, RuntimeError) as exc:
            log.warning("leaving the group before close() failed: %s", exc)
        finally:
            self._untrusted_position = False

    # ------------------------------------------------------------- reports
    def _report(self, code: int, msg: str) -> None:
        log.error(msg)
        if self._error_cb is not None:
            self._error_cb(KafkaError(code, msg))

    def _report_error(self, err: KafkaError) -> None:
        if self._error_cb is not None:
            self._error_cb(err)

    def _report_deleted(self, topic: str, partition: int, start: int, end: int) -> None:
        self._report(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"records {topic} [{partition}] offsets [{start}, {end}) were deleted by "
            "retention before the catch-up consumer read them",
        )
