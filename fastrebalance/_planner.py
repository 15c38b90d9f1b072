"""Reading what an assignment needs to be planned: both commit logs and the watermarks.

Planning runs inside librdkafka's rebalance callback, so inside the user's poll(): every
round trip here shares one budget (``PLAN_BUDGET_S``), and each is batched over the whole
assignment (one OffsetFetch per log, one ListOffsets for each end of the log), so the
time does not grow with the number of partitions. A partition whose committed offset
could not be read is not planned: the facade defers it (paused) and asks again later, so
nothing is ever read, or written over a range token, that this member could not see.

The decisions themselves are pure and live in ``_planning``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Consumer as _RdConsumer

from ._child import Child
from ._planning import Restored, restore
from ._retry import Budget, call_with_retries, is_retriable
from ._token import is_ours

__all__ = ["PLAN_BUDGET_S", "REQUEST_TIMEOUT_S", "Planner", "Reading"]

log = logging.getLogger("fastrebalance.consumer")

Key = tuple[str, int]

#: Broker round trips made on the user's behalf (committed offsets, watermarks).
REQUEST_TIMEOUT_S = 10.0
#: All the round trips that plan one assignment (both commit logs, the watermarks) share
#: this: they run inside a rebalance callback, so they hold the user's poll().
PLAN_BUDGET_S = 30.0

#: Errors meaning the partition does not exist (any more).
UNKNOWN_PARTITION = (
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


@dataclass
class Reading:
    """What the cluster said about one partition when it was gained."""

    restored: Restored | None  #: None: the group's offset could not be read
    watermarks: tuple[int, int] | KafkaException | None = None


class Planner:
    """Reads both logs and the watermarks of an assignment, with the primary's handle
    and the child's (both owned by the user's thread, which runs this)."""

    def __init__(self, primary: _RdConsumer, child: Child, uncommitted: bool = False) -> None:
        self._primary = primary
        self._child = child
        #: a partition never committed is planned from its watermarks too (it catches up
        #: on [log start, log end): parallel.rebalance.catchup.uncommitted with earliest)
        self.uncommitted = uncommitted

    def read(
        self, partitions: Sequence[TopicPartition], budget: Budget, quiet: bool = False
    ) -> dict[Key, Reading]:
        """Per partition: the merged commit logs and both ends of the log. ``quiet``: a
        failure to read is expected (a retry of deferred partitions) and logged at DEBUG."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        out: dict[Key, Reading] = {k: Reading(None) for k in keys}
        if not keys:
            return out
        try:
            restored = self.read_logs(keys, budget)
        except KafkaException as exc:
            # Without the committed offsets there is nothing to plan: the partitions are
            # deferred (the facade retries).
            log.log(
                logging.DEBUG if quiet else logging.ERROR,
                "cannot read committed offsets: %s (the partitions wait until they are read)",
                exc,
            )
            return out
        for key, r in restored.items():
            out[key].restored = r
        marks = self.watermarks(
            [k for k, r in restored.items() if r.position is not None or self.uncommitted],
            budget,
        )
        for key, mark in marks.items():
            out[key].watermarks = mark
        return out

    def read_logs(
        self,
        keys: list[Key],
        budget: Budget,
        errors: dict[Key, TopicPartition] | None = None,
    ) -> dict[Key, Restored]:
        """What both commit logs say about ``keys``, merged as a restart merges them.
        ``errors`` receives the group's answer for each partition the broker answered
        with an error (an unknown topic or partition), as confluent-kafka returns it.

        Raises:
            KafkaException: the group's committed offsets could not be read (the child's
                log is optional: without it the backlog is re-read).
        """
        def read() -> list[TopicPartition]:
            answers = self._primary.committed(
                [TopicPartition(*k) for k in keys],
                timeout=budget.request_timeout(REQUEST_TIMEOUT_S),
            )
            # A partition answered with a retriable error (a coordinator loading or moving)
            # has an offset we did not get: read as "nothing committed", it would start at
            # auto.offset.reset (latest: records skipped), or a commit would drop its
            # pending ranges. So it is asked again; the application's committed() gets
            # the answer as confluent-kafka gives it (``errors``).
            for a in answers:
                if errors is None and a.error is not None and is_retriable(KafkaException(a.error)):
                    raise KafkaException(a.error)
            return answers

        got = call_with_retries(read, max_seconds=budget.remaining())
        group = {(tp.topic, tp.partition): tp for tp in got}
        if errors is not None:
            errors.update({k: tp for k, tp in group.items() if tp.error is not None})
        tokens = [k for k, tp in group.items() if is_ours(tp.metadata)]
        checkpoints: dict[Key, TopicPartition] = {}
        if tokens:
            try:
                checkpoints = call_with_retries(
                    lambda: self._child.committed(
                        tokens, budget.request_timeout(REQUEST_TIMEOUT_S)
                    ),
                    max_seconds=budget.remaining(),
                )
            except (KafkaException, RuntimeError) as exc:
                log.warning("cannot read the child's commit log; backlog re-read: %s", exc)
        out: dict[Key, Restored] = {}
        for key, g in group.items():
            c = checkpoints.get(key)
            restored = restore(
                g.offset, g.metadata, c.offset if c else -1, c.metadata if c else None
            )
            if restored.problem:
                log.warning(
                    "%s [%d]: %s; using offset %d", key[0], key[1], restored.problem, g.offset
                )
            elif g.metadata and not is_ours(g.metadata) and g.offset >= 0:
                log.info(
                    "%s [%d]: committed metadata is not a fastrebalance token (another tool's "
                    "or the application's): offset %d used as is, metadata kept",
                    key[0],
                    key[1],
                    g.offset,
                )
            out[key] = restored
        return out

    def read_to_write(
        self, keys: list[Key], budget: Budget
    ) -> tuple[dict[Key, Restored], set[Key]]:
        """What a commit of partitions not assigned here (revoked, lost, never ours) is
        applied to: the merged commit logs, and with never-committed catch-up on
        (``uncommitted``) a partition the group never committed read as if the group had
        committed its log start. Also returns the partitions so read.

        That is what the plan of such a partition assumed (``plan_assignment``'s
        ``from_start``): its whole log was backlog, the primary started at the log end.
        Read as "nothing committed", a late commit of the primary's record claimed
        [primary start, record] on an empty ledger, which a first commit defines: the
        offset was stored past the log the child had not read, with no token (the chaos
        harness's asynchronous pipeline, whose commits land after its partitions moved).

        Raises:
            KafkaException: the group's offsets, or the log start of a partition it never
                committed, could not be read (nothing is written).
        """
        restored = self.read_logs(keys, budget)
        never = [k for k, r in restored.items() if r.position is None]
        if not self.uncommitted or not never:
            return restored, set()
        fresh = set()
        for key, mark in self.watermarks(never, budget).items():
            if isinstance(mark, tuple):
                restored[key] = Restored(mark[0], user_metadata=restored[key].user_metadata)
                fresh.add(key)
            elif mark.args[0].code() not in UNKNOWN_PARTITION:
                raise mark
            # an unknown partition has no log to protect: its first commit defines it
        return restored, fresh

    def watermarks(
        self, keys: list[Key], budget: Budget
    ) -> dict[Key, tuple[int, int] | KafkaException]:
        """Both ends of every partition's log: two round trips for the whole assignment.

        A ListOffsets for the earliest and one for the latest offsets of all partitions at
        once; a partition without an answer is asked again on its own, so a per-partition
        error (unknown partition, leader moving) is retried and reported as such.
        """
        out: dict[Key, tuple[int, int] | KafkaException] = {}
        if not keys:
            return out
        ends: dict[Key, list[int]] = {k: [] for k in keys}
        spent = KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"planning took its whole {PLAN_BUDGET_S:g}s")
        )
        try:
            for which in (OFFSET_BEGINNING, OFFSET_END):
                ask = [TopicPartition(k[0], k[1], which) for k in keys]

                def list_offsets(ask: list[TopicPartition] = ask) -> list[TopicPartition]:
                    return self._primary.offsets_for_times(
                        ask, timeout=budget.request_timeout(REQUEST_TIMEOUT_S)
                    )

                got = call_with_retries(list_offsets, max_seconds=budget.remaining())
                for tp in got:
                    key = (tp.topic, tp.partition)
                    if tp.error is None and tp.offset >= 0 and key in ends:
                        ends[key].append(tp.offset)
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
            def watermarks(key: Key = key) -> tuple[int, int]:
                low, high = self._primary.get_watermark_offsets(
                    TopicPartition(*key),
                    timeout=budget.request_timeout(REQUEST_TIMEOUT_S),
                    cached=False,
                )
                return low, high

            try:
                out[key] = call_with_retries(watermarks, max_seconds=budget.remaining())
            except KafkaException as exc:
                out[key] = exc
        return out

