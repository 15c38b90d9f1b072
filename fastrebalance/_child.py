"""The child consumer: reads the skipped backlog ranges, then stands by.

It is an ordinary confluent-kafka consumer built from the user's config (security,
SASL, SSL, callbacks) minus group membership: it reads by ``assign()`` and commits
into its own group id, so it never joins or disturbs the user's group.

Thread ownership: the child's librdkafka handle, like the primary's, is owned by
the thread that calls the facade's poll()/consume()/commit() (the user's thread).
librdkafka's own threads fetch for both handles concurrently; that is where the
parallel catch-up comes from, with no Python thread and no cross-thread queue.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from confluent_kafka import Consumer as _RdConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from ._retry import Budget, call_with_retries
from ._state import PartitionState, checkpoint_applies, checkpoint_is_stale
from ._token import (
    ChildCheckpoint,
    TokenError,
    decode_child_checkpoint,
    encode_child_checkpoint,
)

__all__ = ["Child", "ChildState", "call_bounded"]

log = logging.getLogger("fastrebalance.child")

Key = tuple[str, int]
#: (topic, partition, first lost offset, end of lost offsets) -> None
DeletedCallback = Callable[[str, int, int, int], None]
T = TypeVar("T")


def call_bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking librdkafka call on a helper thread; stop waiting after ``timeout_s``.

    librdkafka retries an OffsetCommit until a coordinator answers, and its close() waits
    for every outstanding commit: with the broker hung (SIGSTOPped, a network partition)
    a synchronous commit, and the close() of a plain confluent-kafka consumer that has a
    commit outstanding, never return (measured: still blocked after 395 s). The helper
    thread only makes the call while the calling thread waits, so no Python state is ever
    used by two threads at once. After the timeout the call is abandoned, not cancelled:
    it may still complete later, which is safe because every commit we write is true on
    its own, and an older one only claims less.

    Raises:
        KafkaException: ``_TIMED_OUT`` after ``timeout_s``; otherwise what ``fn`` raised.
    """
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
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
                f"{what} did not complete within {timeout_s:g}s (socket.timeout.ms): "
                "the broker is unreachable",
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
    """The piece of a pending range the child is reading: [pos, end)."""

    __slots__ = ("end", "pos", "start", "state")

    def __init__(self, start: int, end: int, state: PartitionState) -> None:
        self.start = start
        self.pos = start
        self.end = end
        self.state = state


