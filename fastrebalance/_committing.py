"""The commit path: a commit call becomes claims, claims change the ledgers, the ledgers
become the two writes. Plain commits, the emulated auto-commit, store_offsets() and
exactly-once transactions all go through here, and only here.

    commit(message=m)  ->  claims (_routing: what m's stream handed out before it; and
                           what the other streams handed out before m, worked out once,
                           then split between the group's chunks and the core: _named)
                       ->  the ledger after them (_commits.apply_change)
                       ->  the writes: the group's safe offset and token, the child's
                           checkpoint (_commits.group_write / checkpoint_for)
                       ->  OffsetCommit (or the producer's transaction)

A commit's data moves down once and the result comes back once; nothing here decides where
a stream starts (``_assigning``) or what a record is (``_delivery``).

Thread ownership: the user's thread's, like the handles; a synchronous group commit lends
the primary to a helper thread while the owner waits (``_child.call_bounded``), and the
auto-commit timer's thread only marks the commit due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as _RdConsumer

from ._child import Child, call_bounded
from ._commits import Change, apply_change, group_write
from ._config import ParallelConfig
from ._delivery import Delivery
from ._groupcatchup import GroupCatchup
from ._ledger import Ledger
from ._partitions import Key, Partitions
from ._planner import Planner
from ._reporting import Reporter
from ._retry import Budget, call_with_retries
from ._routing import UNKNOWN_START, Claim
from ._token import ChildCheckpoint, TokenTooLargeError, encode_child_checkpoint
from ._transactions import OpenTransaction

__all__ = ["Committer", "plain_abort", "plain_send_offsets", "record_of", "tp"]

log = logging.getLogger("fastrebalance.consumer")
#: A group write that failed (librdkafka's on_commit) is made again after this long.
_REWRITE_AFTER_S = 0.5


def tp(key: Key, offset: int, metadata: str | None = None) -> TopicPartition:
    if metadata is not None:  # "" too: confluent-kafka writes (and reads back) ""
        return TopicPartition(key[0], key[1], offset, metadata=metadata)
    return TopicPartition(key[0], key[1], offset)


def record_of(message: Message, verb: str = "commit") -> tuple[Key, int]:
    """The partition and offset of a record the application commits or stores."""
    found = claimable(message, verb)
    if found is None:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"not a record: cannot {verb}"))
    return found


def claimable(message: Message, verb: str = "commit") -> tuple[Key, int] | None:
    """What ``commit(message=)``/``store_offsets(message=)`` claim, read as confluent-kafka
    reads a message: None for one built by hand without a partition or an offset (there,
    an offset that librdkafka does not commit: nothing is claimed and the call returns).

    Raises:
        KafkaException: ``_INVALID_ARG`` for an error event, with confluent-kafka's text;
            for a message without a topic (confluent-kafka's ``SystemError``).
    """
    err = message.error()
    if err is not None:
        raise KafkaException(
            KafkaError(
                KafkaError._INVALID_ARG,
                f"Cannot {verb} offsets for message with error: '{err.str()}'",
            )
        )
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"not a record: cannot {verb}"))
    if partition is None or offset is None:
        return None
    return (topic, partition), offset


def _no_offset() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._NO_OFFSET, "No offset stored"))


def _merged(
    a: dict[Key, list[Claim]], b: dict[Key, list[Claim]]
) -> dict[Key, list[Claim]]:
    if not b:
        return a
    out = {k: list(v) for k, v in a.items()}
    for k, v in b.items():
        out.setdefault(k, []).extend(v)
    return out


@dataclass(frozen=True)
class _Named:
    """What ``commit(message=|offsets=)`` or ``store_offsets()`` names, each part on its
    own side: the group's chunks (claimed in the helper's path) or the core (the two
    logs). design.md's "What a commit claims": a commit of m claims every record of m's
    partition any stream handed out before m, so a record on one side can claim records
    on the other; those are worked out once, before the split, and each side takes its
    own."""

    #: the helper's path: the chunk records named, each with what the child handed out
    #: of its chunks before it, and the chunk records handed out before a record named
    chunks: dict[Key, list[Claim]]
    #: the core: the records of its streams handed out before a record named
    earlier: dict[Key, list[Claim]]
    #: the core: the record named, unless it is a chunk record
    message: Message | None
    #: the core: the offsets named, but those just after a chunk record
    offsets: list[TopicPartition] | None

    @property
    def core_named(self) -> bool:
        """Whether the core has a record or offsets of its own (else every record named
        was a chunk record's, and the core claims ``earlier`` alone)."""
        return self.message is not None or self.offsets is not None


def _before(claims: list[Claim], after: list[int]) -> list[Claim]:
    """The claims, each cut at the first of ``after`` (records handed out later) at or
    above its start: a stream hands out a run's records in offset order, so what a claim
    holds below that offset came before it."""
    if not after:
        return claims
    out = []
    for c in claims:
        end = min((o for o in after if c.start <= o < c.end), default=c.end)
        if end > c.start:
            out.append(Claim(c.start, end, c.child, c.exact))
    return out


def _clip(claims: list[Claim], limit: int) -> list[Claim]:
    """The claims, cut at ``limit``: nothing at or beyond it is claimed."""
    return [
        Claim(c.start, min(c.end, limit), c.child, c.exact) for c in claims if c.start < limit
    ]


class Committer:
    """Claims, the ledgers' changes and both logs' writes, for every kind of commit."""

    def __init__(
        self,
        primary: _RdConsumer,
        child: Child,
        planner: Planner,
        partitions: Partitions,
        delivery: Delivery,
        reporter: Reporter,
        settings: ParallelConfig,
        commit_timeout_s: float,
        group: GroupCatchup | None = None,
    ) -> None:
        self._group = group
        self._primary = primary
        self._child = child
        self._planner = planner
        self._p = partitions
        self._delivery = delivery
        self._reporter = reporter
        self._settings = settings
        self._commit_timeout_s = commit_timeout_s
        self._warned_offsets = False
        #: the partitions of the on_lost callback being served: the group no longer counts
        #: this member as their owner, and under the consumer protocol (KIP-848) the broker
        #: still accepts an explicit OffsetCommit from it, so only we can refuse the write
        self.lost: frozenset[Key] = frozenset()
        self._timer: threading.Timer | None = None
        self._stopped = False
        # Exactly-once: each open transaction's claims, by its producer (applied once it
        # commits), and the stale catch-up checkpoints the next transaction must clear...
        self._txns: dict[int, OpenTransaction] = {}
        #: partitions whose last group write failed, written again from _rewrite_at on
        self._rewrite: set[Key] = set()
        self._rewrite_at = 0.0
        self.txn_retire: dict[Key, TopicPartition] = {}
        # ... and which producer's transaction last claimed each partition (a producer per
        # partition: an abort that claimed nothing rewinds only what may be its own)
        self._claimed_by: dict[Key, int] = {}
        self._arm_auto_commit()

    @property
    def timeout_s(self) -> float:
        """A synchronous commit's bound (``socket.timeout.ms``)."""
        return self._commit_timeout_s

    # -- what a call claims -----------------------------------------------------------------
    def changes(
        self, messages: Sequence[Message] | None, offsets: list[TopicPartition] | None
    ) -> dict[Key, Change]:
        """What a commit of ``messages`` or ``offsets`` (or, with neither, of everything
        handed out) claims, per partition."""
        changes: dict[Key, Change] = {}
        if messages is not None:
            for message in messages:
                found = claimable(message)
                if found is None:
                    continue
                key, offset = found
                changes.setdefault(key, Change()).claims.append(self._record_claim(key, offset))
        elif offsets is not None:
            changes = self._offset_changes(offsets)
        else:
            changes = self._handed_changes(list(self._p.assigned))
        if not changes:  # as librdkafka: nothing consumed, nothing to commit
            raise _no_offset()
        return changes

    def _record_claim(self, key: Key, offset: int) -> Claim:
        history = self._p.history.get(key)
        if history is None:
            return Claim(offset, offset + 1, exact=False)
        self._delivery.observe([key])
        return history.record_claim(offset)

    def _offset_changes(self, offsets: list[TopicPartition]) -> dict[Key, Change]:
        """commit(offsets=)/store_offsets(offsets=): an offset just after a record a child
        handed out claims as that record's commit would; any other is a position of the
        primary's stream (see _routing.Epoch.position_claim), and a rewind below it."""
        changes: dict[Key, Change] = {}
        for t in offsets:
            if t.offset < 0:
                continue  # as librdkafka: a logical offset is not committed
            key = (t.topic, t.partition)
            history = self._p.history.get(key)
            change = changes.setdefault(key, Change())
            change.metadata = t.metadata
            if history is not None:
                self._delivery.observe([key])
                claim = history.child_offset_claim(t.offset)
                if claim is not None:  # after a backlog record: as commit(message=) of it
                    change.claims.append(claim)
                    continue
            change.rewind = t.offset
            if history is None:
                change.position = t.offset
                continue
            claim = history.position_claim(t.offset)
            if claim is not None:
                change.claims.append(claim)
            a = self._p.assigned.get(key)
            if not self._warned_offsets and a is not None and t.offset in a.ledger.ranges:
                self._warned_offsets = True
                log.warning(
                    "%s [%d]: offset %d (commit or store_offsets), inside a pending backlog "
                    "range and after no record the child handed out, is a position of the "
                    "primary's stream (a rewind): it cannot say which backlog records were "
                    "processed. Commit backlog records by message, by the offset after one, "
                    "or with commit() (logged once)",
                    *key,
                    t.offset,
                )
        return changes

    def _handed_changes(self, keys: list[Key]) -> dict[Key, Change]:
        """A bare commit: everything each stream handed out (or, with
        enable.auto.offset.store=false, what store_offsets() claimed)."""
        changes: dict[Key, Change] = {}
        auto_store = self._settings.auto_offset_store
        limits = self._delivery.transit_limits()
        if auto_store:
            self._delivery.observe(keys)
        for key in keys:
            a = self._p.assigned.get(key)
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

    # -- plain commits -------------------------------------------------------------------------
    def refuse_outside_transactions(self, what: str) -> None:
        if self._settings.transactional:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"{what}: parallel.rebalance.transactional=true writes offsets only "
                    "inside the producer's transaction: use send_offsets_to_transaction()",
                )
            )

    def commit(
        self,
        message: Message | None,
        offsets: list[TopicPartition] | None,
        asynchronous: bool,
    ) -> list[TopicPartition] | None:
        if message is not None and offsets is not None:
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, "commit() takes message or offsets, not both")
            )
        self.refuse_outside_transactions("commit()")
        self._refuse_lost(message, offsets)
        if message is None and offsets is None:
            return self._commit_handed(asynchronous)
        named = self._named(message, offsets)
        if named.chunks:
            self._commit_chunks(named.chunks, asynchronous)
        changes: dict[Key, Change] = {}
        if not named.core_named:
            if not named.earlier:  # chunk records alone: the helper's path took them all
                self._reporter.publish()
                return None if asynchronous else []
        else:
            try:
                changes = self.changes(
                    [named.message] if named.message is not None else None, named.offsets
                )
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    raise
                if not named.earlier:  # the core has nothing to write
                    if named.chunks:  # the offsets after chunk records were all it had
                        return None if asynchronous else []
                    if asynchronous:
                        # confluent-kafka's asynchronous commit of offsets librdkafka does
                        # not commit (logical ones, an empty list, a message built without
                        # an offset) returns; only a bare one raises (docs/api.md)
                        return None
                    raise
        for key, claims in named.earlier.items():
            changes.setdefault(key, Change()).claims.extend(claims)
        try:
            return self._write(changes, asynchronous)
        finally:
            self._reporter.publish()

    def _commit_handed(self, asynchronous: bool) -> list[TopicPartition] | None:
        """A bare ``commit()``: everything each stream handed out (or, with
        enable.auto.offset.store=false, what store_offsets() stored); the chunk records in
        the helper's path, the rest in the core."""
        helped = self._commit_handed_chunks(asynchronous)
        changes = self._handed_changes(list(self._p.assigned))
        if not changes:
            if helped:  # only chunk records were handed out
                return None if asynchronous else []
            raise _no_offset()  # as librdkafka: nothing consumed, nothing to commit
        try:
            return self._write(changes, asynchronous)
        finally:
            self._reporter.publish()

    # -- what a named record claims across streams ---------------------------------------------
    def _named(self, message: Message | None, offsets: list[TopicPartition] | None) -> _Named:
        """What ``commit()``/``store_offsets()`` of ``message`` or ``offsets`` claims, split
        between the group's chunks and the core. The claims across streams are taken
        first, for every record named, whichever side it falls on: a chunk record's commit
        covers the core's records handed out before it, and a core record's the chunks'."""
        earlier, earlier_chunks = self._handed_before(message, offsets)
        group = self._group
        if group is None:
            return _Named({}, earlier, message, offsets)
        if message is not None:
            own, _ = group.split([message])
            return _Named(_merged(own, earlier_chunks), earlier, None if own else message, None)
        assert offsets is not None  # a named commit: one of the two
        own, rest = self._chunk_offsets(offsets)
        core_offsets = None if own and not rest else rest
        return _Named(_merged(own, earlier_chunks), earlier, None, core_offsets)

    def _handed_before(
        self, message: Message | None, offsets: list[TopicPartition] | None
    ) -> tuple[dict[Key, list[Claim]], dict[Key, list[Claim]]]:
        """What ``commit(message=m)`` or ``commit(offsets=[m.offset() + 1])`` claims besides
        m's own stream: the records of m's partition the other streams handed out before m
        (confluent-kafka's "m and everything delivered before it on its partition", with
        delivery order across streams). The core's claims, the chunks' claims."""
        core: dict[Key, list[Claim]] = {}
        chunks: dict[Key, list[Claim]] = {}
        for key, offset, record in self._records_named(message, offsets):
            mine, theirs = self._earlier(key, offset, record)
            if mine:
                core.setdefault(key, []).extend(mine)
            if theirs:
                chunks.setdefault(key, []).extend(theirs)
        return core, chunks

    def _records_named(
        self, message: Message | None, offsets: list[TopicPartition] | None
    ) -> list[tuple[Key, int, Message | None]]:
        """The records a commit names: ``message`` (with the very object, which places it
        among the recent calls), or the record before each offset that follows one."""
        if message is not None:
            try:
                found = claimable(message)
            except KafkaException:
                return []  # the call raises its own error for it
            return [] if found is None else [(found[0], found[1], message)]
        return [
            ((t.topic, t.partition), t.offset - 1, None)
            for t in offsets or []
            if t.offset > 0 and self._after_a_record((t.topic, t.partition), t.offset)
        ]

    # -- delivery order across streams ---------------------------------------------------------
    def _after_a_record(self, key: Key, offset: int) -> bool:
        """Whether ``commit(offsets=[offset])`` is the offset after a record, as
        ``commit(message=)`` of it: a chunk record's, a backlog record's that is no
        position the primary was at too (the backlog's end F is also where the primary
        starts: an application committing ``position()`` says F with no record meant), or
        a record the primary handed out and no child."""
        if self._group is not None and self._group.holds(key, offset - 1):
            return True
        history = self._p.history.get(key)
        if history is None:
            return False
        self._delivery.observe([key])
        if history.child_offset_claim(offset) is not None:
            return True
        return history.primary_only(offset - 1)

    def _earlier(
        self, key: Key, offset: int, message: Message | None = None
    ) -> tuple[list[Claim], list[Claim]]:
        """The records of ``key`` every stream handed out before the record at ``offset``,
        when its place in delivery order is known: a recent call off the hot path returned
        it (what was returned after it is left out, and the primary's records if hot calls
        ran since), or from the primary's run after the last move onto the hot
        path (the child's records handed out before that move). Otherwise nothing: an
        older record (the seek-back recipe) claims its own stream alone, as before."""
        d = self._delivery
        a = self._p.assigned.get(key)
        if a is not None:
            d.observe([key])  # the primary's live run, before anything reads its runs
        placed = d.place(key, offset, message)
        if placed is not None and not placed[2] and self._deliveries(key, offset) != 1:
            placed = None  # delivered twice: which delivery the offset means is not known
        if placed is None:
            return self._after_cut(key, offset), []
        after, primary_too, _ = placed
        limit = d.transit_limits().get(key)
        if limit is not None:
            after.append(limit)
        core: list[Claim] = []
        if a is not None:
            core = [c for c in a.epoch.handed_claims() if c.child or primary_too]
        chunks = self._group.handed_of(key) if self._group is not None else []
        return _before(core, after), _before(chunks, after)

    def _deliveries(self, key: Key, offset: int) -> int:
        """How many remembered runs (the core's and the helper's) may have handed out
        ``offset`` of ``key``; 2 if a forgotten one may have."""
        n = 0
        histories = [self._p.history.get(key)]
        if self._group is not None:
            histories.append(self._group.history_of(key))
        for history in histories:
            if history is None:
                continue
            if offset in history.forgotten:
                return 2
            for epoch in history.epochs:
                n += sum(r.holds(offset) for r in (*epoch.primary, *epoch.child))
        return n

    def _after_cut(self, key: Key, offset: int) -> list[Claim]:
        """A record the primary handed out after the last move onto the hot path, and
        no other stream may have: the child's records handed out before that move."""
        cut = self._delivery.cuts.get(key)
        history = self._p.history.get(key)
        if cut is None or history is None or offset < cut.next or not cut.run.holds(offset):
            return []
        if offset in history.forgotten:
            return []
        for epoch in history.epochs:
            for run in (*epoch.primary, *epoch.child):
                if run is not cut.run and run.holds(offset):
                    return []  # handed out by another run too: its place is not known
        return list(cut.child)

    def _refuse_lost(
        self, message: Message | None, offsets: list[TopicPartition] | None
    ) -> None:
        """Inside on_lost, as confluent-kafka: a bare commit() raises _ASSIGNMENT_LOST, and
        so does one that names a lost partition (the classic protocol's broker refuses it as
        a fenced member's; the consumer protocol's took it, overwriting the offset and token
        the partition's new owner wrote)."""
        if not self.lost:
            return
        if message is not None:
            found = claimable(message)
            named = set() if found is None else {found[0]}
        elif offsets is not None:
            named = {(t.topic, t.partition) for t in offsets}
        else:
            named = set(self.lost)
        if named & self.lost:
            raise KafkaException(
                KafkaError(
                    KafkaError._ASSIGNMENT_LOST,
                    "commit() inside on_lost: these partitions are no longer this member's "
                    "and their offsets are not written (the group has a new owner)",
                )
            )

    # -- group-wide catch-up: chunk records are committed in the helper's own path ------------
    def _commit_chunks(self, claims: dict[Key, list[Claim]], asynchronous: bool) -> None:
        """Commit what the application processed of chunks this member read for the group,
        never into the group's log: their partitions are another member's, or this one's
        own offsets move only by the claims log's done."""
        assert self._group is not None  # only group-wide catch-up hands out chunk records
        self._group.commit(claims, not asynchronous, self._commit_timeout_s)

    def _commit_handed_chunks(self, asynchronous: bool) -> bool:
        """A bare commit's part for chunk records: every one handed out (or stored).
        Whether there was any."""
        if self._group is None:
            return False
        handed = self._group.handed(self._delivery.transit_limits())
        if handed:
            self._commit_chunks(handed, asynchronous)
        return bool(handed)

    def _chunk_offsets(
        self, offsets: list[TopicPartition]
    ) -> tuple[dict[Key, list[Claim]], list[TopicPartition]]:
        """The claims of ``offsets`` that follow a record this member's child read for the
        group (a chunk, of a partition it owns or not), and the other offsets. Each
        claims what ``commit(message=)`` of that record would (the record and what its
        stream handed out before it), in the helper's own path, as an offset after a
        backlog record does in the core. Written as a plain position into the group, one
        claimed the owner's whole backlog below it (adversary of issue 22: the group stored
        1600 while offset 0 was unprocessed); ignored, the textbook
        ``commit(offsets=[m.offset() + 1])`` left every chunk undone (issue 45)."""
        group = self._group
        assert group is not None
        records, rest = [], []
        for t in offsets:
            key = (t.topic, t.partition)
            if t.offset > 0 and group.holds(key, t.offset - 1):
                records.append(Message(topic=t.topic, partition=t.partition, offset=t.offset - 1))
            else:
                rest.append(t)
        return (group.split(records)[0] if records else {}), rest

    def commit_helped(self) -> None:
        """The emulated auto-commit's part for chunk records (and close()'s)."""
        self._commit_handed_chunks(asynchronous=True)

    def commit_failed(self, failed: list[TopicPartition]) -> None:
        """A group commit failed (librdkafka's on_commit, served on the user's thread): the
        offset it carried is not stored, so the next write of those partitions must not be
        skipped as unchanged. With group-wide catch-up the partitions are also written
        again on the next call (``rewrite_failed``): a write after done chunks is the
        library's own, and nothing else may come to repeat it. Before, one failed during a
        rebalance (the second member joining) left the group's offset at 0 of 20,000 after
        the whole backlog was done, and every later commit skipped it as written."""
        for t in failed:
            key = (t.topic, t.partition)
            a = self._p.assigned.get(key)
            if a is not None and a.written is not None and a.written[0] == t.offset:
                a.written = None
                if self._group is not None:
                    if not self._rewrite:
                        self._rewrite_at = time.monotonic() + _REWRITE_AFTER_S
                    self._rewrite.add(key)

    def rewrite_failed(self, now: float) -> None:
        """Write again, asynchronously, the partitions whose last group write failed, at
        most every _REWRITE_AFTER_S (a rebalance under way refuses commits until done)."""
        if not self._rewrite or now < self._rewrite_at:
            return
        keys, self._rewrite = [k for k in self._rewrite if k in self._p.assigned], set()
        if keys:
            self.write_absorbed(keys)

    def write_absorbed(self, keys: list[Key]) -> None:
        """Chunks of these partitions are done (the claims log says so) and left their
        ledgers: write the group's offset and token now, asynchronously, as the auto-commit
        would (nothing is claimed here; the ledger already holds the change)."""
        changes = {k: Change() for k in keys if k in self._p.assigned}
        if not changes:
            return
        try:
            self._write(changes, asynchronous=True, only_changed=True, read=False)
        except (KafkaException, RuntimeError) as exc:
            log.warning("group commit after done chunks failed (offsets stay safe): %s", exc)
        self._reporter.publish()

    def store_offsets(
        self, message: Message | None, offsets: list[TopicPartition] | None
    ) -> None:
        self.refuse_outside_transactions("store_offsets()")
        named = self._named(message, offsets)
        if named.chunks:
            assert self._group is not None  # only group-wide catch-up hands out chunk records
            self._group.stage(named.chunks)  # for the helper's path, at the next commit
        changes: dict[Key, Change] = {}
        if named.message is not None:
            self._primary.store_offsets(message=named.message)
            found = claimable(named.message, "store")
            if found is not None:  # else, as librdkafka: nothing stored
                key, offset = found
                changes = {key: Change([self._record_claim(key, offset)])}
        elif named.offsets is not None:
            self._primary.store_offsets(offsets=named.offsets)
            changes = self._offset_changes(named.offsets)
        for key, claims in named.earlier.items():
            changes.setdefault(key, Change()).claims.extend(claims)
        for key, change in changes.items():
            a = self._p.assigned.get(key)
            if a is None:
                continue  # librdkafka stores only for assigned partitions
            cp = apply_change(a.ledger, change)
            if cp is not None:
                a.checkpoint = cp
            a.stored = True
            a.stored_as = (change.rewind, change.metadata)

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None
    ) -> list[TopicPartition]:
        # confluent-kafka's committed() without a timeout waits forever on a hung broker;
        # ours gives up after socket.timeout.ms
        seconds = timeout if timeout is not None and timeout >= 0 else self._commit_timeout_s
        keys = [(t.topic, t.partition) for t in partitions]
        errors: dict[Key, TopicPartition] = {}
        restored = self._planner.read_logs(keys, Budget(seconds), errors)
        out = []
        for key in keys:
            if key in errors:  # confluent-kafka's own answer, its error included
                out.append(errors[key])
                continue
            r = restored.get(key)
            safe = r.safe_offset if r is not None else None
            metadata = r.user_metadata if r is not None else None
            out.append(tp(key, -1001 if safe is None else safe, metadata))
        return out

    # -- the emulated auto-commit -------------------------------------------------------------
    def auto_commit(self, keys: list[Key], group: bool = True) -> None:
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
        self._reporter.publish()

    def tick_auto_commit(self) -> None:
        self._delivery.due = False
        self._arm_auto_commit()
        # Positions read before this poll fetches anything: the records they cover
        # were returned by earlier calls, so the application is done with them.
        self.auto_commit(list(self._p.assigned))
        self.commit_helped()

    def _arm_auto_commit(self) -> None:
        """The emulated auto-commit's schedule: a timer marks it due, so that the hot
        path reads no clock; the next poll()/consume() then takes the slow path."""
        if not self._settings.auto_commit or self._stopped:
            return
        if self._settings.auto_commit_interval_s <= 0:
            # librdkafka: "0 = disable" the periodic commit; those on revoke, unassign()
            # and close() remain
            return
        timer = threading.Timer(self._settings.auto_commit_interval_s, self._delivery.mark_due)
        timer.daemon = True
        timer.name = "fastrebalance-auto-commit"
        self._timer = timer
        timer.start()

    def stop(self) -> None:
        """No more periodic commits (close())."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()

    # -- the writes ----------------------------------------------------------------------------
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

        A partition not assigned here (revoked, lost, never ours, or not planned yet) is
        written only after reading what the group stores (``read``); automatic commits
        skip it instead (never a round trip inside a rebalance callback or a poll())."""
        budget = Budget(self._commit_timeout_s)
        assigned = self._p.assigned
        ledgers: dict[Key, Ledger] = {k: assigned[k].ledger for k in changes if k in assigned}
        unknown = [k for k in changes if k not in assigned]
        fresh: set[Key] = set()
        if unknown and read:
            # Not ours: what the group stores is read first, so the write keeps every
            # pending range it holds (and a log never committed stays unprocessed).
            restored_logs, fresh = self._planner.read_to_write(unknown, budget)
            for key, restored in restored_logs.items():
                ledgers[key] = restored.ledger()
        checkpoints: dict[Key, ChildCheckpoint] = {}
        writes = []
        max_bytes = self._settings.metadata_max_bytes
        for key, change in changes.items():
            ledger = ledgers.get(key)
            if ledger is None:
                continue
            start = ledger.position
            cp = apply_change(ledger, change)
            if key in fresh and ledger.position == start and change.rewind is None:
                # never committed and nothing claimed (a record of unknown provenance): as
                # with nothing read, nothing is written
                continue
            a = assigned.get(key)
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
                self._reporter.coalescings += 1
            if a is not None:
                self._reporter.note_token(key, gw.metadata)
            if only_changed and a is not None and a.written == (gw.offset, gw.metadata):
                continue
            writes.append((key, gw.offset, gw.metadata))
        if checkpoints:
            self._child.commit(checkpoints)
        if not group:
            return None
        if not writes:
            return None if asynchronous else []
        offsets = [tp(k, offset, metadata) for k, offset, metadata in writes]
        try:
            result = self._commit_group(offsets, asynchronous, budget)
        except KafkaException:
            self._reporter.group_commit_failures += 1
            raise
        for key, offset, metadata in writes:
            a = assigned.get(key)
            if a is not None:
                a.written = (offset, metadata)
                a.stored, a.stored_as = False, (None, "")
        return result

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
        return call_bounded(commit, budget.request_timeout(self._commit_timeout_s), "commit")

    # -- exactly-once ---------------------------------------------------------------------------
    def in_open_txn(self, key: Key) -> bool:
        return any(key in txn.claims for txn in self._txns.values())

    def send_offsets_to_transaction(
        self,
        producer: Any,
        messages: Sequence[Message] | None,
        offsets: list[TopicPartition] | None,
        timeout: float | None,
    ) -> None:
        if not self._settings.transactional:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    "send_offsets_to_transaction() needs parallel.rebalance.transactional="
                    "true (and enable.auto.commit=false): offsets must travel only in "
                    "transactions",
                )
            )
        # One deadline for the whole call (claims, then up to two producer round trips):
        # each producer call given the caller's full timeout made the call take twice it
        # on a broker hung during both (16 s for timeout=10, against 8 s for confluent-kafka's own
        # call; pinned by test_bounds).
        # A negative timeout is librdkafka's "infinite", kept as such.
        seconds = timeout if timeout is not None else self._commit_timeout_s
        budget = Budget(seconds) if seconds >= 0 else None

        def left_for(what: str) -> float:
            return seconds if budget is None else budget.request_timeout(seconds, what)

        txn = self._txns.get(id(producer))
        if txn is None:
            txn = OpenTransaction(producer)
        changes = self.changes(messages, offsets)
        group_offsets: list[TopicPartition] = []
        child_offsets: dict[Key, TopicPartition] = {}
        staged: list[tuple[Key, Ledger, Change]] = []
        for key, change in changes.items():
            a = self._p.assigned.get(key)
            if a is None:
                why = (
                    "is not planned yet (its commit logs could not be read: an open "
                    "transaction holds offsets for the group), so nothing of it was handed out"
                    if key in self._p.deferred
                    else "is not assigned to this member: its records belong to its new "
                    "owner (commit the transaction in on_revoke)"
                )
                raise KafkaException(KafkaError(KafkaError._STATE, f"{key[0]} [{key[1]}] {why}"))
            if any(t is not txn and key in t.claims for t in self._txns.values()):
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"{key[0]} [{key[1]}] has offsets in another open transaction (another "
                        "producer's): two transactions claiming records of one partition "
                        "cannot both be exact. Commit or abort that one first "
                        "(abort_transaction() also forgets a producer that failed fatally)",
                    )
                )
            view = txn.view(key, a.ledger)
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
                group_offsets.append(tp(key, gw.offset, gw.metadata))
            if cp is not None:
                child_offsets[key] = TopicPartition(
                    key[0], key[1], cp.offset, metadata=encode_child_checkpoint(cp)
                )
            staged.append((key, a.ledger, change))
        retire = {k: t for k, t in self.txn_retire.items() if k not in child_offsets}
        child_offsets.update(retire)
        # The user's group first: a zombie's commit fails there (its generation is
        # stale), and the application aborts before anything else is sent.
        if group_offsets:
            producer.send_offsets_to_transaction(
                group_offsets,
                self._primary.consumer_group_metadata(),
                left_for("the user's group's offsets"),
            )
        if child_offsets:
            producer.send_offsets_to_transaction(
                list(child_offsets.values()),
                self._child.group_metadata(),
                left_for("the catch-up group's offsets"),
            )
        for key, ledger, change in staged:
            txn.stage(key, ledger, change)
            self._claimed_by[key] = id(producer)
        txn.retired.update(child_offsets)
        self._txns[id(producer)] = txn

    def commit_transaction(self, producer: Any, timeout: float | None) -> None:
        if timeout is None:
            producer.commit_transaction()
        else:
            producer.commit_transaction(timeout)
        txn = self._txns.pop(id(producer), None)
        if txn is None:
            return
        txn.settle()
        for key in txn.retired:
            self.txn_retire.pop(key, None)
        self._reporter.publish()

    def abort_transaction(
        self, producer: Any, timeout: float | None, messages: Sequence[Message] | None
    ) -> None:
        txn = self._txns.pop(id(producer), None)
        try:
            if timeout is None:
                producer.abort_transaction()
            else:
                producer.abort_transaction(timeout)
        finally:
            if messages is not None:
                keys = list(dict.fromkeys(record_of(m)[0] for m in messages))
            elif txn is not None and txn.claims:
                keys = list(txn.claims)
            else:
                mine = id(producer)
                keys = [
                    k
                    for k in self._p.assigned
                    if not self.in_open_txn(k) and self._claimed_by.get(k, mine) == mine
                ]
            self._rewind_to_ledgers(keys)

    def _rewind_to_ledgers(self, keys: list[Key]) -> None:
        """Deliver again what the ledgers do not count processed (an aborted or lost
        transaction): the primary from its ledger's position, the child from the first
        pending piece. With nothing committed, the primary goes back to its first record
        of this assignment: nothing before it was handed out."""
        assigned = self._p.assigned
        keys = [k for k in keys if k in assigned]
        self._delivery.observe(keys)
        for key in keys:
            a = assigned[key]
            if a.ledger.position is not None:
                target = a.ledger.position
            else:
                target = a.epoch.primary[0].start
                if target == UNKNOWN_START:
                    continue  # no record yet: nothing to deliver again
            try:
                self._delivery.seek(tp(key, target))
            except KafkaException as exc:
                # revoked meanwhile (the rebalance is served by the next poll): the next
                # owner starts from the committed logs anyway
                log.info("%s [%d]: not sought back after the abort: %s", *key, exc)
                continue
            if a.ledger.ranges:
                self._child.start(key, a.ledger, a.epoch)
        self._delivery.recheck()


