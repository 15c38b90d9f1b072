"""What the consumer tells the outside: catch-up status, metrics, statistics and errors.

Everything here reads the shared state (``_partitions``) and the child's counters; the
only things written are counters the other parts bump and the published snapshot. The
snapshot is the one object another thread may read (a metrics exporter's): a new dict each
time, never mutated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from ._child import Child
from ._config import ParallelConfig
from ._partitions import Key, Partitions
from ._token import is_ours

__all__ = ["CatchupStatus", "CatchupStatuses", "Reporter"]

log = logging.getLogger("fastrebalance.consumer")

#: How often a catch-up publishes its metrics snapshot (fastrebalance.metrics), seconds.
PUBLISH_S = 1.0


@dataclass(frozen=True)
class CatchupStatus:
    """Catch-up progress of one partition, as ``catchup_status()`` reports it.

    Attributes:
        pending_ranges: backlog ranges ``[start, end)`` not yet committed as processed.
        child_position: next offset the child will deliver; None when it is not
            reading this partition (finished, or never needed).
        records_remaining: pending offsets the child has still to read. With
            parallel.rebalance.group.catchup, what no member is known to be done with:
            on the partition's owner every pending offset of its backlog (a chunk leaves
            it when its holder's done is absorbed), on a helper the offsets of the chunks
            it holds that its application has not committed. Never fewer than are left.
        child_alive: the child consumer exists and is running (reading or standby).
        chunks: with parallel.rebalance.group.catchup, who holds which chunk.
        assigned: False for a partition this member only helps with (group-wide
            catch-up: it reads chunks of it for the group, another member owns it).
    """

    pending_ranges: tuple[tuple[int, int], ...]
    child_position: int | None
    records_remaining: int
    child_alive: bool
    #: group-wide catch-up: (start, end, holder member id, holder live) of each chunk of
    #: the partition not done yet, as the claims log says
    chunks: tuple[tuple[int, int, str | None, bool], ...] = ()
    assigned: bool = True


class CatchupStatuses(dict[Key, CatchupStatus]):
    """What ``catchup_status()`` returns: the per-partition statuses (a plain dict of
    them, as before), plus ``removed_members``: each dead member of this group that this
    consumer handled at ``subscribe()`` (member id, ``group.instance.id``, protocol, pid
    and host of its dead process, ``result``: removed / gone / replaced / failed,
    ``at``: when, epoch seconds; ``error`` for a failure)."""

    removed_members: tuple[dict[str, Any], ...] = ()


class Reporter:
    """Status, metrics, the statistics merged for ``stats_cb``, and reported errors."""

    def __init__(
        self,
        partitions: Partitions,
        child: Child,
        settings: ParallelConfig,
        client_id: str,
        group_id: str,
        error_cb: Callable[[KafkaError], None] | None,
        user_on_commit: Callable[..., None] | None,
    ) -> None:
        self._partitions = partitions
        self._child = child
        self._settings = settings
        self._client_id = client_id
        self._group_id = group_id
        self._error_cb = error_cb
        self._user_on_commit = user_on_commit
        self._child_stats: str | None = None
        self._stats_at: tuple[float, int] = (time.monotonic(), 0)
        self._token_warned: set[Key] = set()
        self.published: dict[str, Any] = {}
        self.published_at = 0.0
        # counters bumped by the other parts (the user's thread)
        self.coalescings = 0
        self.group_commit_failures = 0
        self.token_bytes: dict[Key, int] = {}
        self.token_warnings = 0
        self.primary_handed_closed = 0
        #: the last assignment's plan (partitions, seconds in all, seconds of round trips):
        #: it runs inside the rebalance callback, so it is what a rebalance costs the
        #: application's poll() on top of librdkafka's own work
        self.last_plan: dict[str, Any] | None = None
        #: group-wide catch-up, when on (its status joins the metrics)
        self.group: Any = None
        #: the removal of dead members at subscribe() (_recovery), when on
        self.recovery: Any = None
        #: told which partitions' group commit failed (the commit path writes them again)
        self.commit_failed: Callable[[list[TopicPartition]], None] = lambda tps: None

    # -- status -------------------------------------------------------------------------
    def catchup_status(self) -> CatchupStatuses:
        alive = self._child.alive
        group = self.group
        out = CatchupStatuses()
        if self.recovery is not None:
            out.removed_members = tuple(self.recovery.removals())
        for key, a in self._partitions.assigned.items():
            pos = self._child.position(key)
            ranges = a.ledger.ranges
            if not ranges and pos is None:
                continue
            remaining = 0
            if group is not None:
                # the owner's child reads only the chunks it wins: its position says
                # nothing of the rest (it read 0 left with 90,000 undelivered)
                remaining = ranges.count()
            elif pos is not None and ranges:
                remaining = sum(e - max(s, pos) for s, e in ranges if e > pos)
            chunks = group.chunks_of(key) if group is not None else ()
            out[key] = CatchupStatus(ranges.as_tuple(), pos, remaining, alive, chunks)
        if group is not None:
            for key, held in group.held_ranges().items():
                if key in out or not held:
                    continue
                out[key] = CatchupStatus(
                    held.as_tuple(),
                    self._child.position(key),
                    held.count(),
                    alive,
                    group.chunks_of(key),
                    assigned=False,
                )
        return out

    def catchup_metrics(self) -> dict[str, Any]:
        now = time.monotonic()
        child = self._child
        delivered = child.records_delivered
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
            "child_state": child.state.value,
            "child_alive": child.alive,
            "child_handles_created": child.handles_created,
            "backlog_records_delivered": delivered,
            "backlog_records_per_second": round(rate, 1),
            "ranges": sum(
                len(p["pending_ranges"]) for t in partitions.values() for p in t.values()
            ),
            "records_remaining": sum(
                p["records_remaining"] for t in partitions.values() for p in t.values()
            ),
            "last_plan": self.last_plan,
            "partitions": partitions,
            **({"group": self.group.status()} if self.group is not None else {}),
            **self._dead_members(),
        }

    # -- statistics (stats_cb) ----------------------------------------------------------
    def keep_child_stats(self, stats: str) -> None:
        self._child_stats = stats

    def merge_stats(self, stats: str) -> str:
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

    # -- the published snapshot ---------------------------------------------------------
    def publish(self) -> None:
        """Publish the metrics snapshot (this consumer's thread only)."""
        child = self._child
        assigned = self._partitions.assigned
        partitions = {}
        for key, a in assigned.items():
            ranges = a.ledger.ranges
            partitions[key] = {
                "pending_records": ranges.count() if ranges else 0,
                "pending_ranges": len(ranges) if ranges else 0,
                "child_position": child.position(key),
                "token_bytes": self.token_bytes.get(key, 0),
            }
        primary = self.primary_handed_closed + sum(
            run.next - run.start for a in assigned.values() for run in a.epoch.primary
        )
        self.published = {
            "client_id": self._client_id,
            "group_id": self._group_id,
            "child_alive": child.alive,
            "partitions": partitions,
            "records_delivered": {"primary": primary, "child": child.records_delivered},
            "catchups_started": child.catchups_started,
            "catchups_finished": child.catchups_finished,
            "coalescings": self.coalescings,
            "token_budget_bytes": self._settings.metadata_max_bytes,
            "token_budget_warnings": self.token_warnings,
            "commit_failures": {
                "group": self.group_commit_failures,
                "catchup": child.commit_failures,
            },
            "last_plan": self.last_plan,
            **({"group": self.group.status()} if self.group is not None else {}),
            **self._dead_members(),
        }
        self.published_at = time.monotonic()

    def _dead_members(self) -> dict[str, Any]:
        if self.recovery is None:
            return {}
        return {"dead_members": {**self.recovery.counts(), "handled": self.recovery.removals()}}

    def publish_if_due(self, now: float) -> None:
        if now - self.published_at >= PUBLISH_S:
            self.publish()

    # -- what the commit path reports ---------------------------------------------------
    def on_group_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The group's commit results (librdkafka's on_commit): counted, then the
        application's callback."""
        if err is not None or any(tp.error is not None for tp in partitions):
            self.group_commit_failures += 1
            self.commit_failed(
                partitions if err is not None else [tp for tp in partitions if tp.error]
            )
        if self.group is not None and err is None:
            self.group.group_committed(
                (tp.topic, tp.partition) for tp in partitions if tp.error is None
            )
        if self._user_on_commit is not None:
            self._user_on_commit(err, partitions)

    def note_token(self, key: Key, metadata: str | None) -> None:
        """Token size per partition (metrics), and a warning at 75 % of the budget: past
        the budget, ranges are coalesced and processed records are re-read."""
        size = len(metadata.encode("utf-8")) if metadata and is_ours(metadata) else 0
        self.token_bytes[key] = size
        budget = self._settings.metadata_max_bytes
        if size > 0.75 * budget:
            if key not in self._token_warned:
                self._token_warned.add(key)
                self.token_warnings += 1
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

    # -- errors ---------------------------------------------------------------------------
    def report(self, code: int, msg: str) -> None:
        log.error(msg)
        if self._error_cb is not None:
            self._error_cb(KafkaError(code, msg))

    def report_error(self, err: KafkaError) -> None:
        if self._error_cb is not None:
            self._error_cb(err)

    def report_deleted(self, topic: str, partition: int, start: int, end: int) -> None:
        self.report(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"records {topic} [{partition}] offsets [{start}, {end}) were deleted by "
            "retention before the catch-up consumer read them",
        )
