"""Recovery from the crash, not from the rejoin: remove this group's dead members at start.

A SIGKILLed member never leaves its group; the group waits for its session to expire
(45 s by default, and under the consumer protocol no group may go lower on a default
broker) before its partitions move. This consumer knows better: ``_membership`` proves a
member of this host dead (its lock is free), and ``_eviction`` removes it from the group
with the admin LeaveGroup, timed per protocol:

* consumer protocol (KIP-848): before our first heartbeat (``subscribe()`` waits for the
  removal, at most ``CONSUMER_WAIT_S``): removed after it, the partitions would come at
  our next heartbeat, 5 s later;
* classic: once our JoinGroup is pending (the removal waits for the group to rebalance):
  removed before it, the group would be empty and our join would wait
  ``group.initial.rebalance.delay.ms`` (3 s by default);
* a static member (``group.instance.id``): under the consumer protocol the dead holder of
  our instance id is removed as above; under classic the broker hands its identity to us
  at our JoinGroup by itself, so it is only forgotten. A dead entry of *another* instance
  id is left for that instance's own restart.

Thread ownership: this object belongs to the consumer's thread (the user's); the removal
runs on a helper thread with a kafka-python client of its own (``_eviction.Removal``)
and reports back under ``_lock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._config import ParallelConfig
from ._eviction import Outcome, Removal, admin_settings
from ._membership import DeadEntry, Membership, Registration, describe, find_dead, group_key

__all__ = ["Recovery"]

log = logging.getLogger("fastrebalance.recovery")

#: Consumer protocol: how long ``subscribe()`` waits for the removal before our first
#: heartbeat goes out. Measured at 0.1-0.4 s including kafka-python's import; past this
#: the removal still happens, and the partitions come one heartbeat later.
CONSUMER_WAIT_S = 2.0


class Recovery:
    """This member's state-file entry, and the removal of the dead ones at subscribe."""

    def __init__(
        self,
        directory: Path,
        conf: dict[str, Any],
        consumer_protocol: bool,
    ) -> None:
        self._directory = directory
        self._conf = conf
        self._group_id = str(conf.get("group.id", ""))
        self._bootstrap = str(conf.get("bootstrap.servers") or conf.get("metadata.broker.list"))
        self._instance_id = conf.get("group.instance.id") or None
        self._protocol = "consumer" if consumer_protocol else "classic"
        self._key = group_key(self._bootstrap, self._group_id)
        self._registration: Registration | None = None
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []  # guarded by _lock (the removal thread appends)
        self._removal: Removal | None = None
        self._join_pending: threading.Event | None = None
        self._write_failed = False

    @classmethod
    def make(cls, settings: ParallelConfig, conf: dict[str, Any]) -> Recovery | None:
        """The recovery of a consumer in the mode, or None with the key off."""
        if settings.state_dir is None:
            return None
        return cls(settings.state_dir, conf, settings.consumer_protocol)

    # -- at subscribe() ---------------------------------------------------------------------
    def before_subscribe(self) -> None:
        """Find the dead entries of this group and start removing them; under the
        consumer protocol, wait (bounded) until they are removed. Never raises."""
        try:
            self._start_removal()
        except Exception:  # a removal never fails subscribe(): the old wait
            log.exception("group %s: looking for dead members failed", self._group_id)
            return
        removal = self._removal
        if removal is not None and self._join_pending is None:
            removal.finished.wait(CONSUMER_WAIT_S)

    def after_subscribe(self, member_id: Callable[[], str | None]) -> None:
        """Classic protocol: our JoinGroup is on its way; the removal may look for it.
        Consumer protocol: the member id is the client's own (KIP-1082), known from here
        on, and the broker may assign us partitions before any callback of ours runs:
        recorded now, a kill before the first assignment reaches the application is
        removed by the restart too (recorded only at the assignment, such a member held
        its partitions for the whole 45 s session: adversary of issue 45, 4 of 6 runs)."""
        if self._join_pending is not None:
            self._join_pending.set()
        if self._protocol == "consumer":
            self.note_assignment(member_id)

    def _start_removal(self) -> None:
        if self._removal is not None and not self._removal.finished.is_set():
            return  # a second subscribe() while the first removal runs
        ours = self._dead_entries()
        if not ours:
            return
        members = [describe(e) for e in ours]
        self._join_pending = threading.Event() if self._protocol == "classic" else None

        def done(outcomes: list[Outcome]) -> None:  # on the removal thread
            for entry in ours:
                entry.discard()  # removed, gone, or failed: its session expires anyway
            self._record(outcomes)

        self._removal = Removal(
            admin_settings(self._conf), self._group_id, members, self._join_pending, done
        )
        self._removal.start()

    def _dead_entries(self) -> list[DeadEntry]:
        """The dead entries of this group to remove (each locked by us); the others are
        discarded or released as they need."""
        ours: list[DeadEntry] = []
        for entry in find_dead(self._directory, self._key):
            m = entry.membership
            if m is None or m.group_id != self._group_id:
                entry.discard()  # died before it had a member id: nothing to remove
            elif m.instance_id is not None and m.instance_id != self._instance_id:
                entry.release()  # another static instance's: for its own restart
            elif m.instance_id is not None and self._protocol == "classic":
                # the broker gives us its identity at our JoinGroup (KIP-345); removing
                # it before would empty the group, after would remove us
                self._record([Outcome(describe(entry), "replaced", time.time())])
                entry.discard()
            else:
                ours.append(entry)
        return ours

    # -- after close() -----------------------------------------------------------------------
    def remove_dead_now(self, timeout_s: float) -> bool:
        """This member has left the group, and the group still lists members: remove those
        of this host proven dead (their lock is free), waiting at most ``timeout_s``.
        True if any was removed (or had gone meanwhile): the group may be empty now.

        Why at close(): a member SIGKILLed while it owned a partition stays listed until
        its session expires (45 s by default), and a helper that closes meanwhile cannot
        write the done chunks it read of that partition into the group's offset (Apache
        Kafka refuses a commit from outside a group that has members, ``_orphans``).
        Once the dead member's session expired the group was empty and nobody wrote it:
        the offset stayed behind until a new member started. Never raises."""
        try:
            ours = self._dead_entries()
        except Exception:  # a removal never fails close()
            log.exception("group %s: looking for dead members failed", self._group_id)
            return False
        if not ours:
            return False
        outcomes: list[Outcome] = []

        def done(result: list[Outcome]) -> None:  # on the removal thread
            for entry in ours:
                entry.discard()
            outcomes.extend(result)
            self._record(result)

        removal = Removal(
            admin_settings(self._conf), self._group_id, [describe(e) for e in ours], None, done
        )
        removal.start()
        removal.finished.wait(timeout_s)
        return any(o.result in ("removed", "gone") for o in list(outcomes))

    def _record(self, outcomes: list[Outcome]) -> None:
        with self._lock:
            self._outcomes.extend(outcomes)
        failed = [o for o in outcomes if o.result == "failed"]
        for o in outcomes:
            if o.result == "removed":
                log.info(
                    "group %s: removed dead member %s (pid %s on %s, its lock was free): its "
                    "partitions move now, not after its session timeout",
                    self._group_id, o.member.get("member_id"), o.member.get("pid"),
                    o.member.get("host"),
                )  # fmt: skip
            elif o.result in ("gone", "replaced"):
                log.info(
                    "group %s: dead member %s was no longer in the group (%s)",
                    self._group_id, o.member.get("member_id"), o.error or o.result,
                )  # fmt: skip
        if failed:
            log.warning(
                "group %s: could not remove %d dead member(s) (%s): the group will reassign "
                "their partitions after their session timeout, as without "
                "parallel.rebalance.remove.dead.members",
                self._group_id, len(failed), failed[0].error,
            )  # fmt: skip

    # -- at each assignment -----------------------------------------------------------------
    def note_assignment(self, member_id: Callable[[], str | None]) -> None:
        """Record our membership (rewritten only when it changed). Never raises: a full
        disk costs the next start its shortcut, not this member its assignment."""
        if self._write_failed:
            return
        try:
            mid = member_id()
            if not mid:
                return
            if self._registration is None:
                self._registration = Registration(self._directory, self._key)
            self._registration.record(
                Membership(self._group_id, mid, self._instance_id, self._protocol, self._bootstrap)
            )
        except OSError as exc:
            self._write_failed = True
            log.warning(
                "group %s: could not write the membership state file in %s (%s): if this "
                "process crashes, its restart waits for the group session timeout",
                self._group_id, self._directory, exc,
            )  # fmt: skip

    def wrap(self, on_assign: Callable[..., None], member_id: Callable[[], str | None]) -> Any:
        def recorded(handle: Any, partitions: Any) -> None:
            # first: a crash in the application's own callback must find it on disk
            self.note_assignment(member_id)
            on_assign(handle, partitions)

        return recorded

    # -- at close() -------------------------------------------------------------------------
    def close(self, left: bool) -> None:
        """``left``: the member left the group (its entry goes); otherwise the entry stays
        for the next start to remove (released, so that it reads as dead)."""
        if self._registration is not None:
            self._registration.close(forget=left)
            self._registration = None

    # -- status ----------------------------------------------------------------------------
    def removals(self) -> list[dict[str, Any]]:
        """Every dead member handled so far: who, what became of it, and when."""
        with self._lock:
            return [o.as_dict() for o in self._outcomes]

    def counts(self) -> dict[str, int]:
        """Dead members handled so far, by result."""
        with self._lock:
            results = [o.result for o in self._outcomes]
        return {r: results.count(r) for r in ("removed", "gone", "replaced", "failed")}
