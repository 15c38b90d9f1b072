"""The child consumer: reads the skipped backlog ranges, then stands by.

It is an ordinary confluent-kafka consumer built from the user's config (security,
SASL, SSL, callbacks) minus group membership: it reads by ``assign()`` and commits
into its own group id, so it never joins or disturbs the user's group.

Thread ownership: the child's librdkafka handle, like the primary's, is owned by the
thread that calls the facade's poll()/consume()/commit() (the user's thread). The one
exception is ``close()``, run on a helper thread while the owner waits (see
``call_bounded``). librdkafka's own threads fetch for both handles concurrently; that is
where the parallel catch-up comes from, with no Python thread and no cross-thread queue.

What the child reads is the ledger's backlog (``Ledger.ranges``) of each partition; what
it hands out is recorded as runs of the partition's current ``Epoch`` (see ``_routing``),
which is how a later commit of one of its records is attributed to it. A piece of a
range is finished when a record at or past its end arrives, or when librdkafka reports
the end of the partition at or past it: range ends are raw log ends, and the last offsets
of a range may hold no record the application can see (transaction markers, aborted
records under ``read_committed``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from confluent_kafka import Consumer as _RdConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

# confluent-kafka serializes the calls made on a handle (a reentrancy gate, since 2.14)
from confluent_kafka.cimpl import _reentry_identity_var as _GATE_IDENTITY

from ._ledger import Ledger
from ._planning import checkpoint_is_stale
from ._retry import Budget, call_with_retries
from ._routing import Epoch, Run
from ._token import (
    NO_CHECKPOINT,
    ChildCheckpoint,
    TokenError,
    decode_child_checkpoint,
    encode_child_checkpoint,
    is_child_metadata,
)

__all__ = ["Child", "ChildState", "call_bounded"]

log = logging.getLogger("fastrebalance.child")

Key = tuple[str, int]
#: (topic, partition, first lost offset, end of lost offsets) -> None
DeletedCallback = Callable[[str, int, int, int], None]
T = TypeVar("T")

#: First wait before a partition whose offset keeps being out of range inside the log is
#: fetched again; doubled each time, up to _RESET_BACKOFF_MAX_S.
_RESET_BACKOFF_S = 0.5
_RESET_BACKOFF_MAX_S = 30.0
#: Shortest interval between two restarts of the child's handle (doubling up to 30 s):
#: a handle that fails at once must not be recreated in a tight loop.
_RESTART_BACKOFF_S = 1.0
#: A favoured partition (``Child.favour``) none of whose records came for this long
#: holds the others back no more (its leader unreachable, say): the rest flows again.
FAVOUR_STALL_S = 2.0
#: Longest wait for the metadata of a topic the child's handle has not read yet, before its
#: first partition of it is assigned (``_learn_topics``).
LEARN_TOPIC_TIMEOUT_S = 0.5
#: Out-of-range answers in a row for one offset inside the log before it is reported.
_RESETS_REPORTED = 3
#: Errors (through error_cb) meaning a partition being read may have stopped existing.
_UNKNOWN_CODES = (
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)
#: Commit errors meaning that the catch-up group has members of its own.
_MEMBERS_ERRORS = (
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID,
)


def call_bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking librdkafka call on a helper thread; stop waiting after ``timeout_s``.

    librdkafka queues an OffsetCommit until a coordinator answers, and its close() waits
    for every outstanding commit: with the broker hung (SIGSTOPped, a network partition)
    a synchronous commit, and the close() of a consumer that has a commit outstanding,
    never return (measured: still blocked after 395 s). The helper thread makes the call
    while the calling thread waits, so no Python state is used by two threads at once.
    After the timeout the call is abandoned, not cancelled: it may still complete later,
    which is safe because every commit we write is true on its own, and an older one
    only claims less.

    confluent-kafka serializes the calls made on one handle, per calling thread: an
    abandoned call would make every later call of the owner wait for it (a hung broker
    would hang poll()). The helper therefore presents the owner's identity to that gate,
    as confluent-kafka's own AIOConsumer does for its worker threads; librdkafka itself
    is thread-safe.

    Raises:
        KafkaException: ``_TIMED_OUT`` after ``timeout_s``; otherwise what ``fn`` raised.
    """
    outcome: list[Any] = []
    done = threading.Event()
    # the caller's identity at the gate: its own (an asyncio wrapper's worker thread
    # presents its call's), else its thread's
    owner = _GATE_IDENTITY.get() or threading.get_ident()

    def run() -> None:
        try:
            _GATE_IDENTITY.set(owner)
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=f"fastrebalance-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise KafkaException(
            KafkaError(
                KafkaError._TIMED_OUT,
                f"{what} did not complete within {timeout_s:g}s: the broker did not answer in"
                " time (unreachable, or still working through earlier requests)",
            )
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class ChildState(enum.Enum):
    NOT_STARTED = "not started"  # no handle yet: no backlog ever needed one
    ACTIVE = "active"  # handle open, reading at least one range
    STANDBY = "standby"  # handle open, nothing to read: kept for the next crash
    CLOSED = "closed"  # closed with the facade