# -- the mode off: confluent-kafka's own exactly-once loop -----------------------------------
def plain_send_offsets(
    primary: _RdConsumer,
    producer: Any,
    messages: Sequence[Message] | None,
    offsets: list[TopicPartition] | None,
    timeout: float | None,
) -> None:
    """Positions of the consumer, as confluent-kafka's loop sends them."""
    if messages is not None:
        ends: dict[Key, int] = {}
        for m in messages:
            key, offset = record_of(m)
            ends[key] = max(ends.get(key, 0), offset + 1)
        offsets = [tp(k, o) for k, o in ends.items()]
    elif offsets is None:
        offsets = primary.position(primary.assignment())
    producer.send_offsets_to_transaction(
        offsets, primary.consumer_group_metadata(), timeout if timeout is not None else 30.0
    )


def plain_abort(primary: _RdConsumer, producer: Any, timeout: float | None) -> None:
    """As Apache Kafka's exactly-once example, back to the committed offsets, and to the
    beginning where the group never committed (where this consumer began is not recorded
    with the mode off)."""
    if timeout is None:
        producer.abort_transaction()
    else:
        producer.abort_transaction(timeout)
    for t in primary.committed(primary.assignment(), timeout=30.0):
        if t.offset < 0:
            t.offset = OFFSET_BEGINNING
        primary.seek(t)
