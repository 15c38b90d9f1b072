"""Records in: poll()/consume() merge the primary's fresh stream and the child's backlog,
and what the primary handed out is read off its position when a commit needs it.

**The hot path.** While no range is being read, no run waits for its first record, no
partition waits to be planned and no auto-commit is due (every call in steady state),
``poll()`` and ``consume()`` are the primary's own calls behind one flag, ``steady``: no
clock is read (the auto-commit timer clears the flag from its thread). ``poll()`` takes a
queued record with ``poll(0)`` before it looks at the timeout; a wait is cut into slices,
so that a catch-up started by a rebalance inside it is served at once.

**Merging.** Off the hot path the primary comes first (fresh records keep steady-state
latency), but at least one record in ``CHILD_SHARE`` comes from the child while it has
records; once the primary is behind the live end too, the backlog leads instead (see
``_lead``). A ``consume()`` makes one call on the primary, then one on the child, and returns:
a record is never held while another call that could run a rebalance callback is made.

Thread ownership: the primary and child handles are the user's thread's (see
``_consumer``); ``steady`` and ``due`` are also written by the auto-commit timer's thread
(bool stores that only ever send the next call down the slow path), and the in-transit
counter by an asyncio wrapper's event loop thread (under its lock).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as _RdConsumer

from ._arguments import timeout_s
from ._child import Child
from ._config import ParallelConfig
from ._lead import CHILD_SHARE, Lead
from ._partitions import Assigned, Key, Partitions
from ._routing import UNKNOWN_START, Claim, Run

__all__ = ["CHILD_SHARE", "Cut", "Delivery"]

log = logging.getLogger("fastrebalance.consumer")

#: Records the primary's consume() returned that are kept for a revoke inside a later
#: consume() (see ``credit_returned``) before the primary's position is read instead.
_RETURNED_MAX = 4096
#: Records of the recent calls kept to place a committed record in delivery order (and
#: always the latest call's, however many): a commit of an older one claims its own
#: stream alone.
_WINDOW = 4096
#: Longest single wait on the primary while the child may have records, seconds.
_SLICE_S = 0.01
#: Longest single wait on the primary when the child is idle: a rebalance inside
#: that wait may start a catch-up, which must not wait for the user's whole timeout.
IDLE_SLICE_S = 0.2


def _after_a_slice(timeout: float) -> float:
    """What is left of a timeout once a whole idle slice went by with nothing.

    librdkafka's poll()/consume() come back empty only when their timeout is over (or
    when a callback yields, earlier): so at most this much is left, never more, and the
    hot path reads no clock to know it."""
    return timeout if timeout < 0 else max(timeout - IDLE_SLICE_S, 0.0)


def _transit_entries(got: Any) -> list[tuple[str, int, int]]:
    msgs = got if isinstance(got, list) else () if got is None else (got,)
    return [(m.topic(), m.partition(), m.offset()) for m in msgs if m.error() is None]


def hot_poll(self: Any, timeout: float = -1.0) -> Message | None:
    """One record or event, fresh first; at least 1 in CHILD_SHARE from the backlog. None
    of a partition revoked inside the call, as from ``consume()``.

    ``timeout`` in seconds, negative: no limit (confluent-kafka's default; ``None`` is a
    ``TypeError`` there and here)."""
    # ``Consumer.poll`` itself, and ``Delivery.poll``: the hot path in the one frame the
    # facade's call makes (see the module docstring). ``self`` is the facade (its ``_hot``:
    # this Delivery with the mode on, None with it off or once closed) or the Delivery.
    d: Delivery | None = self._hot
    if d is None:  # confluent-kafka's own poll(), which reads its arguments itself
        return self._reader.poll(timeout)  # type: ignore[no-any-return]
    # A timeout that is neither a float nor an int (a Decimal, or a mistake) is read as
    # confluent-kafka reads it, before any call: its TypeError, not a comparison's from
    # below, and never a record returned first. Two identity tests: no call for it.
    if timeout.__class__ is not float and timeout.__class__ is not int:
        timeout = timeout_s(timeout)
    if d.steady:
        m = d._primary_poll(0)
        if m is None:
            if not d.steady:  # a rebalance callback inside that call began a catch-up
                return d._poll_slow(timeout)
            if timeout is not None and 0 <= timeout <= IDLE_SLICE_S:
                m = d._primary_poll(timeout)
                if m is None:
                    return None
            else:
                m = d._primary_poll(IDLE_SLICE_S)
                if m is None:
                    return d._poll_slow(timeout if timeout is None else _after_a_slice(timeout))
        if d._p.revoked_in_call:  # a revoke served inside the call: m may be of it
            m = d._admit(m)
            if m is None:
                return d._poll_slow(timeout)
        # A rebalance callback inside the call may have begun a run of unknown start:
        # m may be its first record, which says where it starts.
        if d._p.unresolved:
            d._resolve([m])
        return m
    return d._poll_slow(timeout)


def hot_consume(self: Any, num_messages: int = 1, timeout: float = -1.0) -> list[Message]:
    """Up to ``num_messages`` records, fresh first, at least 1/CHILD_SHARE of a full batch
    from the backlog while it has records."""
    # As hot_poll: a batch is returned when it is full or a slice ends with records in it,
    # as the slow path does. The timeout is read as in poll(); confluent-kafka's own
    # consume() refuses a bad num_messages (its type first, as there: before the timeout's).
    d: Delivery | None = self._hot
    if d is None:
        return self._reader.consume(num_messages, timeout)  # type: ignore[no-any-return]
    if num_messages.__class__ is not int:
        num_messages = operator.index(num_messages)
    if timeout.__class__ is not float and timeout.__class__ is not int:
        timeout = timeout_s(timeout)
    if d.steady:
        if timeout is not None and 0 <= timeout <= IDLE_SLICE_S:
            return d._batch(num_messages, timeout)
        msgs = d._batch(num_messages, IDLE_SLICE_S)
        if msgs:
            return msgs
        if timeout is not None:
            timeout = _after_a_slice(timeout)
    return d._consume_slow(num_messages, timeout)


class Cut:
    """One partition when the calls moved onto the hot path: the child's records handed
    out before (``child``), and the primary's live ``run`` with its ``next`` then. A record
    of that run at or past ``next`` was handed out after every one of them."""

    __slots__ = ("child", "next", "run")

    def __init__(self, run: Run, nxt: int, child: list[Claim]) -> None:
        self.run = run
        self.next = nxt
        self.child = child


class Delivery:
    """poll()/consume() over both streams, and what each stream handed out."""

    def __init__(
        self,
        primary: _RdConsumer,
        child: Child,
        partitions: Partitions,
        settings: ParallelConfig,
        between_calls: Callable[[float], None],
    ) -> None:
        self._primary = primary
        self._primary_poll = primary.poll
        #: what hot_poll()/hot_consume() serve from: this Delivery (see hot_poll)
        self._hot = self
        self._child = child
        self._p = partitions
        self._settings = settings
        #: work done before each slice off the hot path (auto-commit, metrics, deferred
        #: plans), given the time
        self._between_calls = between_calls
        self._fair = 0
        #: which stream leads while the child reads (see ``_lead``)
        self._lead = Lead()
        # The child's partitions being read (its own dict, shared): empty in steady state.
        self._reading = child._cursors
        #: group-wide catch-up, when on: while it has work coming for the child, waits on
        #: the primary stay short (set by the facade)
        self.group: Any = None
        #: True while no range is being read, nothing waits and no auto-commit is due.
        #: Exactly-once stays off it: an abort goes back to the first record of a
        #: partition that never committed, and only the slow path sees every first record.
        self.steady = not (settings.transactional or settings.group_catchup)
        self.due = False
        #: True while librdkafka's position() may count records the application has not
        #: been handed: inside the primary's consume() (records collected for the batch),
        #: and while close() drains the last rebalance (records fetched, then dropped).
        self.untrusted_position = False
        # The batches the primary's consume() returned since its position was last read
        # outside one, and how many records they hold: inside the next consume() the
        # position also counts the batch being collected, and these say what the earlier
        # calls surely handed out (a reference per call on the hot path, no per-record work).
        self._returned: list[list[Message]] = []
        self._returned_n = 0
        # Records handed to a wrapper (fastrebalance.aio) that has not given them to the
        # application yet, counted per (topic, partition, offset): no bare commit claims
        # them. Added by the thread making the call, removed by the wrapper's event loop
        # thread: hence the lock.
        self._in_transit: Counter[tuple[str, int, int]] = Counter()
        self._transit_lock = threading.Lock()
        # Delivery order across streams, for commit(message=m) (see ``place``): the records
        # the recent calls off the hot path returned (a reference per call, never per
        # record; at least the latest call, at most _WINDOW records), how many calls were
        # recorded, and from which call on no hot call ran since (hot calls hand out the
        # primary's records only, so they never add to the other streams).
        self._calls: deque[tuple[Message, ...]] = deque()
        self._window = 0
        self._ncalls = 0
        self._hot_from = 0
        #: per partition, the child's records handed out before the last move onto the
        #: hot path, and where the primary's live run was then (see ``Cut``)
        self.cuts: dict[Key, Cut] = {}
        #: called once with the primary's fatal error when a call of the slow path meets it
        #: (set by the facade, which then stops both streams but the primary's own)
        self.on_fatal: Callable[[KafkaError], None] | None = None

    # -- the hot-path flag ----------------------------------------------------------------
    def mark_due(self) -> None:
        # the auto-commit timer's thread: two bool stores, in this order (see recheck)
        self.due = True
        self.steady = False

    def recheck(self) -> None:
        """Whether the next call may take the hot path (this thread, after anything that
        may start or end a catch-up). ``steady`` is written before ``due`` is read, so a
        timer firing meanwhile always leaves it False."""
        p = self._p
        s = self._settings
        was = self.steady
        self.steady = not (
            self._reading or p.unresolved or p.deferred or s.transactional or s.group_catchup
        )
        if self.due:
            self.steady = False
        if self.steady and not was:
            self._cut()

    def _cut(self) -> None:
        """The next calls may take the hot path, which records nothing: remember what the
        child handed out so far, and where each primary run is, so that a commit of a
        record the primary hands out from here can still claim the backlog before it."""
        self._hot_from = self._ncalls
        assigned = self._p.assigned
        keys = [k for k, a in assigned.items() if any(r.next > r.start for r in a.epoch.child)]
        old, self.cuts = self.cuts, {}
        if not keys:
            return
        self.observe(keys)
        for key in keys:
            epoch = assigned[key].epoch
            live = epoch.live
            if live.start == UNKNOWN_START:
                continue
            child = [c for c in epoch.handed_claims() if c.child]
            before = old.get(key)
            if before is not None and before.run is live and before.child == child:
                # nothing handed out by the child since the earlier move (the auto-commit
                # takes a call off the hot path every interval): the earlier point stands,
                # or a record handed out since it would lose the backlog before it
                self.cuts[key] = before
                continue
            self.cuts[key] = Cut(live, live.next, child)

    def _handed(self, msgs: list[Message]) -> None:
        """A call off the hot path returns ``msgs`` (never empty). Entered from the hot
        path (``steady``), more hot calls may follow it unrecorded."""
        calls = self._calls
        calls.append(tuple(msgs))  # the caller's list is theirs to change
        self._window += len(msgs)
        self._ncalls += 1
        while self._window > _WINDOW and len(calls) > 1:
            self._window -= len(calls.popleft())
        if self.steady:
            self._hot_from = self._ncalls

    def place(
        self, key: Key, offset: int, message: Message | None = None
    ) -> tuple[list[int], bool, bool] | None:
        """Where a record stands in delivery order, if a recent call off the hot path
        returned it (else None): the offsets of ``key``'s records returned after it (by
        that call and the later ones), whether no hot call ran since, and whether it is
        ``message`` itself (else the record at ``offset``, which may have been delivered
        before too). Everything the child handed out of ``key`` so far came before it but
        for those (the hot path hands out the primary's records only); so did everything
        the primary handed out, if no hot call ran since."""
        topic, partition = key
        found = None
        if message is not None:
            found = self._find(key, lambda m: m is message)
        itself = found is not None
        if found is None:
            found = self._find(
                key,
                lambda m: m.offset() == offset and m.partition() == partition
                and m.topic() == topic,
            )  # fmt: skip
        if found is None:
            return None
        number, after = found
        return after, number >= self._hot_from, itself

    def _find(
        self, key: Key, match: Callable[[Message], bool]
    ) -> tuple[int, list[int]] | None:
        """The newest recorded call that returned a record ``match`` accepts (its number)
        and the offsets of ``key``'s records returned after that record."""
        topic, partition = key
        later: list[int] = []
        calls = self._calls
        for back in range(len(calls)):
            msgs = calls[-1 - back]
            at = next((i for i in range(len(msgs) - 1, -1, -1) if match(msgs[i])), None)
            mine = [
                (i, o)
                for i, x in enumerate(msgs)
                if x.partition() == partition and x.topic() == topic
                and (o := x.offset()) is not None
            ]  # fmt: skip
            if at is None:
                later += [o for _, o in mine]
                continue
            return self._ncalls - 1 - back, [o for i, o in mine if i > at] + later
        return None

    # -- poll() ---------------------------------------------------------------------------
    poll = hot_poll

    def _poll_slow(self, timeout: float | None) -> Message | None:
        # Each step returns as soon as it has a record: a record is never held while
        # another call that may run a rebalance callback is made.
        try:
            return self._poll_slices(self._child, timeout)
        finally:
            self.recheck()

    def _poll_slices(self, child: Child, timeout: float | None) -> Message | None:
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            self._between_calls(now)
            if child.active:
                lead = self._lead
                if self._fair >= CHILD_SHARE or (lead.behind and lead.backlog_first()):
                    got = child.consume(1)
                    lead.polled_child(bool(got))
                    if got:
                        self._fair = 0
                        self._handed(got)
                        return got[0]
                m = self._admit(self._primary.poll(0))
                lead.polled_primary(m is not None)
                if m is not None:
                    self._fair += 1
                    if self._p.unresolved:
                        self._resolve([m])
                    self._handed([m])
                    return m
                got = child.consume(1)  # the primary ran dry: fresh records lead again
                if got:
                    self._fair = 0
                    self._handed(got)
                    return got[0]
                wait = self._slice(deadline, _SLICE_S)
            else:
                wait = self._slice(deadline, self._idle_slice())
            if wait is None:
                return None
            m = self._admit(self._primary.poll(wait))
            if m is not None:
                self._fair += 1
                if self._p.unresolved:
                    self._resolve([m])
                self._handed([m])
                return m
            now = time.monotonic()

    # -- consume() ------------------------------------------------------------------------
    consume = hot_consume

    def _batch(self, num: int, timeout: float) -> list[Message]:
        """The primary's consume(). A rebalance callback inside it sees a position()
        that counts records collected for this batch, so it must not trust it; records
        of partitions revoked inside it are not returned (the new owner reads them)."""
        self.untrusted_position = True
        try:
            msgs = self._primary.consume(num, timeout)
        finally:
            self.untrusted_position = False
        p = self._p
        if p.revoked_in_call:
            gone, p.revoked_in_call = p.revoked_in_call, set()
            msgs = [m for m in msgs if (m.topic(), m.partition()) not in gone]
        if p.deferred:
            msgs = [m for m in msgs if (m.topic(), m.partition()) not in p.deferred]
        if p.unresolved:
            self._resolve(msgs)
        if msgs:
            self._returned.append(msgs)
            self._returned_n += len(msgs)
            if self._returned_n > _RETURNED_MAX:
                # outside the call the position is exact: it covers every batch kept
                self.observe(list(p.assigned))
                self._returned, self._returned_n = [], 0
        return msgs

    def credit_returned(self) -> None:
        """Record in the live runs what earlier consume() calls returned, then forget them.

        Needed where the position cannot say it (a revoke served inside a later consume():
        the position there counts the batch being collected too, so it only widens a run,
        and a bare commit in on_revoke claimed nothing the previous calls had returned:
        the next owner delivered those records again), and before a run changes (a seek,
        an assignment), so that no record is credited to a run that did not hand it out."""
        if not self._returned:
            return
        reached: dict[Key, int] = {}
        for batch in self._returned:
            for m in batch:
                topic, partition, offset = m.topic(), m.partition(), m.offset()
                if topic is None or partition is None or offset is None or m.error():
                    continue
                key = (topic, partition)
                reached[key] = max(reached.get(key, -1), offset + 1)
        self._returned, self._returned_n = [], 0
        for key, offset in reached.items():
            a = self._p.assigned.get(key)
            if a is None:
                continue
            live = a.epoch.live
            if live.start != UNKNOWN_START and live.start < offset:
                live.advance(offset)

    def _consume_slow(self, num: int, timeout: float | None) -> list[Message]:
        if not isinstance(num, int) or num < 1:
            # let confluent-kafka raise its own error for bad arguments
            return self._primary.consume(num, 0)
        try:
            return self._consume_slices(self._child, num, timeout)
        finally:
            self.recheck()

    def _consume_slices(self, child: Child, num: int, timeout: float | None) -> list[Message]:
        now = time.monotonic()
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            self._between_calls(now)
            if child.active:
                # One call on the primary (which may run a rebalance callback), then the
                # child's: never back to the primary while records are held for the batch.
                # Fresh records lead, unless the primary is behind the live end too.
                ask = self._lead.primary_ask(num, self._fair)
                fresh = self._batch(ask, 0) if ask > 0 else []
                if fresh and self.check_fatal(fresh):
                    return fresh  # nothing more of the child's: its reading stopped
                backlog = child.consume(num - len(fresh))
                self._lead.batched(ask, len(fresh), num - len(fresh), len(backlog))
                if backlog:
                    self._fair = 0
                elif fresh:
                    self._fair += 1
                if fresh or backlog:
                    msgs = fresh + backlog
                    self._handed(msgs)
                    return msgs
                wait = self._slice(deadline, _SLICE_S)
            else:
                wait = self._slice(deadline, self._idle_slice())
            if wait is None:
                return []
            msgs = self._batch(num, wait)
            if msgs:
                self.check_fatal(msgs)
                self._fair += 1
                self._handed(msgs)
                return msgs
            now = time.monotonic()

    # -- the primary's fatal error -----------------------------------------------------------
    def check_fatal(self, msgs: list[Message]) -> bool:
        """Whether the primary handed out its fatal error among ``msgs`` (``on_fatal`` is
        then told). librdkafka reports it as an error event from poll()/consume() (its
        error_cb is not called for it: measured with a static member fenced on Apache Kafka
        3.9), after which the primary hands out nothing and refuses every commit. The hot
        path does not look (a call per record): there the child reads nothing, so the
        primary's own stream is all there is, as on a plain consumer."""
        for m in msgs:
            err = m.error()
            if err is not None and err.code() == KafkaError._FATAL:
                if self.on_fatal is not None:
                    self.on_fatal(err)
                return True
        return False

    # -- records that are not handed out, or tell where a run starts ------------------------
    def _idle_slice(self) -> float:
        """Short while a chunk of a group-wide catch-up is coming, so it starts at once."""
        return _SLICE_S if self.group is not None and self.group.pending else IDLE_SLICE_S

    @staticmethod
    def _slice(deadline: float | None, wait: float) -> float | None:
        """How long the next wait on the primary may be: ``wait``, cut to the caller's
        deadline; None once it has passed."""
        if deadline is None:
            return wait
        remaining = deadline - time.monotonic()
        return None if remaining <= 0 else min(wait, remaining)

    def _admit(self, m: Message | None) -> Message | None:
        """A record of the primary's poll(), unless it belongs to a partition revoked
        inside that call (or since the last one), as ``_batch`` drops them from a
        consume(): the revoke committed what was handed out, the new owner reads on from
        there, and plain confluent-kafka hands out nothing of a partition after its revoke
        (librdkafka stops its fetch from its main thread, so one record fetched before
        could still come out of the same call: a record of a topic the member no longer
        subscribed to after ``subscribe()``, issue 45). Nor of a deferred partition (paused
        at once, so nothing should come; nothing of it is handed out until it is planned
        and sought)."""
        p = self._p
        if p.revoked_in_call:
            gone, p.revoked_in_call = p.revoked_in_call, set()
            if m is not None and (m.topic(), m.partition()) in gone:
                return None
        if m is not None and m.error() is not None:
            self.check_fatal([m])
        deferred = p.deferred
        if m is not None and deferred and (m.topic(), m.partition()) in deferred:
            return None
        return m

    def _resolve(self, msgs: list[Message]) -> None:
        """The first record of a run of unknown start is where it begins (see
        ``Epoch.resolve``)."""
        p = self._p
        for m in msgs:
            key = (m.topic(), m.partition())
            if key not in p.unresolved or m.error() is not None:
                continue
            offset = m.offset()
            a = p.assigned.get(key)
            if a is not None and offset is not None:
                a.epoch.resolve(offset)
                p.unresolved.discard(key)
        if not p.unresolved:
            self.recheck()

    # -- what the primary handed out --------------------------------------------------------
    def observe(self, keys: Iterable[Key], leaving: bool = False) -> None:
        """Record in each assigned partition's live primary run what librdkafka's position
        says the primary handed out (the hot path records nothing per record). Inside a
        consume() batch the position also counts records collected for the batch, so there
        it is only an upper bound of what was handed out. ``leaving``: the partition leaves
        the assignment, and librdkafka may already have forgotten its position (-1001 in a
        revoke callback): the run may then reach the log end it had fetched up to."""
        if self.untrusted_position:
            self.credit_returned()
        assigned = self._p.assigned
        keys = [k for k in keys if k in assigned]
        if not keys:
            return
        try:
            tps = self._primary.position([TopicPartition(*k) for k in keys])
        except (KafkaException, RuntimeError):
            tps = [TopicPartition(k[0], k[1], -1001) for k in keys]
            leaving = True
        for tp in tps:
            key = (tp.topic, tp.partition)
            a = assigned.get(key)
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
            if self.untrusted_position:
                live.widen(tp.offset)
            else:
                live.advance(tp.offset)

    def _reset_underneath(self, key: Key, a: Assigned, position: int) -> None:
        """The primary's position went back with no seek: librdkafka reset it because its
        offset left the log (the topic was deleted and recreated, the log truncated by an
        unclean leader election). The offsets it had handed out name records of a log that
        is gone; what the log holds now is unprocessed, from its start. So the ledger is
        rewound to it (the pending ranges, offsets of the old log, go too) and the
        primary's stream starts again where the reset put it: every claim from here is of
        the new log. Before this, commits kept the old log's position (400 on a log that
        now ended at 100): a restart skipped the next 300 records (adversary round 6)."""
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
        a.ledger.rewind(low)
        self._child.refresh(key)
        # where the reset put the primary: the log start with auto.offset.reset=earliest;
        # otherwise the log end then, which is not known here: from where it is now
        restart = low if self._settings.reset_offset == OFFSET_BEGINNING else position
        # A new epoch: what the old one's runs handed out (the child's backlog above all)
        # is of the log that is gone, and a bare commit claims what the current epoch
        # handed out (it claimed the old backlog [50, 400) on the new log). The old epoch
        # stays in the history, closed, so a late commit of one of its records claims no
        # more than every stream that may have handed out that offset agrees on.
        history = self._p.history[key]
        self.cuts.pop(key, None)  # its child records are the old log's too
        a.epoch = history.begin(restart, restart)
        a.epoch.live.advance(position)
        history.trim(a.epoch)

    def _fetched_up_to(self, key: Key) -> int | None:
        """An upper bound of what the primary fetched: the log end it last saw."""
        try:
            _, high = self._primary.get_watermark_offsets(TopicPartition(*key), cached=True)
        except (KafkaException, RuntimeError):
            return None
        return high if high >= 0 else None

    def note_stale_positions(self, keys: list[Key]) -> None:
        """Right after assign(), librdkafka's position() may still report where the
        partition's previous assignment had got to (seen with plain confluent-kafka too):
        nothing of the new assignment was handed out yet, so any position now is that
        one, and observing it later must not credit the new run with it."""
        try:
            tps = self._primary.position([TopicPartition(*k) for k in keys])
        except (KafkaException, RuntimeError):
            return
        for tp in tps:
            a = self._p.assigned.get((tp.topic, tp.partition))
            if a is not None and tp.offset >= 0:
                a.epoch.live.stale = tp.offset

    def seek(self, partition: TopicPartition) -> None:
        """Seek the primary; its stream starts a new run there."""
        key = (partition.topic, partition.partition)
        p = self._p
        if key in p.deferred:
            # Not planned yet: its commit logs could not be read. confluent-kafka's own
            # seek refuses a partition whose committed offset is still being fetched (the
            # fetch has not started): so does this one, rather than take effect later.
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"Failed to seek to offset {partition.offset}: Local: Erroneous state",
                )
            )
        a = p.assigned.get(key)
        if a is not None:
            self.credit_returned()
            self.observe([key])
        self._primary.seek(partition)
        if a is None:
            return
        offset = partition.offset
        if offset < 0:
            low, high = -1, -1
            with contextlib.suppress(KafkaException):
                low, high = self._primary.get_watermark_offsets(TopicPartition(*key), cached=True)
            if offset == -1:  # OFFSET_END
                offset = max(high, a.epoch.floor)
            elif offset == OFFSET_BEGINNING:
                offset = max(low, 0)  # a low mark only rises: never above the real start
            else:
                # where librdkafka lands is not known here: the run starts at its first
                # record (a guess, such as F, could credit it with the child's backlog)
                offset = UNKNOWN_START
        a.epoch.seek(offset)
        p.history[key].trim(a.epoch)
        if a.epoch.unresolved:
            p.unresolved.add(key)
            self.recheck()

    # -- records handed to a wrapper (fastrebalance.aio) ---------------------------------------
    def hand(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """poll() or consume() for a wrapper that hands the records on later (the asyncio
        twin, whose awaiting caller may be cancelled meanwhile): until ``received()``
        says the application has them, no bare commit or auto-commit claims them."""
        got = call(*args, **kwargs)
        entries = _transit_entries(got)
        if entries:
            with self._transit_lock:
                self._in_transit.update(entries)
        return got

    def received(self, got: Any) -> None:
        """The application has the records ``hand()`` returned (any thread)."""
        entries = _transit_entries(got)
        if entries:
            with self._transit_lock:
                self._in_transit.subtract(entries)
                for entry in entries:
                    if self._in_transit[entry] <= 0:
                        del self._in_transit[entry]

    def transit_limits(self) -> dict[Key, int]:
        """Per partition, the lowest offset handed to a wrapper but not yet received."""
        limits: dict[Key, int] = {}
        if self._in_transit:
            with self._transit_lock:
                for topic, partition, offset in self._in_transit:
                    key = (topic, partition)
                    limits[key] = min(offset, limits.get(key, offset))
        return limits