class Child:
    def __init__(
        self,
        conf: dict[str, Any],
        on_deleted: DeletedCallback,
        timeout_s: float = 10.0,
        commit_timeout_s: float = 60.0,
    ) -> None:
        self._conf = conf
        self._on_deleted = on_deleted
        self._timeout = timeout_s
        self._commit_timeout = commit_timeout_s  # synchronous commits and close()
        self._handle: _RdConsumer | None = None
        self._cursors: dict[Key, _Cursor] = {}
        self._paused: set[Key] = set()
        self._closed = False
        self._needs_restart = False
        #: Handles created so far: 1 after the first catch-up, whatever the crashes.
        self.handles_created = 0
        #: Backlog records handed to the application (for metrics).
        self.records_delivered = 0

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
                if user_error_cb is not None:
                    user_error_cb(err)

            conf["error_cb"] = error_cb
            self._handle = _RdConsumer(conf)
            self.handles_created += 1
            log.info("child consumer started (group %s)", conf.get("group.id"))
        return self._handle

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cursors.clear()
        if self._handle is not None:
            try:
                call_bounded(self._handle.close, self._commit_timeout, "child close()")
            except (RuntimeError, KafkaException) as exc:
                log.warning("child consumer close failed: %s", exc)

    # -- assignment -----------------------------------------------------------
    def start(self, key: Key, state: PartitionState) -> None:
        """Begin (or continue) reading ``state``'s pending ranges for ``key``."""
        resume = state.child_delivered
        piece = state.ranges.next_from(resume if resume is not None else 0)
        if piece is None:
            return
        handle = self.handle()
        fresh = key not in self._cursors
        self._cursors[key] = _Cursor(piece[0], piece[1], state)
        tp = TopicPartition(key[0], key[1], piece[0])
        if fresh:
            handle.incremental_assign([tp])
            if key in self._paused:
                handle.pause([TopicPartition(key[0], key[1])])
        else:
            handle.seek(tp)
        log.info(
            "catch-up of %s [%d] from offset %d (%d ranges, %d records pending)",
            key[0],
            key[1],
            piece[0],
            len(state.ranges),
            state.ranges.count(),
        )

    def stop(self, keys: Iterable[Key]) -> None:
        """Stop reading ``keys`` (revoked, lost or finished); progress is in the logs."""
        gone = [TopicPartition(k[0], k[1]) for k in keys if self._cursors.pop(k, None)]
        if gone and self._handle is not None:
            try:
                self._handle.incremental_unassign(gone)
            except (KafkaException, RuntimeError) as exc:
                log.warning("child unassign failed: %s", exc)

    def forget(self, keys: Iterable[Key]) -> None:
        """The partitions left this member: stop, and drop their pause state too."""
        keys = list(keys)
        self.stop(keys)
        self._paused.difference_update(keys)

    def refresh(self, key: Key) -> None:
        """The ranges changed under the cursor (coalesced, seek, retention): re-aim."""
        cur = self._cursors.get(key)
        if cur is None:
            return
        piece = cur.state.ranges.next_from(cur.pos)
        if piece is None:
            self._finish(key)
        elif piece != (cur.pos, cur.end):
            cur.start, cur.end = piece
            if piece[0] != cur.pos:
                cur.pos = piece[0]
                self._seek(key, piece[0])

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
            if k in self._cursors:
                mine.append(TopicPartition(k[0], k[1]))
        if mine and self._handle is not None:
            self._handle.resume(mine)

    def position(self, key: Key) -> int | None:
        cur = self._cursors.get(key)
        return cur.pos if cur is not None else None

    # -- reading --------------------------------------------------------------
    def consume(self, num: int, timeout: float = 0.0) -> list[Message]:
        if not self._cursors:
            return []
        if self._needs_restart:
            self.restart()
        try:
            msgs = self.handle().consume(num, timeout)
        except RuntimeError:  # the handle died under us: a child crash
            self.restart()
            return []
        return self._accept(msgs) if msgs else msgs

    def _accept(self, msgs: list[Message]) -> list[Message]:
        """Keep the records inside the current piece of each partition's range."""
        out = []
        cursors = self._cursors
        for m in msgs:
            if m.error() is not None:
                self._on_error(m)
                continue
            key = (m.topic(), m.partition())
            cur = cursors.get(key)
            if cur is None:
                continue  # fetched before the partition was stopped
            o = m.offset()
            if o < cur.pos:
                continue  # fetched before a seek
            if o >= cur.end:
                # past the piece: records of another stream, or a gap (compaction,
                # transaction markers) ate the end of the piece
                cur = self._next_piece(key, cur, o)
                if cur is None or not (cur.pos <= o < cur.end):
                    continue
            cur.pos = o + 1
            cur.state.child_delivered = cur.pos
            out.append(m)
            if cur.pos >= cur.end:
                self._next_piece(key, cur, cur.pos)
        self.records_delivered += len(out)
        return out

    def _next_piece(self, key: Key, cur: _Cursor, offset: int) -> _Cursor | None:
        """Move ``cur`` to the next pending piece; seek unless ``offset`` (the record
        in hand, or the end just reached) already lies inside it."""
        piece = cur.state.ranges.next_from(cur.end)
        if piece is None:
            cur.state.child_delivered = cur.end
            self._finish(key)
            return None
        cur.start, cur.end = piece
        cur.pos = piece[0]
        if not (piece[0] <= offset < piece[1]):
            self._seek(key, piece[0])
        return cur

    def _finish(self, key: Key) -> None:
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

    def _on_error(self, m: Message) -> None:
        err = m.error()
        key = (m.topic(), m.partition())
        if err.code() == KafkaError._AUTO_OFFSET_RESET and key in self._cursors:
            self._skip_deleted(key)
        elif err.code() == KafkaError._PARTITION_EOF:
            return
        else:
            log.warning("child consumer: %s [%s]: %s", m.topic(), m.partition(), err)

    def _skip_deleted(self, key: Key) -> None:
        """The child's offset is out of range: retention deleted records it still had to
        read (report, move on), or the log is now shorter than the range (report, stop)."""
        cur = self._cursors[key]
        try:
            low, high = self.handle().get_watermark_offsets(
                TopicPartition(key[0], key[1]), timeout=self._timeout, cached=False
            )
        except KafkaException as exc:
            # not knowing what is gone, skip nothing: fetch again, which fails again
            log.warning(
                "child consumer: %s [%d]: offset %d out of range, no watermarks (%s); retrying",
                *key,
                cur.pos,
                exc,
            )
            self._seek(key, cur.pos)
            return
        if cur.pos >= high:
            self._beyond_log_end(key, cur, high)
            return
        ranges = cur.state.ranges
        for s, e in list(ranges):
            lost_from, lost_to = max(s, cur.pos), min(e, low)
            if s >= low:
                break
            if lost_from < lost_to:
                self._on_deleted(key[0], key[1], lost_from, lost_to)
        ranges.remove_below(low)
        piece = ranges.next_from(max(low, cur.pos))
        self.stop([key])
        if piece is not None:
            cur.state.child_delivered = piece[0]
            self.start(key, cur.state)
        else:
            cur.state.child_delivered = low

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
        user_error_cb = self._conf.get("error_cb")
        if user_error_cb is not None:
            user_error_cb(KafkaError(KafkaError.OFFSET_OUT_OF_RANGE, msg))
        self.stop([key])

    # -- the child's commit log -----------------------------------------------
    def commit(
        self,
        checkpoints: dict[Key, ChildCheckpoint],
        asynchronous: bool,
        timeout_s: float | None = None,
    ) -> list[TopicPartition] | None:
        offsets = [
            TopicPartition(k[0], k[1], cp.offset, metadata=encode_child_checkpoint(cp))
            for k, cp in checkpoints.items()
        ]
        handle = self.handle()
        if asynchronous:
            return handle.commit(offsets=offsets, asynchronous=True)
        return call_bounded(
            lambda: call_with_retries(lambda: handle.commit(offsets=offsets, asynchronous=False)),
            self._commit_timeout if timeout_s is None else timeout_s,
            "child checkpoint commit",
        )

    def committed(self, keys: list[Key]) -> dict[Key, ChildCheckpoint]:
        """Read the child's commit log; foreign or corrupt entries are skipped."""
        tps = [TopicPartition(k[0], k[1]) for k in keys]
        out: dict[Key, ChildCheckpoint] = {}
        for tp in self.handle().committed(tps, timeout=self._timeout):
            if tp.offset < 0:
                continue
            try:
                cp = decode_child_checkpoint(tp.metadata, tp.offset)
            except TokenError as exc:
                log.warning("child checkpoint of %s [%d] ignored: %s", tp.topic, tp.partition, exc)
                continue
            if cp is not None:
                out[(tp.topic, tp.partition)] = cp
        return out

    def retire_stale(self, added: dict[Key, tuple[int, int]]) -> None:
        """Clear checkpoints that would apply to the ranges a plan just ``added``.

        Such a checkpoint is from before an operator's offset reset (see
        ``checkpoint_is_stale``). It is replaced by a bare offset, which is no
        checkpoint. The caller does this before the group's first commit of the new
        token (only then could the checkpoint apply) and after starting the fetches, so
        they overlap these round trips. If it fails, the records the checkpoint names are
        skipped once more: they *were* processed, so nothing is lost; only the
        reprocessing asked for is.
        """
        budget = Budget(self._timeout)
        try:
            found = call_with_retries(
                lambda: self.committed(list(added)), max_seconds=budget.remaining()
            )
            retire = [
                TopicPartition(key[0], key[1], added[key][0])
                for key, cp in found.items()
                if checkpoint_is_stale(cp, added[key])
            ]
            if not retire:
                return
            call_bounded(
                lambda: call_with_retries(
                    lambda: self.handle().commit(offsets=retire, asynchronous=False),
                    max_seconds=budget.remaining(),
                ),
                budget.request_timeout(self._commit_timeout, shortest=1.0),
                "clearing stale checkpoints",
            )
        except KafkaException as exc:
            log.warning(
                "could not clear catch-up checkpoints from before an offset reset (%s): "
                "records they name were processed before the reset and are not reprocessed",
                exc,
            )
            return
        log.info(
            "%s: the catch-up group's checkpoint predates an offset reset; cleared",
            ", ".join(f"{tp.topic} [{tp.partition}]" for tp in retire),
        )

    def restart(self) -> None:
        """A child crash: new handle, resume each partition from the child's log."""
        log.warning("child consumer restarting: resuming from its commit log")
        old, self._handle = self._handle, None
        self._needs_restart = False
        if old is not None:
            with contextlib.suppress(RuntimeError, KafkaException):
                old.close()
        work = {k: c.state for k, c in self._cursors.items()}
        self._cursors.clear()
        checkpoints = self.committed(list(work)) if work else {}
        for key, state in work.items():
            cp = checkpoints.get(key)
            if cp is not None and checkpoint_applies(cp, state.ranges):
                state.ranges.remove(cp.start, cp.offset)
            state.child_delivered = None  # delivered but uncommitted: deliver again
            self.start(key, state)
