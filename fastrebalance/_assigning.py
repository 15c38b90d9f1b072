"""The assignment lifecycle: partitions gained are planned and opened, partitions lost are
retired, partitions that cannot be planned yet wait (deferred).

**Planning inside the rebalance callback.** When partitions are gained, the plan reads,
once the user's ``on_assign`` has handed them to ``assign()`` or returned (so what it
commits, a rewind say, is where the assignment starts, as librdkafka's fetch of committed
offsets after ``assign()`` makes it for a plain consumer), both commit logs and both
watermarks of every partition (``_planner``), then decides where each stream starts
(``_planning``, pure). All of it shares one budget (30 s; 2 s in exactly-once mode),
because it runs inside the user's ``poll()``. A partition it could not plan is deferred:
assigned paused, nothing of it handed out, planned by a later call (see ``defer``).

Thread ownership: the user's thread's, like the handles; rebalance callbacks run inside
``poll()``/``consume()`` on that thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Consumer as _RdConsumer

from ._child import Child
from ._committing import Committer, tp
from ._config import ParallelConfig
from ._delivery import Delivery
from ._groupcatchup import GroupCatchup
from ._ledger import Ledger
from ._partitions import Key, Partitions
from ._planner import PLAN_BUDGET_S, UNKNOWN_PARTITION, Planner, Reading
from ._planning import Plan, plan_assignment
from ._reporting import Reporter
from ._retry import Budget
from ._routing import UNKNOWN_START, Epoch

__all__ = ["Assignments"]

log = logging.getLogger("fastrebalance.consumer")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

#: Exactly-once: how long planning inside the rebalance callback may wait for the commit
#: logs before the partitions are deferred. An open transaction holding offsets for the
#: group (a dead producer's until its transaction.timeout.ms, or this member's own) makes
#: the read wait until it ends.
EOS_PLAN_S = 2.0
#: A deferred partition's next attempt gets this long, doubling up to _DEFERRED_MAX_S, as
#: does the pause between attempts: a deferred partition costs its member at most a share
#: of its time.
_DEFERRED_FIRST_S = 0.25
_DEFERRED_MAX_S = 2.0
#: How long close() serves the group for its revoke before closing the handles.
REVOKE_WAIT_S = 10.0
#: ...in slices this long: librdkafka's poll() does not return once it served the revoke,
#: so a slice is what close() takes at least (50 ms made close() 50x plain's).
_REVOKE_SLICE_S = 0.01
#: A member that holds nothing and is still in its group after this long without a rebalance
#: callback is left to librdkafka's close(): a hung broker keeps librdkafka from completing
#: the unassign (and so from leaving) for as long as it hangs, and there is no more rebalance
#: to serve then; a queued assignment and the revoke after it come within milliseconds.
_LEAVE_QUIET_S = 0.5


def _key(t: TopicPartition) -> Key:
    return (t.topic, t.partition)


class Assignments:
    """Gains, losses and plans of partitions; the rebalance callbacks librdkafka calls."""

    def __init__(
        self,
        owner: Any,
        primary: _RdConsumer,
        child: Child,
        planner: Planner,
        partitions: Partitions,
        delivery: Delivery,
        committer: Committer,
        reporter: Reporter,
        settings: ParallelConfig,
        group: GroupCatchup | None = None,
    ) -> None:
        self._group = group
        self._owner = owner  # what the application's rebalance callbacks receive
        self._primary = primary
        self._child = child
        self._planner = planner
        self._p = partitions
        self._delivery = delivery
        self._committer = committer
        self._reporter = reporter
        self._settings = settings
        self.callbacks: tuple[RebalanceCallback | None, ...] = (None, None, None)
        self._plan_budget = Budget(0)  # shared by every round trip of one assignment
        self._in_rebalance = False
        self._assigned_in_callback = False
        self._deferred_at = 0.0  # the next attempt to plan deferred partitions
        self._deferred_tries = 0
        #: close() is serving the last rebalance, or is done: nothing more is planned
        self.leaving = False
        self._served = 0  # rebalance callbacks run, for leave() to see them come
        self._user_error: Exception | None = None  # the last the application's raised

    # -- the rebalance callbacks ----------------------------------------------------------
    def on_assign(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance, self._assigned_in_callback = True, False
        self._served += 1
        try:
            if self.callbacks[0] is not None:
                # What confluent-kafka would pass. The commit logs are read after the
                # callback, when these are handed to assign() or when it returns: what
                # the callback itself commits (a rewind, say) is what the plan starts from,
                # as librdkafka fetches the committed offsets only once assign() is made.
                given = [TopicPartition(t.topic, t.partition, t.offset) for t in partitions]
                self._user(self.callbacks[0], given)
        finally:
            # confluent-kafka assigns them even when the callback raised: so do we
            try:
                if not self._assigned_in_callback:
                    self.apply(partitions, incremental=self._settings.incremental)
            finally:
                self._in_rebalance = False

    def on_revoke(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance = True
        self._served += 1
        try:
            if self.callbacks[1] is not None:
                self._user(self.callbacks[1], partitions)
        finally:
            # confluent-kafka unassigns them even when the callback raised: so do we
            try:
                keys = [_key(t) for t in partitions]
                if self._settings.auto_commit:
                    self._committer.auto_commit(keys)
                if self._group is not None and not self.leaving:
                    # done chunks of these partitions leave the group's offset before they
                    # go (close() settled already)
                    self._group.settle(min(5.0, self._committer.timeout_s))
                self.retire(keys)
            finally:
                self._in_rebalance = False

    def on_lost(self, _handle: Any, partitions: list[TopicPartition]) -> None:
        self._in_rebalance = True
        self._served += 1
        keys = [_key(t) for t in partitions]
        try:
            # confluent-kafka calls on_revoke when no on_lost is given: so do we
            user_cb = self.callbacks[2] or self.callbacks[1]
            if user_cb is not None:
                self._committer.lost = frozenset(keys)
                try:
                    self._user(user_cb, partitions)
                finally:
                    self._committer.lost = frozenset()
        finally:
            try:
                if self._settings.auto_commit:
                    # The group commit would be fenced; the child's own log still accepts
                    # its checkpoints, so the next owner resumes the backlog from there.
                    self._committer.auto_commit(keys, group=False)
                self.retire(keys)
            finally:
                self._in_rebalance = False

    def _user(self, callback: RebalanceCallback, partitions: list[TopicPartition]) -> None:
        """The application's callback; what it raises is remembered for leave()."""
        try:
            callback(self._owner, partitions)
        except Exception as exc:
            self._user_error = exc
            raise

    # -- gaining partitions -------------------------------------------------------------------
    def apply(self, partitions: list[TopicPartition], incremental: bool) -> None:
        """Plan each partition (unless the application chose its offset), hand the
        starts to the primary, open the planned partitions, defer the others."""
        if incremental:
            self._refuse_as_librdkafka(partitions, assigned=True)
        self._delivery.credit_returned()  # before any run of these partitions begins
        began = time.monotonic()
        readings = self._read(list(partitions))
        read_s = time.monotonic() - began
        plans: dict[Key, tuple[Plan, int]] = {}
        deferred: list[TopicPartition] = []
        starts = []
        for t in partitions:
            key = _key(t)
            plan = self._plan(key, readings.get(key, Reading(None)), t.offset)
            if plan is None:
                # A partition is never read before it is planned: it waits, paused (what
                # it fetches meanwhile is dropped, see defer), and is sought to its plan.
                # Assigned at the log START: should librdkafka ever apply its resolution
                # of this logical start after our seek (seen once on Apache Kafka 3.9
                # during a broker restart, with OFFSET_END: the primary began at the log
                # end after being sought to P, and the run from P claimed the 1,261
                # records between as processed), the primary lands below its plan, which
                # the ledger treats as a position that went back (records delivered again,
                # none skipped). At the log end it would skip them.
                deferred.append(t)
                starts.append(TopicPartition(t.topic, t.partition, OFFSET_BEGINNING))
                continue
            plans[key] = (plan, t.offset)
            start = t.offset if plan.start is None else plan.start
            starts.append(TopicPartition(t.topic, t.partition, start))
        # Before the primary's assignment changes, close the epochs it ends: what the
        # primary handed out is read while it still has the partitions. A partition
        # assigned again starts a new epoch; one assign() drops is retired.
        if incremental:
            self._primary.incremental_assign(starts)
        else:
            self.retire([*self._p.assigned, *self._p.deferred])
            self._primary.assign(starts)
        if deferred:
            self._defer(deferred)
        self._open(plans)
        if self._in_rebalance:
            self._assigned_in_callback = True
        self._reporter.last_plan = {
            "partitions": len(partitions),
            "seconds": time.monotonic() - began,
            "read_seconds": read_s,
        }
        self._reporter.publish()

    def _read(self, partitions: list[TopicPartition]) -> dict[Key, Reading]:
        if self.leaving:
            # An assignment delivered inside close(), revoked right after: reading would
            # only wait on a group that is leaving (librdkafka answers no OffsetFetch while
            # it terminates) and spend close()'s bound. Nothing is read, so nothing is
            # planned: nothing is handed out before the revoke either.
            return {}
        if self._settings.transactional:
            # A partition this member's own open transaction sent offsets for cannot be
            # read (the broker answers UNSTABLE_OFFSET_COMMIT until it ends): deferred
            # without a try, so that the application can end the transaction meanwhile.
            partitions = [t for t in partitions if not self._committer.in_open_txn(_key(t))]
            self._plan_budget = Budget(EOS_PLAN_S)
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
                    self._reporter.report(
                        marks.args[0].code(),
                        f"{key[0]} [{key[1]}] is unknown to the cluster (topic deleted?): its "
                        f"pending backlog {restored.ranges.as_tuple()[:5]} cannot be read; it "
                        "stays pending, so the committed offset does not move past it",
                    )
        if restored.position is not None and restored.position > high:
            log.warning(
                "%s [%d]: committed offset %d is beyond the log end %d (committed by hand? "
                "topic recreated? log truncated?): the primary starts there and librdkafka "
                "applies auto.offset.reset",
                *key,
                restored.position,
                high,
            )
        exact = self._settings.metadata_max_bytes if self._settings.transactional else None
        settings = self._settings
        plan = plan_assignment(
            restored,
            low,
            high,
            settings.lag_threshold,
            requested,
            exact_token_bytes=exact,
            from_start=self._planner.uncommitted,
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
            self._reporter.report_deleted(key[0], key[1], start, end)
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

    def _open(self, plans: dict[Key, tuple[Plan, int]]) -> None:
        """Open partitions the primary now reads (assigned, or deferred and just planned
        and sought), each with its plan's ledger; start their catch-ups."""
        added: dict[Key, tuple[int, int]] = {}
        catchups: list[tuple[Key, Ledger, Epoch]] = []
        for key, (plan, _requested) in plans.items():
            if (
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
            epoch = self._p.open(key, plan.ledger, floor, start)
            first = plan.ledger.ranges.first()
            if first is not None and plan.run_start > first:
                catchups.append((key, plan.ledger, epoch))
            if plan.caught_up is not None:
                added[key] = plan.caught_up
        # Stale checkpoints are retired before anything can be committed (we still hold
        # the user's thread), after the child's fetches started when its handle is up
        # (they overlap the round trip), before them when it is new: a new handle looks
        # its group coordinator up through any broker connection, and once its first fetch
        # is out that is the connection whose answer is the backlog's first megabytes,
        # which librdkafka parses (0.17-0.46 s for 4 x 77,000 records on 2 busy cores)
        # before the coordinator's answer behind it. This read waited that long inside
        # the rebalance callback, with the primary's fresh records queued: 4 of 6 restarts
        # on Apache Kafka 4, under either group protocol (docs/benchmarks.md, Apache Kafka
        # 4: classic and consumer protocols).
        retire_first = bool(added) and not self._child.alive
        if retire_first:
            self._retire_stale(added)
        if catchups and self._group is not None:
            # group-wide: the backlog is offered in chunks, read by whoever claims them
            self._group.own((key, ledger) for key, ledger, _ in catchups)
        elif catchups:
            self._child.start_all(catchups)
        if added and not retire_first:
            self._retire_stale(added)
        self._delivery.note_stale_positions(list(plans))
        self._delivery.recheck()

    def read_alone(self, keys: list[Key]) -> None:
        """Group-wide catch-up was given up (its claims topic cannot be used): the child
        reads these owned partitions' backlogs, as with it off, in their current epochs."""
        work = [
            (k, a.ledger, a.epoch)
            for k in keys
            if (a := self._p.assigned.get(k)) is not None and a.ledger.ranges
        ]
        if work:
            self._child.start_all(work)

    def _retire_stale(self, added: dict[Key, tuple[int, int]]) -> None:
        retired = self._child.retire_stale(
            added, self._plan_budget, write=not self._settings.transactional
        )
        if self._settings.transactional:
            self._committer.txn_retire.update({_key(t): t for t in retired})

    # -- deferred partitions ---------------------------------------------------------------
    def _defer(self, tps: list[TopicPartition]) -> None:
        """Hold partitions whose commit logs could not be read, paused, until a later
        poll()/consume() can plan them (``plan_deferred``), then seek them to the plan.

        Resuming one unplanned would leave its start to librdkafka's own committed-offset
        fetch, which gives up for good on NOT_COORDINATOR when it is made while the broker
        is down (measured on Apache Kafka 3.9: the partition, plain confluent-kafka's
        too, delivered nothing for 90 s after the broker was back). And in exactly-once
        mode it would resume at the committed offset, which this library makes the *safe*
        offset (the first pending backlog record): fresh records above it whose output is
        already committed would be processed again. Reading what the logs say is the only
        exact start; under read_committed it waits for any open transaction that holds
        offsets for the group, as plain confluent-kafka's fetch of stable offsets does."""
        for t in tps:
            self._p.deferred[_key(t)] = t.offset
        self._primary.pause([TopicPartition(t.topic, t.partition) for t in tps])
        self._deferred_tries = 0
        self._deferred_at = time.monotonic() + _DEFERRED_FIRST_S
        # an assignment served while leaving is not read on purpose (_read): no warning
        (log.debug if self.leaving else log.warning)(
            "%d partition(s) not planned yet (the commit logs could not be read: a broker "
            "that does not answer, or an open transaction holding offsets for the group): "
            "they stay paused until planned, e.g. %s",
            len(tps),
            [f"{t.topic} [{t.partition}]" for t in tps[:3]],
        )

    def plan_deferred_if_due(self, now: float) -> None:
        if self._p.deferred and now >= self._deferred_at:
            self._plan_deferred()

    def _plan_deferred(self) -> None:
        """Try once more to plan the deferred partitions; open those it can."""
        wait = min(_DEFERRED_FIRST_S * 2**self._deferred_tries, _DEFERRED_MAX_S)
        self._deferred_tries += 1
        deferred = self._p.deferred
        keys = [k for k in deferred if not self._committer.in_open_txn(k)]
        readings: dict[Key, Reading] = {}
        if keys:
            self._plan_budget = Budget(wait)
            readings = self._planner.read(
                [TopicPartition(*k) for k in keys], self._plan_budget, quiet=True
            )
        plans: dict[Key, tuple[Plan, int]] = {}
        for key in keys:
            requested = deferred[key]
            plan = self._plan(key, readings.get(key, Reading(None)), requested)
            if plan is None:
                continue
            target = plan.start if plan.start is not None else self._settings.reset_offset
            try:
                self._primary.seek(tp(key, target))
            except KafkaException as exc:
                log.warning("%s [%d]: planned, but the seek failed (%s): retrying", *key, exc)
                continue
            del deferred[key]
            plans[key] = (plan, requested)
        if plans:
            self._open(plans)
            self._primary.resume(
                [TopicPartition(*k) for k in plans if not self._child.is_paused(k)]
            )
            log.info("%d deferred partition(s) planned", len(plans))
            self._reporter.publish()
        self._deferred_at = time.monotonic() + wait

    # -- losing partitions ---------------------------------------------------------------------
    def retire(self, keys: Iterable[Key]) -> None:
        """The partitions leave the assignment: freeze what the primary handed out (their
        history stays, for late commits), stop the child, and never return their records
        from the call under way."""
        keys = list(keys)
        self._delivery.credit_returned()
        self._delivery.observe(keys, leaving=True)
        epochs = self._p.retire(keys)
        if not epochs:
            return
        for epoch in epochs:
            self._reporter.primary_handed_closed += sum(
                run.next - run.start for run in epoch.primary
            )
        for k in keys:
            self._reporter.token_bytes.pop(k, None)
        if self._group is not None:
            # the child's cursors are the helper's chunks, whoever owns their partition
            self._group.disown(keys)
        else:
            self._child.forget(keys)
        self._delivery.recheck()
        self._reporter.publish()

    def unassign(self) -> None:
        keys = list(self._p.assigned)
        if self._settings.auto_commit and keys:
            self._committer.auto_commit(keys)
        self.retire([*keys, *self._p.deferred])
        self._primary.unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._refuse_as_librdkafka(partitions, assigned=False)
        keys = [_key(t) for t in partitions]
        if self._settings.auto_commit:
            self._committer.auto_commit(keys)
        self.retire(keys)
        self._primary.incremental_unassign(partitions)

    def _in_group(self) -> bool:
        """Whether librdkafka may still hand this member a rebalance (see leave())."""
        return not self._settings.consumer_protocol and bool(self._primary.memberid())

    def _refuse_as_librdkafka(self, partitions: list[TopicPartition], assigned: bool) -> None:
        """librdkafka refuses a whole incremental (un)assign that adds a partition already
        assigned, or removes one that is not, and leaves its assignment unchanged. The
        refusal must come before anything here changes (a partition retired while
        librdkafka keeps it would stop its catch-up and drop its commits), with the same
        error."""
        current = {_key(t) for t in self._primary.assignment()}
        clash = next((t for t in partitions if (_key(t) in current) is assigned), None)
        if clash is None:
            return
        if assigned:
            code, why = KafkaError._CONFLICT, "is already part of the current assignment"
        else:
            code = KafkaError._INVALID_ARG
            why = "can't be unassigned since it is not in the current assignment"
        raise KafkaException(KafkaError(code, f"{clash.topic} [{clash.partition}] {why}"))

    def leave(self) -> Exception | None:
        """Unsubscribe and serve the whole leaving here, before librdkafka's close().

        librdkafka 2.16 drops the reply to a rebalance request that reaches its group
        after the group terminated, and confluent-kafka waits for that reply in the
        rebalance callback holding the GIL: a rebalance event served inside close() can
        hang the whole process, the thread waiting for close() included. Two such events
        were seen: a revoke (under load, a cooperative rebalance under way), and an
        assignment that had arrived but was not served yet (a member that joined and was
        not polled since: close() served it, terminated the group, then served the revoke
        librdkafka had queued behind it). So this polls until the member has left the
        group, not only until it holds nothing: an assignment already queued is served
        here (the unsubscribe waits for it), and so is the revoke that follows. Under the
        classic protocol librdkafka clears the member id once it left; under KIP-848 the
        id stays, and an empty assignment after a first poll is the sign. A member that
        holds nothing, but cannot leave yet, goes on to close() after _LEAVE_QUIET_S with no
        rebalance callback (a hung broker: close() keeps its bound). Records fetched
        meanwhile are dropped: they were never handed out. What the application's own
        rebalance callback raised here is returned, for close() to raise once it closed
        everything (confluent-kafka's close() raises it; raised here, it left the handles
        open); leaving goes on, as confluent-kafka (un)assigns after such a callback too.
        """
        self._delivery.observe(list(self._p.assigned))  # what the application got
        self._delivery.untrusted_position = self.leaving = True
        error: Exception | None = None
        try:
            self._primary.unsubscribe()
            deadline = time.monotonic() + REVOKE_WAIT_S
            served, quiet_from = self._served, time.monotonic()
            while True:
                try:
                    self._primary.poll(_REVOKE_SLICE_S)
                except Exception as exc:
                    if exc is self._user_error:
                        error = error or exc
                    elif isinstance(exc, RuntimeError):  # a closed handle
                        raise
                    else:
                        # the application's error_cb (stats_cb, throttle_cb, ...) raised, as
                        # it may again on every poll while the broker is away: confluent-
                        # kafka's close() closes all the same, and returns
                        log.debug("a callback raised while leaving the group: %r", exc)
                now = time.monotonic()
                if self._served != served:
                    served, quiet_from = self._served, now
                if not self._p.assigned and (
                    not self._in_group() or now - quiet_from >= _LEAVE_QUIET_S
                ):
                    break
                if now >= deadline:
                    log.warning(
                        "close() goes on after %.0f s without this member having left its "
                        "group (a rebalance still under way): librdkafka serves the rest",
                        REVOKE_WAIT_S,
                    )
                    break
        except (KafkaException, RuntimeError) as exc:
            log.warning("leaving the group before close() failed: %s", exc)
        finally:
            self._delivery.untrusted_position = False
        return error