class _Cursor:
    """The piece ``[pos, end)`` of a partition's backlog the child is reading, the ledger
    it comes from, and the run of the epoch that records what was handed out."""

    __slots__ = ("end", "epoch", "ledger", "pos", "resets", "retry_at", "run", "start")

    def __init__(self, start: int, end: int, ledger: Ledger, epoch: Epoch) -> None:
        self.start = start
        self.pos = start
        self.end = end
        self.ledger = ledger
        self.epoch = epoch
        self.run: Run = epoch.child_run(start)
        self.resets = 0  # consecutive out-of-range resets inside the log (backoff)
        self.retry_at = 0.0  # paused until then after such a reset


def _record(moved: dict[Key, _Cursor]) -> None:
    """Tell each moved cursor's run the records it handed out (up to ``pos``)."""
    for cur in moved.values():
        cur.run.handed(cur.pos - 1)
        cur.resets = 0
    moved.clear()


#: Every Child with an open librdkafka handle, held weakly: the test suite checks after each
#: test that none outlives it (a child a closed or collected Consumer left open logged into
#: later tests; tests/conftest.py). Bookkeeping of the owner's thread only.
OPEN: weakref.WeakSet[Child] = weakref.WeakSet()


class Child:
    def __init__(
        self,
        conf: dict[str, Any],
        on_deleted: DeletedCallback,
        report: Callable[[KafkaError], None] | None = None,
        timeout_s: float = 10.0,
        close_timeout_s: float = 60.0,
    ) -> None:
        self._conf = conf
        self._on_deleted = on_deleted
        self._report = report
        self._timeout = timeout_s
        self._close_timeout = close_timeout_s
        self._handle: _RdConsumer | None = None
        #: topics whose metadata the current handle was asked for (``_learn_topics``)
        self._learned: set[str] = set()
        self._cursors: dict[Key, _Cursor] = {}
        self._paused: set[Key] = set()
        self._backoff: dict[Key, _Cursor] = {}  # waiting out a reset loop
        #: partitions whose records go first (``favour``), and the others, paused meanwhile
        self._favoured: frozenset[Key] = frozenset()
        self._held_back: set[Key] = set()
        #: favoured partitions that stalled (``FAVOUR_STALL_S``): they hold nothing back
        self._stalled: set[Key] = set()
        #: while holding back: the favoured partitions' positions, when they last moved,
        #: and when consume() last looked
        self._hold_mark: tuple[int, float, float] = (0, 0.0, 0.0)
        self._closed = False
        self._close_lock = threading.Lock()
        self._needs_restart = False
        # librdkafka said a partition or topic is unknown (deleted?): the next consume()
        # looks at the metadata of the topics being read (set by error_cb, same thread)
        self._check_topics = False
        self._warned_foreign = False
        self._restart_at = 0.0
        self._restart_wait = _RESTART_BACKOFF_S
        #: Handles created so far: 1 after the first catch-up, whatever the crashes.
        self.handles_created = 0
        #: Backlog records handed to the application (for metrics).
        self.records_delivered = 0
        #: Partitions whose catch-up started / finished (for metrics).
        self.catchups_started = 0
        self.catchups_finished = 0
        #: Checkpoint commits that failed (for metrics).
        self.commit_failures = 0

    # -- lifecycle ------------------------------------------------------------
    @property
    def state(self) -> ChildState:
        if self._closed:
            return ChildState.CLOSED
        if self._handle is None:
            return ChildState.NOT_STARTED
        return ChildState.ACTIVE if self._cursors else ChildState.STANDBY

    @property
    def alive(self) -> bool:
        return self._handle is not None and not self._closed and not self._needs_restart

    @property
    def active(self) -> bool:
        return bool(self._cursors)

    def handle(self) -> _RdConsumer:
        if self._closed:
            raise RuntimeError("Consumer closed")
        if self._handle is None:
            conf = dict(self._conf)
            user_error_cb = conf.get("error_cb")

            def error_cb(err: KafkaError) -> None:
                if err.fatal():
                    self._needs_restart = True
                if err.code() in _UNKNOWN_CODES:
                    self._check_topics = True
                if user_error_cb is not None:
                    user_error_cb(err)

            conf["error_cb"] = error_cb
            conf["on_commit"] = self._on_commit
            self._handle = _RdConsumer(conf)
            self._learned = set()
            OPEN.add(self)
            self.handles_created += 1
            log.info("child consumer started (group %s)", conf.get("group.id"))
        return self._handle

    def close(self, wait: bool = True) -> None:
        """Close the handle within ``close_timeout_s`` (librdkafka's close waits for the
        outstanding checkpoint commits; on a hung broker it would wait forever). Not
        ``wait``: start closing it and return (the facade's close() gave up waiting for
        the primary's, on the thread that would have closed this one next)."""
        with self._close_lock:  # that thread may still get here, once the primary closed
            if self._closed:
                return
            self._closed = True
            handle, self._handle = self._handle, None
        self._cursors.clear()
        self._backoff.clear()
        self._held_back.clear()
        OPEN.discard(self)
        if handle is not None:
            try:
                call_bounded(
                    handle.close, self._close_timeout if wait else 0.0, "child close()"
                )
            except (RuntimeError, KafkaException) as exc:
                if wait:
                    log.warning("child consumer close failed: %s", exc)

    # -- assignment -----------------------------------------------------------
    def start(self, key: Key, ledger: Ledger, epoch: Epoch, at: int = 0) -> None:
        """Read ``ledger``'s backlog of ``key`` from its first piece at or after ``at``."""
        self.start_all([(key, ledger, epoch)], at)

    def start_all(self, work: Iterable[tuple[Key, Ledger, Epoch]], at: int = 0) -> None:
        """``start()`` for many partitions, with one ``incremental_assign()`` for all the
        partitions the child was not reading yet: each assign call waits for librdkafka's
        main thread (~0.3 ms measured), which made a 1,000-partition assignment spend
        0.3 s of its rebalance callback here, one partition at a time."""
        assign: list[TopicPartition] = []
        pause: list[TopicPartition] = []
        for key, ledger, epoch in work:
            piece = ledger.ranges.next_from(at)
            if piece is None:
                self.stop([key])
                continue
            self.handle()  # created on the first backlog (raises once closed)
            fresh = key not in self._cursors
            if fresh:
                self.catchups_started += 1
            self._cursors[key] = _Cursor(piece[0], piece[1], ledger, epoch)
            self._backoff.pop(key, None)
            if fresh:
                assign.append(TopicPartition(key[0], key[1], piece[0]))
                if key in self._paused:
                    pause.append(TopicPartition(key[0], key[1]))
            else:
                self._seek(key, piece[0])
            log.info(
                "catch-up of %s [%d] from offset %d (%d ranges, %d records pending)",
                key[0],
                key[1],
                piece[0],
                len(ledger.ranges),
                ledger.ranges.count(),
            )
        if assign:
            handle = self.handle()
            self._learn_topics(handle, {tp.topic for tp in assign})
            handle.incremental_assign(assign)
            if pause:
                handle.pause(pause)
        self._hold()

    def _learn_topics(self, handle: _RdConsumer, topics: set[str]) -> None:
        """Ask for the metadata of topics this handle has not read yet, before assigning
        their partitions. librdkafka looks for the leader of a partition assigned on a
        handle already connected only at its next one-second topic scan: a child created
        ahead (group-wide catch-up, a checkpoint read at planning) handed out the first
        record of its first chunk 0.55-0.6 s after ``incremental_assign()`` on Apache
        Kafka 3.9, against 3-5 ms once the topic's metadata was asked for first (a fresh
        handle gets it with its first metadata request). One round trip per topic per
        handle; on a timeout or an error librdkafka's own scan finds the leader as before."""
        new = topics - self._learned
        if not new:
            return
        self._learned |= new
        for topic in sorted(new):
            try:
                handle.list_topics(topic, timeout=LEARN_TOPIC_TIMEOUT_S)
            except (KafkaException, RuntimeError) as exc:
                log.debug("child consumer: no metadata for %s yet (%s)", topic, exc)

    def stop(self, keys: Iterable[Key]) -> None:
        """Stop reading ``keys`` (revoked, lost or finished); progress is in the logs."""
        gone = []
        for k in keys:
            self._backoff.pop(k, None)
            self._held_back.discard(k)
            self._stalled.discard(k)
            if self._cursors.pop(k, None) is not None:
                gone.append(TopicPartition(k[0], k[1]))
        if gone and self._handle is not None:
            try:
                self._handle.incremental_unassign(gone)
            except (KafkaException, RuntimeError) as exc:
                log.warning("child unassign failed: %s", exc)
        if gone:
            self._hold()  # a favoured partition finished: the others flow again

    def stop_all(self) -> None:
        """Stop reading every partition (the primary failed fatally: see the facade)."""
        self.stop(list(self._cursors))

    def forget(self, keys: Iterable[Key]) -> None:
        """The partitions left this member: stop, and drop their pause state too."""
        keys = list(keys)
        self.stop(keys)
        self._paused.difference_update(keys)

    def refresh(self, key: Key) -> None:
        """The ranges changed under the cursor (coalesced, rewound): re-aim."""
        cur = self._cursors.get(key)
        if cur is None:
            return
        piece = cur.ledger.ranges.next_from(cur.pos)
        if piece is None:
            self._finish(key, cur)
        elif piece != (cur.pos, cur.end):
            cur.start, cur.end = piece
            if piece[0] != cur.pos:
                cur.pos = piece[0]
                cur.run = cur.epoch.child_run(piece[0])
                self._seek(key, piece[0])

    def is_paused(self, key: Key) -> bool:
        """The application paused ``key`` (and has not resumed it)."""
        return key in self._paused

    def pause(self, keys: Iterable[Key]) -> None:
        mine = []
        for k in keys:
            self._paused.add(k)
            if k in self._cursors:
                mine.append(TopicPartition(k[0], k[1]))
        if mine and self._handle is not None:
            self._handle.pause(mine)

    def resume(self, keys: Iterable[Key]) -> None:
        mine = []
        for k in keys:
            self._paused.discard(k)
            if k in self._cursors and k not in self._backoff and k not in self._held_back:
                mine.append(TopicPartition(k[0], k[1]))
        if mine and self._handle is not None:
            self._handle.resume(mine)

    def favour(self, keys: Iterable[Key]) -> None:
        """Hand out the records of ``keys`` before any other partition's: while one of
        them is read, every other partition the child reads is paused.

        librdkafka hands a consumer's records out in fetch order, one fetch holding up to
        ``max.partition.fetch.bytes`` of each partition, and fetches ahead up to
        ``queued.min.messages`` per partition: a small partition started beside big ones
        had its records queued behind tens of thousands of theirs (group-wide catch-up,
        2 members, 40,000 / 20,000 / 500 / 1,500 records: a 1,500-record chunk assigned
        at 0.9 s came out at 13 s, behind the 20,000-record partition's whole block, and
        59,991 records went first in a bare confluent-kafka consumer assigned the same
        way). Pausing a partition drops what librdkafka queued of it, and resuming it
        fetches again from the record after the last one handed out: nothing is skipped
        or handed out twice, the cost is one fetch of each held partition again."""
        want = frozenset(keys)
        if want != self._favoured:
            self._favoured = want
            self._stalled &= want
            self._hold()

    def _hold(self) -> None:
        """Pause (hold back) or resume the partitions ``favour`` says; a partition the
        application paused, or one waiting out a reset loop, stays paused either way."""
        if self._handle is None or self._closed:
            return
        first = any(
            k in self._cursors
            and k not in self._paused
            and k not in self._backoff
            and k not in self._stalled
            for k in self._favoured
        )
        hold = {k for k in self._cursors if k not in self._favoured} if first else set()
        if hold and not self._held_back:
            now = time.monotonic()
            self._hold_mark = (self._favoured_progress(), now, now)
        pause = [k for k in hold - self._held_back if k not in self._paused]
        resume = [k for k in self._held_back - hold if k in self._cursors]
        self._held_back = hold
        try:
            if pause:
                self._handle.pause([TopicPartition(k[0], k[1]) for k in pause])
            for k in resume:
                if k in self._paused or k in self._backoff:
                    continue
                self._handle.resume([TopicPartition(k[0], k[1])])
                # from the cursor: it, not librdkafka's position, says what comes next
                # (a piece re-aimed while the partition was held back)
                self._seek(k, self._cursors[k].pos)
        except (KafkaException, RuntimeError) as exc:
            log.warning("child consumer: could not pause or resume for a favoured "
                        "partition: %s", exc)  # fmt: skip

    def _favoured_progress(self) -> int:
        return sum(c.pos for k, c in self._cursors.items() if k in self._favoured)

    def _check_stall(self) -> None:
        """Holding back: the favoured partitions' records must keep coming, else they
        hold nothing back any more (``FAVOUR_STALL_S``). Only time the application spent
        calling counts: a long pause between two calls (its own work) is no stall."""
        progress, since, last = self._hold_mark
        now = time.monotonic()
        moved = self._favoured_progress()
        if moved != progress or now - last > FAVOUR_STALL_S / 2:
            self._hold_mark = (moved, now, now)
        elif now - since <= FAVOUR_STALL_S:
            self._hold_mark = (progress, since, now)
        else:
            log.info("child consumer: no record of %s in %.1fs: the other partitions are "
                     "read again meanwhile", sorted(self._favoured), FAVOUR_STALL_S)  # fmt: skip
            self._stalled |= self._favoured
            self._hold()

    def position(self, key: Key) -> int | None:
        cur = self._cursors.get(key)
        return cur.pos if cur is not None else None

    # -- reading --------------------------------------------------------------
    def consume(self, num: int, timeout: float = 0.0) -> list[Message]:
        """Up to ``num`` backlog records. Never raises for a broker problem: a dead handle
        is replaced (with a backoff), and its partitions resume from the ledger."""
        if not self._cursors:
            return []
        if self._backoff:
            self._retry_backed_off()
        if self._held_back:
            self._check_stall()
        if self._needs_restart:
            self.restart()
            if self._needs_restart:
                return []
        if self._check_topics:
            self._stop_vanished()
        try:
            msgs = self.handle().consume(num, timeout)
        except RuntimeError:  # the handle died under us: a child crash
            self._needs_restart = True
            self.restart()
            return []
        except KafkaException as exc:
            log.warning("child consumer: %s", exc)
            return []
        return self._accept(msgs) if msgs else msgs

    def _accept(self, msgs: list[Message]) -> list[Message]:
        """Keep the records inside the current piece of each partition's range.

        Per record only the cursor moves; its run learns what was handed out once per
        partition per batch (``_record``), before anything that reads or moves the run.
        Three Python calls per record were a third of the drain at no work per record."""
        out = []
        cursors = self._cursors
        moved: dict[Key, _Cursor] = {}  # cursors whose run has not seen their last records
        for m in msgs:
            err = m.error()
            if err is not None:
                _record(moved)
                self._on_error(m, err)
                continue
            # a record (not an event): topic, partition and offset are all set
            key: Key = (m.topic(), m.partition())  # type: ignore[assignment]
            cur = cursors.get(key)
            if cur is None:
                continue  # fetched before the partition was stopped
            o: int = m.offset()  # type: ignore[assignment]
            if o < cur.pos:
                continue  # fetched before a seek
            if o >= cur.end:
                # past the piece: records of another stream, or offsets with no record
                # (transaction markers, compaction) ate the end of the piece
                _record(moved)
                nxt = self._next_piece(key, cur, o)
                if nxt is None or not (nxt.pos <= o < nxt.end):
                    continue
                cur = nxt
            cur.pos = o + 1
            moved[key] = cur
            out.append(m)
            if cur.pos >= cur.end:
                _record(moved)
                self._next_piece(key, cur, cur.pos)
        _record(moved)
        self.records_delivered += len(out)
        return out

    def _next_piece(self, key: Key, cur: _Cursor, offset: int) -> _Cursor | None:
        """Move ``cur`` to the next pending piece; seek unless ``offset`` (the record
        in hand, or the end just reached) already lies inside it."""
        cur.run.advance(cur.end)
        piece = cur.ledger.ranges.next_from(cur.end)
        if piece is None:
            self._finish(key, cur)
            return None
        # The gap between two pieces holds nothing unprocessed: the run goes on over it.
        cur.run.advance(piece[0])
        cur.start, cur.end = piece
        cur.pos = piece[0]
        if not (piece[0] <= offset < piece[1]):
            self._seek(key, piece[0])
        return cur

    def _finish(self, key: Key, cur: _Cursor) -> None:
        cur.run.advance(cur.end)
        self.catchups_finished += 1
        self.stop([key])
        log.info("catch-up of %s [%d] finished: backlog delivered", key[0], key[1])
        if not self._cursors:
            log.info("child consumer on standby")

    def _seek(self, key: Key, offset: int) -> None:
        tp = TopicPartition(key[0], key[1], offset)
        try:
            self.handle().seek(tp)
        except KafkaException:
            # seek needs an actively fetching partition; re-assigning always works
            self.handle().incremental_unassign([TopicPartition(key[0], key[1])])
            self.handle().incremental_assign([tp])

    def _on_error(self, m: Message, err: KafkaError) -> None:
        key: Key = (m.topic(), m.partition())  # type: ignore[assignment]
        cur = self._cursors.get(key)
        code = err.code()
        offset = m.offset()
        if code == KafkaError._PARTITION_EOF:
            # The end of the log: nothing left below it that the application could see.
            if cur is not None and offset is not None and offset >= cur.end:
                self._next_piece(key, cur, offset)
        elif code == KafkaError._AUTO_OFFSET_RESET and cur is not None:
            self._out_of_range(key, cur)
        else:
            log.warning("child consumer: %s [%s]: %s", m.topic(), m.partition(), err)

    def _out_of_range(self, key: Key, cur: _Cursor) -> None:
        """The child's offset is out of range: retention deleted records it still had to
        read (report, move on), the log is now shorter than the range (report, stop), or
        the broker said so for an offset inside the log (a leader change truncating and
        re-growing the log): fetch it again after a growing pause, never in a tight loop.
        """
        low, high = self._watermarks(key)
        if high is None or low is None:
            log.warning(
                "child consumer: %s [%d]: offset %d out of range, no watermarks; retrying",
                *key,
                cur.pos,
            )
            self._back_off(key, cur)
            return
        if cur.pos >= high:
            self._beyond_log_end(key, cur, high)
            return
        if cur.pos >= low:
            self._back_off(key, cur)
            return
        for start, end in cur.ledger.drop_below(low):
            lost_from = max(start, cur.pos)
            if lost_from < end:
                self._on_deleted(key[0], key[1], lost_from, end)
        self.start(key, cur.ledger, cur.epoch, at=low)

    def _watermarks(self, key: Key) -> tuple[int | None, int | None]:
        """librdkafka's cached watermarks (the fetch that failed refreshed them); a
        bounded query only when it has none."""
        tp = TopicPartition(key[0], key[1])
        try:
            low, high = self.handle().get_watermark_offsets(tp, cached=True)
            if low >= 0 and high >= 0:
                return low, high
            low, high = self.handle().get_watermark_offsets(
                tp, timeout=min(self._timeout, 5.0), cached=False
            )
            return low, high
        except KafkaException:
            return None, None

    def _back_off(self, key: Key, cur: _Cursor) -> None:
        wait = min(_RESET_BACKOFF_S * (2**cur.resets), _RESET_BACKOFF_MAX_S)
        cur.resets += 1
        if cur.resets == _RESETS_REPORTED and self._report is not None:
            self._report(
                KafkaError(
                    KafkaError.OFFSET_OUT_OF_RANGE,
                    f"{key[0]} [{key[1]}]: the broker keeps answering offset {cur.pos} out of "
                    "range although the log holds it (a leader change?): the catch-up "
                    "consumer keeps trying, with a growing pause",
                )
            )
        cur.retry_at = time.monotonic() + wait
        self._backoff[key] = cur
        with contextlib.suppress(KafkaException, RuntimeError):
            self.handle().pause([TopicPartition(key[0], key[1])])
        log.warning(
            "child consumer: %s [%d]: offset %d reported out of range inside the log "
            "(%d times); fetching it again in %.1fs",
            *key,
            cur.pos,
            cur.resets,
            wait,
        )

    def _retry_backed_off(self) -> None:
        now = time.monotonic()
        for key, cur in list(self._backoff.items()):
            if now < cur.retry_at:
                continue
            del self._backoff[key]
            if self._cursors.get(key) is not cur:
                continue
            cur.run = cur.epoch.child_run(cur.pos)
            with contextlib.suppress(KafkaException, RuntimeError):
                if key not in self._paused and key not in self._held_back:
                    self.handle().resume([TopicPartition(key[0], key[1])])
                self._seek(key, cur.pos)

    def _stop_vanished(self) -> None:
        """Stop reading partitions that no longer exist (their topic was deleted).

        librdkafka reports them only through error_cb and keeps the partition assigned,
        fetching nothing: without this the catch-up would wait for ever, silently. What the
        child had not read stays pending (nothing is claimed), and it says so; a later
        assignment plans the partition again if it comes back."""
        self._check_topics = False
        for topic in sorted({k[0] for k in self._cursors}):
            try:
                md = self.handle().list_topics(topic, timeout=min(self._timeout, 5.0))
            except KafkaException as exc:
                log.warning("child consumer: no metadata for %s (%s)", topic, exc)
                self._check_topics = True  # ask again on a later call
                continue
            meta = md.topics.get(topic)
            known = set() if meta is None or meta.error is not None else set(meta.partitions)
            for key, cur in list(self._cursors.items()):
                if key[0] != topic or key[1] in known:
                    continue
                msg = (
                    f"{key[0]} [{key[1]}] no longer exists (topic deleted?): the catch-up "
                    f"consumer stops reading it; offsets [{cur.pos}, {cur.end}) and any later "
                    "pending range stay pending (never claimed processed)"
                )
                log.error(msg)
                if self._report is not None:
                    self._report(KafkaError(KafkaError._UNKNOWN_PARTITION, msg))
                self.stop([key])

    def _beyond_log_end(self, key: Key, cur: _Cursor, high: int) -> None:
        """The range lies past the log end: the topic was deleted and recreated, or an
        unclean leader election truncated the log. Those records cannot be read; the range
        stays pending (nothing is claimed processed) and the child stops reading it, instead
        of fetching, failing and restarting in a loop. A later assignment plans it again."""
        msg = (
            f"records {key[0]} [{key[1]}] offsets [{cur.pos}, {cur.end}) are beyond the log "
            f"end {high} (topic recreated or log truncated?): the catch-up consumer cannot "
            "read them; they stay pending"
        )
        log.error(msg)
        if self._report is not None:
            self._report(KafkaError(KafkaError.OFFSET_OUT_OF_RANGE, msg))
        self.stop([key])

    # -- the child's commit log -----------------------------------------------
    def commit(self, checkpoints: dict[Key, ChildCheckpoint]) -> None:
        """Write checkpoints to the child's log, asynchronously: the group commit that
        follows carries the same progress in its token, so nothing waits on this log
        (and a rebalance callback, or a hung broker, is never held up by it)."""
        self.serve()
        offsets = [
            TopicPartition(k[0], k[1], cp.offset, metadata=encode_child_checkpoint(cp))
            for k, cp in checkpoints.items()
        ]
        try:
            self.handle().commit(offsets=offsets, asynchronous=True)
        except (KafkaException, RuntimeError) as exc:
            self.commit_failures += 1
            log.warning("child checkpoint commit failed: %s", exc)

    def committed(self, keys: list[Key], timeout_s: float | None = None) -> dict[Key, Any]:
        """Read the child's commit log: per partition the stored ``TopicPartition``
        (librdkafka bounds the round trip by ``timeout_s``)."""
        tps = [TopicPartition(k[0], k[1]) for k in keys]
        timeout = self._timeout if timeout_s is None else timeout_s
        got = self.handle().committed(tps, timeout=timeout)
        foreign = [tp for tp in got if tp.offset >= 0 and not is_child_metadata(tp.metadata)]
        if foreign:
            tp = foreign[0]
            self._another_group(
                f"holds an offset fastrebalance did not write ({tp.topic} [{tp.partition}] "
                f"at {tp.offset})"
            )
        return {(tp.topic, tp.partition): tp for tp in got}

    def serve(self) -> None:
        """Serve the results of earlier checkpoint commits when nothing is being read (while
        reading, consume() serves them: a poll() then could take a record out of order)."""
        if self._handle is not None and not self._cursors and not self._closed:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._handle.poll(0)

    def _on_commit(self, err: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        """Results of the checkpoint commits (served by the child's consume())."""
        if err is None:
            return
        self.commit_failures += 1
        if err.code() in _MEMBERS_ERRORS:
            self._another_group(f"has members of its own (a checkpoint commit failed: {err})")
        else:
            log.warning("child checkpoint commit failed: %s", err)

    def _another_group(self, what: str) -> None:
        """The catch-up group is somebody else's: its checkpoints would overwrite that
        group's offsets (and theirs ours). Reported once; our side stays safe either way
        (the user's group carries every claim in its token)."""
        if self._warned_foreign:
            return
        self._warned_foreign = True
        msg = (
            f"the catch-up group {self._conf.get('group.id')!r} {what}: another application "
            "seems to use that group id, and the catch-up checkpoints would overwrite its "
            "offsets; set parallel.rebalance.catchup.group.id to a group id of its own"
        )
        log.error(msg)
        if self._report is not None:
            self._report(KafkaError(KafkaError._CONFLICT, msg))

    def group_metadata(self) -> Any:
        """The catch-up group's metadata for a producer transaction. The child never
        joins its group, so this carries no generation: the user's group, committed in
        the same transaction with the member's generation, is what fences a zombie."""
        return self.handle().consumer_group_metadata()

    def retire_stale(
        self, added: dict[Key, tuple[int, int]], budget: Budget, write: bool = True
    ) -> list[TopicPartition]:
        """Clear checkpoints that would apply to the ranges a plan just ``added``.

        Such a checkpoint is from before an operator's offset reset (see
        ``checkpoint_is_stale``). It is replaced by a bare offset, which is no
        checkpoint, before the group can commit the new token. If this fails, the records
        the checkpoint names are skipped once more: they *were* processed, so nothing is
        lost; only the reprocessing asked for is.

        ``write=False`` (exactly-once): the retirements are returned, not written, so
        that they travel in the next transaction with the token they make safe.
        """
        try:
            found = call_with_retries(
                lambda: self.committed(list(added), budget.request_timeout(self._timeout)),
                max_seconds=budget.remaining(),
            )
        except KafkaException as exc:
            log.warning("could not read the catch-up group's checkpoints (%s)", exc)
            return []
        retire = []
        for key, tp in found.items():
            try:
                cp = decode_child_checkpoint(tp.metadata, tp.offset) if tp.offset >= 0 else None
            except TokenError:
                continue
            if cp is not None and checkpoint_is_stale(cp, added[key]):
                retire.append(
                    TopicPartition(key[0], key[1], added[key][0], metadata=NO_CHECKPOINT)
                )
        if not retire or not write:
            return retire
        try:
            self.handle().commit(offsets=retire, asynchronous=True)
        except (KafkaException, RuntimeError) as exc:
            log.warning("could not clear stale catch-up checkpoints (%s)", exc)
            return retire
        log.info(
            "%s: the catch-up group's checkpoint predates an offset reset; cleared",
            ", ".join(f"{tp.topic} [{tp.partition}]" for tp in retire),
        )
        return retire

    def restart(self) -> None:
        """A child crash: a new handle, each partition read again from its first pending
        piece. No broker round trip: the ledger already holds every claim made, so a
        restart during a broker outage loses nothing and cannot fail; the records the
        old handle delivered but the application did not commit are delivered again."""
        now = time.monotonic()
        if now < self._restart_at:
            return
        self._restart_at = now + self._restart_wait
        self._restart_wait = min(self._restart_wait * 2, 30.0)
        log.warning("child consumer restarting: its partitions are read again from the ledger")
        old, self._handle = self._handle, None
        self._needs_restart = False
        if old is not None:
            # Closed on a thread of its own and not waited for: librdkafka's close() waits
            # for the old handle's outstanding checkpoint commits, forever on a hung
            # broker, and this runs inside the owner's poll(). The new handle does not
            # share its state, and every checkpoint it may still write is true.
            with contextlib.suppress(RuntimeError, KafkaException):
                call_bounded(old.close, 0.0, "old child close()")
        work = {k: (c.ledger, c.epoch) for k, c in self._cursors.items()}
        self._cursors.clear()
        self._backoff.clear()
        self._held_back.clear()  # the new handle pauses nothing yet
        try:
            self.start_all((key, ledger, epoch) for key, (ledger, epoch) in work.items())
        except (KafkaException, RuntimeError) as exc:
            log.warning("child consumer restart failed (%s); retrying later", exc)
            for key, (ledger, epoch) in work.items():
                if key not in self._cursors:
                    piece = ledger.ranges.next_from(0)
                    if piece is not None:
                        self._cursors[key] = _Cursor(piece[0], piece[1], ledger, epoch)
            self._needs_restart = True
        else:
            self._restart_wait = _RESTART_BACKOFF_S
