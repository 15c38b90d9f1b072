"""Group-wide catch-up: every member's child reads chunks of any partition's backlog.

With ``parallel.rebalance.group.catchup=true`` a member plays two parts, both driven from
``poll()``/``consume()`` (``tick``), never from a thread of its own:

* **Owner** of a partition it planned with a backlog: it does not hand the backlog to its
  child. It cuts the pending ranges into chunks and *offers* them on the claims log. When
  the log says a chunk is *done* (its holder's application committed every record of it),
  the chunk leaves the owner's ledger, and the group's offset and token move past it with
  the next write (made at once, asynchronously: ``write_group``). Until then the chunk
  stays pending in the owner's token: whoever dies, it is read again.
* **Helper** (every member, the owner included): it claims free chunks of any partition,
  and once the log says it won one, its child reads exactly ``[start, end)`` and hands the
  records to this member's ``poll()``/``consume()``. A helper cannot commit a partition it
  does not own into the group (that would overwrite the owner's offset and token), so what
  its application commits of a chunk is kept here, in a ledger of its own per partition
  (``_Helped``), attributed by the child's runs exactly as the core attributes backlog
  records (``_routing``). When a chunk has no offset left in that ledger, the helper
  appends *done*.

Safety: an offset leaves the owner's ledger only by a *done* the log accepted, which only
the chunk's holder sends, after its application committed every offset of the chunk. A
member that dies stops heartbeating: its chunks become free after the claim timeout (log
time) and are claimed and read again (records delivered twice only after a crash).

Lineage: a *done* is true of the backlog it was written for, not of the same offsets read
again later (an operator's reset to the earliest offset, a group made again under the same
id: the grid cuts them into the same chunks). So every backlog has a lineage, a random name
the owner draws when its plan made offsets pending that the group's token did not hold
(``_planning``), carried by the group's token (``~fr2``) to the next owner, and by every
offer, claim, done and release. An owner absorbs only its own lineage's done chunks, and
an offer in a new lineage starts a chunk afresh. The cost: a new lineage reads again the
chunks done but not yet absorbed, and takes over the chunks in flight (after a crash that
left a new backlog above the old one): records delivered twice, never skipped.

Thread ownership: everything here, and the claims log's handles (``_claimslog``), belongs
to the thread that calls the facade (the user's thread), like the primary and the child.
"""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaException, Message

from ._child import Child
from ._claims import ChunkKey, ClaimRecord, ClaimsState, cut_chunks
from ._claimslog import ClaimsLog, permanent
from ._commits import Change, apply_change
from ._config import CLAIMS_TOPIC_KEY, ParallelConfig
from ._ledger import Ledger
from ._orphans import absorb_orphans
from ._ranges import RangeSet
from ._routing import UNKNOWN_START, Claim, History, Run

__all__ = ["GroupCatchup"]

log = logging.getLogger("fastrebalance.group")

Key = tuple[str, int]
#: A helper ledger's position: nothing of the partition is the helper's above its chunks.
_NOWHERE = UNKNOWN_START
#: How often the claims log is read and acted on from the poll path, at most, while a
#: claim is in flight (its answer starts the child's next chunk) ...
TICK_S = 0.02
#: ... and otherwise: each tick costs a read of the log and a producer poll (0.8 ms), 3 %
#: of the poll path at 50 ticks a second while the child reads a chain.
IDLE_TICK_S = 0.1
#: Chunks a member holds ahead of the one its child reads: the next is claimed while the
#: current one is read, so the claim's round trip is hidden.
PREFETCH = 2
#: ... and at least this many records ahead: a small chunk (1,000 records, 50 ms of work)
#: was read before the claim of the next came back, the child ran dry and started the
#: next one afresh (~110 ms each: 5.97 s against 2.68 s for 50,000 records). Not more:
#: what one member holds ahead, the others cannot help with.
PREFETCH_RECORDS = 5_000
#: A claim not seen back in the log after this long is given up (its record was lost).
_CLAIM_GIVE_UP_S = 10.0
#: A group commit carrying a new lineage not confirmed after this long is written again.
_ANNOUNCE_RETRY_S = 5.0
_ANNOUNCE_GIVE_UP_S = 15.0
#: Chunks per offer record.
_OFFER_BATCH = 200
#: Chunks among which a claim picks at random (members picking the same chunk race).
_PICK_AMONG = 8
#: A claims log that cannot be started (or made again) for this long, for a reason that
#: could pass (a broker down, no leader yet), is given up like one that cannot be used at
#: all: the member falls back to reading its own backlogs (``_fall_back``). Long enough
#: for a broker restart or a leader election; the backlog waits no longer than that.
START_GIVE_UP_S = 30.0


class _Helped:
    """One partition as a helper sees it: the chunks it holds and what its application
    committed of them, the child's runs (what was handed out), and the reading queue."""

    __slots__ = (
        "chain", "cursor", "epoch", "history", "ledger", "queue", "rewound", "runs", "staged",
    )  # fmt: skip

    def __init__(self) -> None:
        #: U = the held chunks' offsets not yet committed (position: nowhere)
        self.ledger = Ledger(_NOWHERE)
        self.history = History()
        self.epoch = self.history.begin(_NOWHERE, _NOWHERE)
        self.queue: list[ChunkKey] = []  #: won, not read yet
        #: the chunks the child reads in one go, in order, each starting where the one
        #: before ends: their pending offsets are the child's ledger (``cursor``)
        self.chain: list[ChunkKey] = []
        self.cursor: Ledger | None = None
        self.runs: dict[ChunkKey, Run] = {}  #: the child run that read each chunk
        self.staged: list[Claim] = []  #: store_offsets() of its records, for the next commit
        #: offsets the child handed out before a seek back below them (``seek_back``): no
        #: run claims them any more, but a late commit of one of those records is still a
        #: chunk record's (it claims itself alone), never a write into the group
        self.rewound = RangeSet()


class GroupCatchup:
    """This member's part in the group-wide catch-up (owner and helper)."""

    def __init__(
        self,
        settings: ParallelConfig,
        conf: dict[str, Any],
        child: Child,
        member: str | None = None,
    ) -> None:
        self.member = member or uuid.uuid4().hex[:12]
        self._settings = settings
        self._conf = conf
        self._log = ClaimsLog(conf, settings.claims_topic)
        self._state = ClaimsState(settings.claim_timeout_ms)
        self._child = child
        self._chunk = settings.chunk_records
        self._prefetch = max(PREFETCH, -(-PREFETCH_RECORDS // self._chunk))
        self._hb_every_s = settings.claim_timeout_ms / 3000.0
        self._helped: dict[Key, _Helped] = {}
        self._held: set[ChunkKey] = set()
        #: the lineage each held chunk was won in: its done and release name it
        self._held_lineage: dict[ChunkKey, str] = {}
        #: claims sent, not read back yet, and when each was sent: as many as the chunks
        #: ahead allow go out in one tick (one at a time, a member reading with 200 ms of
        #: work per poll won one 500-record chunk per poll: its chains ran dry)
        self._claims_out: dict[ChunkKey, float] = {}
        self._owned: dict[Key, Ledger] = {}
        #: per owned partition: the lineage and the ranges offered in it, not read back yet
        self._offering: dict[Key, tuple[str, RangeSet]] = {}
        self._absorb_due = False
        #: owned partitions whose lineage was just drawn: the group's token carries it
        #: (``write_group``) before their chunks are offered, so that the next owner (a
        #: rebalance moved the partition, this member crashed) inherits it and with it the
        #: chunks done meanwhile, rather than offering them all again in a lineage of its
        #: own (3 members then read 44,000-53,000 records of a 30,000 backlog: a rebalance
        #: moved it before the first commit)
        self._announce: set[Key] = set()
        #: ... written, not yet confirmed by the broker (``group_committed``): when first
        #: and last written
        self._announced: dict[Key, tuple[float, float]] = {}
        self._last_sent = 0.0
        self._next_tick = 0.0
        self._start_at = 0.0
        self._start_tries = 0
        #: when the claims log first failed to start (or be made again), None meanwhile
        self._failing_since: float | None = None
        #: why group-wide catch-up was given up for this member's life (the claims topic
        #: cannot be used): its backlogs are then read by its own child, as with it off
        self.unusable: str | None = None
        self._closed = False
        #: False after unsubscribe() (until subscribe()): no chunk is claimed or read
        self.helping = True
        #: the topics this member reads: subscribe()'s names and patterns, else (assign())
        #: those of its assignment; chunks of any other topic are never claimed (a member
        #: subscribed to Y was handed 50,000 records of X, which only another member reads)
        self._names: frozenset[str] = frozenset()
        self._patterns: tuple[str, ...] = ()
        self._subscribed = False
        self.assigned_topics: Callable[[], Iterable[str]] = lambda: ()
        #: the application paused every partition of its assignment (``hold_off``)
        self._held_off = False
        #: whether every partition assigned to this member is paused by the application
        #: (True for an empty assignment); set by the facade
        self.assignment_paused: Callable[[], bool] = lambda: False
        #: pieces this member offered, claimed and declared done at once (``_hand_back``)
        self._handed_back: set[ChunkKey] = set()
        #: chunks offered by this tick: claimable at once (the log takes the claim after
        #: the offer: it wins), not a round trip later, once the offer is read back
        self._offered_now: list[tuple[ChunkKey, str]] = []
        #: partitions this member declared chunks of done (as a helper)
        self._done_sent: set[Key] = set()
        #: at close(): the done pieces, per lineage, of partitions this member helped with
        #: but did not own, for ``absorb_orphans`` once it has left the group
        self.orphans: dict[Key, dict[str, list[tuple[int, int]]]] = {}
        #: writes the group's offset and token of partitions whose ledger a done changed
        self.write_group: Callable[[list[Key]], None] = lambda keys: None
        #: hands owned partitions to this member's child, to read their backlogs alone
        self.read_alone: Callable[[list[Key]], None] = lambda keys: None
        # counters (metrics)
        self.chunks_won = 0
        self.chunks_done = 0
        self.chunks_lost = 0
        self.claims_lost = 0
        self.chunks_offered = 0
        self.chunks_absorbed = 0

    def subscribed(self, topics: Sequence[str]) -> None:
        """subscribe(): the names and librdkafka's patterns (``^``...) this member reads."""
        self._names = frozenset(t for t in topics if not t.startswith("^"))
        self._patterns = tuple(t for t in topics if t.startswith("^"))
        self._subscribed = True
        self.helping = self.unusable is None
        # chunks of topics it no longer reads go back (issue 45: after subscribe([Y]) a
        # member went on handing out 8,000 records of X's chunks within 0.6 s)
        gone = sorted(ck for ck in self._held if not self._reads(ck[0]))
        if gone:
            self._give_back(gone, "the member's subscription changed")
        if self.unusable is None and (
            self._log.topic in self._names or _may_match(self._patterns, self._log.topic)
        ):
            # the application reads it: claims records would be handed to its code (a
            # pattern ^pta.* was handed 45 of them, adversary of issue 48), and its
            # records would be read as claims
            self._fall_back(f"claims topic {self._log.topic} is a topic this member subscribes to")

    def _reads(self, topic: str) -> bool:
        """A named topic, or (a pattern subscription, or none) one of the assignment's:
        librdkafka matches patterns with its own regex dialect (``\\d`` is a literal d
        there), so only a topic it assigned this member is known to match; Python's ``re``
        handed a member ``^x\\d`` 17,000 records of x1, which librdkafka never gave it."""
        if self._subscribed and topic in self._names:
            return True
        if self._subscribed and not self._patterns:
            return False
        return topic in set(self.assigned_topics())

    # -- the owner's part ---------------------------------------------------------------------
    def own(self, work: Iterable[tuple[Key, Ledger]]) -> None:
        """Partitions this member planned with a backlog: offer it instead of reading it
        (or read it alone, once the claims topic was found unusable)."""
        if self.unusable is not None:
            self.read_alone([key for key, _ in work])
            return
        for key, ledger in work:
            if not ledger.lineage:
                _lineage(ledger)
                self._announce.add(key)
            self._owned[key] = ledger
            self._absorb_due = True
        self._next_tick = 0.0

    def disown(self, keys: Iterable[Key]) -> None:
        """Partitions that left this member: their next owner offers and absorbs. The
        chunks this member holds of them stay its own (it helps whoever owns them)."""
        for k in keys:
            self._owned.pop(k, None)
            self._offering.pop(k, None)
            self._announce.discard(k)
            self._announced.pop(k, None)

    def _absorb(self) -> None:
        """Done chunks leave the owners' ledgers; the group's offset moves past them."""
        self._absorb_due = False
        changed = []
        for key, ledger in self._owned.items():
            if not ledger.ranges or ledger.position is None:
                continue
            done = self._state.done(*key, ledger.lineage)
            hit = False
            for s, e in done:
                if e <= ledger.position and ledger.ranges.last_overlapping(s, e) is not None:
                    ledger.ranges.remove(s, e)
                    self.chunks_absorbed += 1
                    hit = True
            if hit:
                changed.append(key)
        if changed:
            self.write_group(changed)

    def _announce_lineages(self, now: float) -> None:
        """Write the group's token of partitions with a new lineage; again if the broker
        has not confirmed it within ``_ANNOUNCE_RETRY_S`` (a write lost in a rebalance).
        Past ``_ANNOUNCE_GIVE_UP_S`` the chunks are offered all the same: safe, only a
        next owner that does not find the lineage reads them again."""
        for k, (first, _) in list(self._announced.items()):
            if now - first > _ANNOUNCE_GIVE_UP_S:
                del self._announced[k]
                log.info("%s [%d]: the group's commit of a new backlog lineage was not "
                         "confirmed: offering its chunks all the same", *k)  # fmt: skip
        again = [k for k, (_, last) in self._announced.items() if now - last > _ANNOUNCE_RETRY_S]
        new = [k for k in self._announce if k in self._owned]
        self._announce.clear()
        if not again and not new:
            return
        for k in new:
            self._announced[k] = (now, now)
        for k in again:
            self._announced[k] = (self._announced[k][0], now)
        self.write_group(sorted({*again, *new}))

    def group_committed(self, keys: Iterable[Key]) -> None:
        """The broker took a group commit of these partitions (librdkafka's on_commit):
        it carried their ledgers' lineage, so their chunks may be offered now."""
        for k in keys:
            if self._announced.pop(k, None) is not None:
                self._next_tick = 0.0

    def _offer(self) -> None:
        """Offer what each owned ledger holds pending that no chunk covers yet."""
        for key, ledger in self._owned.items():
            if not ledger.lineage:  # rewound since: a new lineage, announced first
                _lineage(ledger)
                self._announce.add(key)
                continue
            if key in self._announce or key in self._announced:
                continue  # not in the group's token yet
            lineage = ledger.lineage
            was = self._offering.get(key)
            if was is None or was[0] != lineage:
                was = self._offering[key] = (lineage, RangeSet())
            offering = was[1]
            known = self._state.known(*key, lineage)
            for s, e in known:
                offering.remove(s, e)
            if not ledger.ranges:
                continue
            todo = ledger.ranges.copy()
            for s, e in known:
                todo.remove(s, e)
            for s, e in offering:
                todo.remove(s, e)
            if not todo:
                continue
            chunks = cut_chunks(todo, self._chunk)
            for i in range(0, len(chunks), _OFFER_BATCH):
                batch = tuple(chunks[i : i + _OFFER_BATCH])
                self._send(ClaimRecord("offer", self.member, key[0], key[1], batch, lineage))
            for s, e in chunks:
                offering.add(s, e)
                self._offered_now.append(((key[0], key[1], s, e), lineage))
            self.chunks_offered += len(chunks)
            log.info("%s [%d]: offered %d chunks of its backlog to the group", *key, len(chunks))

    # -- the poll path ------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Read the claims log and act on it (from poll()/consume(), at most every TICK_S)."""
        if self._closed or self.unusable is not None:
            return
        if now < self._next_tick and not self._chunk_read():
            return
        self._next_tick = now + IDLE_TICK_S
        if not self._log.started:
            if now < self._start_at:
                return
            try:
                self._log.start()
                self._failing_since = None
            except (KafkaException, RuntimeError) as exc:
                if self._failed(now, exc, "started"):
                    return
                # a topic just created has no leader for a moment (NOT_LEADER_FOR_PARTITION
                # on Apache Kafka 3.9): retry soon, then less often
                self._start_tries += 1
                wait = min(0.1 * 2**self._start_tries, 2.0)
                level = logging.WARNING if wait >= 2.0 else logging.INFO
                log.log(level, "claims log %s not available yet (%s): retrying in %.1fs",
                        self._log.topic, exc, wait)  # fmt: skip
                self._start_at = now + wait
                return
        self._read()
        if self._log.missing:
            try:
                self._log.reopen()
                self._failing_since = None
            except (KafkaException, RuntimeError) as exc:
                if self._failed(now, exc, "made again"):
                    return
                log.warning("claims log %s could not be made again (%s): retrying in 2s",
                            self._log.topic, exc)  # fmt: skip
                self._next_tick = now + 2.0
            return
        if not self._log.caught_up:
            return  # act only on a current state
        for ck, sent in list(self._claims_out.items()):
            if now - sent > _CLAIM_GIVE_UP_S:
                del self._claims_out[ck]
        self._check_lost()
        if self._absorb_due:
            self._absorb()
        self._announce_lineages(now)
        self._offer()
        self._advance_reading()
        self._favour()
        self._finish_tails()
        self._maybe_claim(now)
        if self._claims_out:
            self._next_tick = now + TICK_S
        if now - self._last_sent >= self._hb_every_s and (
            self._held or self._state.open_chunks() or self._claims_out
        ):
            self._send(ClaimRecord("hb", self.member))

    def _failed(self, now: float, exc: BaseException, what: str) -> bool:
        """The claims log could not be ``what``: True if that is the end of group-wide
        catch-up for this member (a reason that will not pass, or START_GIVE_UP_S of
        failures), which then falls back."""
        if self._failing_since is None:
            self._failing_since = now
        if permanent(exc):
            why = f"claims topic {self._log.topic} cannot be {what}: {exc}"
        elif now - self._failing_since >= START_GIVE_UP_S:
            why = (
                f"claims topic {self._log.topic} could not be {what} for "
                f"{now - self._failing_since:.0f}s: {exc}"
            )
        else:
            return False
        self._fall_back(why)
        return True

    def _fall_back(self, why: str) -> None:
        """Give group-wide catch-up up for this member's life: what it owns is read by its
        own child (KIP-333's catch-up, as with group catch-up off) and it helps nobody.
        Before, a claims topic Kafka refused (a name that collides with another group's)
        had the backlog wait for ever behind a WARNING every 2 s (issue 48: 0 of 20,000
        records in 20 s). Safe whatever was offered before: the owner's ledger keeps every
        offset no ``done`` took out, and its child reads them all; a helper that held a
        chunk commits nothing of it into the group (it owns none of the partition)."""
        self.unusable = why
        self.helping = False
        log.error("group-wide catch-up is off for this member: %s. Its backlogs are read by "
                  "its own catch-up consumer instead (as with parallel.rebalance.group."
                  "catchup=false). Check the topic's name, ACLs and the broker, or set %s",
                  why, CLAIMS_TOPIC_KEY)  # fmt: skip
        for ck in sorted(self._held):
            self._drop(ck, "given up: group-wide catch-up is off", lost=False)
        self._claims_out.clear()
        self._child.favour(())
        owned = list(self._owned)
        self._owned.clear()
        self._offering.clear()
        self._announce.clear()
        self._announced.clear()
        if self._log.started:
            self._log.close(1.0)
        if owned:
            self.read_alone(owned)

    def _chunk_read(self) -> bool:
        """The child read a chunk to its end: the next one starts at once (not a tick
        later, not after an idle wait on the primary)."""
        child = self._child
        return any(
            h.chain and _passed(child.position(k), h.chain[0]) for k, h in self._helped.items()
        )

    @property
    def pending(self) -> bool:
        """Work is coming for the child (a chunk won and waiting, a claim in flight, a
        backlog whose chunks are offered once the broker confirms the group commit of its
        lineage): the poll path must not wait idle on the primary meanwhile. The
        confirmation comes through on_commit inside a wait on the primary, which then
        went on for the rest of its idle slice: the first offer came 0.1 s after it on
        Apache Kafka 3.9 (groupbench, 100 fresh records/s)."""
        return (
            bool(self._claims_out)
            or bool(self._announced)
            or any(h.queue for h in self._helped.values())
        )

    def settle(self, timeout_s: float) -> None:
        """Before partitions this member owns leave it (close(), a revoke): read the claims
        log to its end, this member's own last done records included, and absorb the done
        chunks, so that the group's offset written on the way out is past them, as a plain
        consumer's is past what it processed and committed. Without it nobody absorbed
        them: a member that committed every record and closed left the group's offset at
        0 with 30,000 records processed (a restart and every lag monitor saw the whole
        backlog again). Bounded by ``timeout_s``; what it cannot read in time stays
        pending (safe: those chunks are offered and read again)."""
        if self._closed or not self._log.started or self.unusable is not None:
            return
        for key, h in self._helped.items():
            self._mark_read(key, h)
        self._finish_tails()  # done records of chunks the application finished
        if not any(ledger.ranges for ledger in self._owned.values()):
            return
        if self._read_to_end(timeout_s):
            self._absorb()

    def _read_to_end(self, timeout_s: float) -> bool:
        """Flush this member's records and read the log to its end, within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._log.flush(timeout_s)
        end = self._log.end(deadline - time.monotonic())
        if end is None:
            return False
        while self._log.position < end:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("claims log %s: not read to its end in %.1fs: done chunks stay "
                            "pending in the group's offset", self._log.topic,
                            timeout_s)  # fmt: skip
                return False
            self._read(min(left, 0.1))
        self._log.caught_up = True
        return True

    def _read(self, wait_s: float = 0.0) -> None:
        state = self._state
        while True:
            got = self._log.read(wait_s=wait_s)
            wait_s = 0.0
            for rec, ts in got:
                state.apply(rec, ts)
                if rec is None:
                    continue
                if rec.kind == "done":
                    self._absorb_due = True
                elif rec.kind == "claim" and rec.member == self.member:
                    key = (rec.topic, rec.partition, *rec.chunks[0])
                    if key in self._handed_back:
                        continue  # its done follows: nothing to read
                    won = (
                        state.last_holder(key) == self.member
                        and state.lineage(key) == rec.lineage
                        and key not in self._held
                    )
                    if won and (
                        not (self.helping and self._reads(key[0])) or self._overlaps_held(key)
                    ):
                        # unsubscribed, or a subscription that left the topic, since; or
                        # another lineage's chunk of offsets this member reads already
                        # (holding both, one's commits would finish the other)
                        self._send(
                            ClaimRecord("release", self.member, *key[:2], (key[2:],), rec.lineage)
                        )
                        won = False
                    elif won:
                        # also a claim given up on (_CLAIM_GIVE_UP_S) that the log took
                        # after all: the log names this member, so it must read the chunk
                        # (ignored, it stayed held for ever by a live member: repro/r09)
                        self._won(key, rec.lineage)
                    if self._claims_out.pop(key, None) is not None and not won:
                        self.claims_lost += 1
            if len(got) < 1000:
                return

    def _send(self, rec: ClaimRecord) -> None:
        self._log.send(rec)
        self._last_sent = time.monotonic()

    # -- the helper's part ----------------------------------------------------------------------
    def _overlaps_held(self, ck: ChunkKey) -> bool:
        return any(h[:2] == ck[:2] and h[2] < ck[3] and ck[2] < h[3] for h in self._held if h != ck)

    def _won(self, ck: ChunkKey, lineage: str) -> None:
        key: Key = (ck[0], ck[1])
        h = self._helped.get(key)
        if h is None:
            h = self._helped[key] = _Helped()
        self._held.add(ck)
        self._held_lineage[ck] = lineage
        h.ledger.ranges.add(ck[2], ck[3])
        # offsets some member already processed in this lineage (a member that closed
        # mid-chunk handed back what it committed: _hand_back) are not read again
        for s, e in self._state.done(*key, lineage):
            if s < ck[3] and e > ck[2]:
                h.ledger.ranges.remove(max(s, ck[2]), min(e, ck[3]))
        h.queue.append(ck)
        self.chunks_won += 1
        log.debug("won %s", ck)

    def stop_helping(self) -> None:
        """The member left the group (unsubscribe()): it claims no more chunks and gives
        back those it holds (``_give_back``), so that poll() hands out nothing more of the
        group's backlog, as a plain consumer's returns nothing after unsubscribe(). Before,
        it went on claiming and reading chunks of the topic it left (repro/r13: 11,100
        records in 15 s). ``subscribe()`` sets ``helping`` again."""
        self.helping = False
        self._subscribed = False
        self._give_back(sorted(self._held), "the member unsubscribed")

    def _give_back(self, chunks: Sequence[ChunkKey], why: str) -> None:
        """Give ``chunks`` back to the group: what the application committed of them as
        done pieces (``_hand_back``), the rest released for whoever claims it next; none of
        their records is handed out here any more."""
        if self._log.started and self.unusable is None:
            self._hand_back(chunks)
        for ck in chunks:
            if self._log.started and self.unusable is None:
                lineage = self._held_lineage.get(ck, "")
                self._send(ClaimRecord("release", self.member, *ck[:2], (ck[2:],), lineage))
            self._drop(ck, f"given back: {why}", lost=False)

    def paused(self, keys: Sequence[Key]) -> None:
        """pause() of partitions this member does not own: the chunks it holds of them go
        back to the group (``_give_back``) for another member to read. Kept, they waited
        for as long as the paused member lived (adversary of issue 48: 4,501 records and
        the group's offset held for 37.5 s). Its own partitions' chunks stay, as a plain
        consumer's paused partition waits for it."""
        self._give_back_helped(set(keys), "the application paused the partition")

    def hold_off(self, on: bool) -> None:
        """The application paused its whole assignment (``pause(assignment())``, the usual
        back-pressure), or resumed something. A plain consumer so paused hands out
        nothing; a helper went on handing out the group's chunks, 4,999-8,828 records in
        5 s of pause (adversary of issue 45). So, held off, the member gives back the
        chunks it holds of partitions it does not own (``_give_back``) and claims none
        until a resume() or an assignment with a partition not paused."""
        self._held_off = on
        if on:
            held = {(ck[0], ck[1]) for ck in self._held}
            self._give_back_helped(held, "the application paused its whole assignment")

    def _give_back_helped(self, keys: Collection[Key], why: str) -> None:
        """Give back the chunks held of ``keys`` that this member only helps with (a pause
        of them): those of a partition it owns stay, its backlog waiting for a resume()
        as a plain consumer's paused partition does."""
        chunks = sorted(ck for ck in self._held if ck[:2] in keys and ck[:2] not in self._owned)
        if chunks:
            self._give_back(chunks, why)

    def seek_back(self, key: Key, offset: int) -> bool:
        """seek() of a partition this member reads only as a helper (it owns none of it,
        so nothing else could seek it), back into a chunk it holds: the chunks from there
        on are given back (``_give_back``), so their records from ``offset`` are read and
        delivered again, here or by another member, as a seek back re-delivers on a plain
        consumer. api.md's recipe (commit the last good record, seek back to the bad one)
        raised ``_UNKNOWN_PARTITION`` on such a record (issue 45). False: no chunk of
        ``key`` this member holds has ``offset``."""
        chunks = sorted(ck for ck in self._held if ck[:2] == key and ck[3] > offset)
        if not chunks or chunks[0][2] > offset:
            return False
        self._give_back(chunks, f"the application sought back to {offset}")
        # what the child handed out from there on is to be delivered again: a bare commit
        # must not claim it. Kept claimable, it was: this member won the chunk back, and its
        # next bare commit declared the sought record done before it was read again (on
        # Apache Kafka 3.9 and 4 it was never delivered again, issue 45)
        h = self._helped[key]
        for s, e in h.history.unhand_child(offset):
            h.rewound.add(s, e)
        return True

    def _drop(self, ck: ChunkKey, why: str, lost: bool = True) -> None:
        key: Key = (ck[0], ck[1])
        h = self._helped[key]
        self._held.discard(ck)
        self._held_lineage.pop(ck, None)
        if ck in h.queue:
            h.queue.remove(ck)
        if ck in h.chain:
            self._cut_chain(key, h, ck)
        h.ledger.ranges.remove(ck[2], ck[3])
        h.runs.pop(ck, None)
        if lost:
            self.chunks_lost += 1
        log.log(logging.WARNING if lost else logging.INFO, "%s [%d] chunk [%d, %d): %s", *ck, why)

    def _check_lost(self) -> None:
        """Chunks another member claimed after this one's claim expired (this member was
        too slow to heartbeat): stop reading them; that member reads them again. Likewise
        a chunk offered again in another lineage (a new backlog of the same offsets): what
        this member committed of it belongs to the old one."""
        for ck in list(self._held):
            if self._state.lineage(ck) != self._held_lineage.get(ck):
                self._drop(ck, "offered again in a new backlog lineage")
            elif self._state.last_holder(ck) != self.member:
                self._drop(ck, "claimed by another member after this member's claim expired")

    def _mark_read(self, key: Key, h: _Helped) -> None:
        """Chunks of the chain the child's position has passed are read to their end."""
        pos = self._child.position(key)
        while h.chain and _passed(pos, h.chain[0]):
            log.debug("read %s", h.chain.pop(0))
        if not h.chain:
            h.cursor = None

    def _cut_chain(self, key: Key, h: _Helped, ck: ChunkKey) -> None:
        """``ck`` leaves the chain (lost, given back), and with it the chunks after it
        (back to the front of the queue, unread): the child's run must never reach past
        a gap, or a commit of a record after it would claim the gap's offsets, which
        this member may win and hold again later."""
        self._mark_read(key, h)
        if ck not in h.chain:
            return
        i = h.chain.index(ck)
        rest, h.chain = h.chain[i + 1 :], h.chain[:i]
        h.queue[:0] = rest
        pos = self._child.position(key)
        if h.cursor is None or not h.chain or (pos is not None and pos >= ck[2]):
            self._child.stop([key])  # reading ck itself: stop, as before chains
            h.queue[:0] = h.chain  # none of it read (else _mark_read had popped it)
            h.chain, h.cursor = [], None
            return
        h.cursor.ranges.remove(ck[2], 1 << 62)
        self._child.refresh(key)  # the current piece ends at the cut

    def _advance_reading(self) -> None:
        """The child reads a partition's chunks one after the other. A chunk starting
        where the chain ends joins it before the child gets there: the child reads on
        into it from what librdkafka already fetched, with no seek. Started afresh,
        each chunk cost 60-140 ms (unassign, assign, a new fetch) on Apache Kafka 3.9:
        one member drained 300,000 records in 18.3 s against 16.2 s without group
        catch-up."""
        for key, h in self._helped.items():
            self._mark_read(key, h)
            while h.queue:
                ck = h.queue[0]
                pending = _within(h.ledger.ranges, ck[2], ck[3])
                if not pending:
                    h.queue.pop(0)  # all of it processed already: done by _publish_done
                    continue
                if h.chain:
                    if h.cursor is None or ck[2] != h.chain[-1][3]:
                        break  # not next to the chain: read once the chain is
                    for s, e in pending:
                        h.cursor.ranges.add(s, e)
                else:
                    cursor = Ledger(_NOWHERE, pending)
                    try:
                        self._child.start(key, cursor, h.epoch)
                    except (KafkaException, RuntimeError) as exc:
                        log.warning("%s [%d]: the child could not start a chunk: %s", *key, exc)
                        break
                    h.cursor = cursor
                h.queue.pop(0)
                h.chain.append(ck)
                log.debug("reading %s", ck)
                h.runs[ck] = h.epoch.child[-1]
                h.history.trim(h.epoch)

    def _favour(self) -> None:
        """The child hands out a *small* partition's records before the others' it reads
        (``Child.favour``): one whose chunks not done all fit in what a member reads
        ahead, the partitions ``_pick`` claims whole and first. Claimed first, their
        records still came last: the child hands records out in fetch order, and the big
        partitions' chains started beside them had tens of thousands queued ahead (2
        members, 40,000 / 20,000 / 500 / 1,500 records: the 1,500-record partition won
        at 0.9 s, handed out from 13.0 s, behind the 20,000-record partition's whole
        block; per-member catch-up, whose owner reads it alone, was done at 2.0 s). A
        big partition's last chunks count as small too: read first, its tail is done no
        later, and the member's work stays the same."""
        reading = [k for k, h in self._helped.items() if h.chain]
        if not reading:
            self._child.favour(())
            return
        left = self._state.left(reading)
        self._child.favour(k for k in reading if left[k] <= self._prefetch)

    def _finish_tails(self) -> None:
        """A chunk read to its end whose last offsets hold no record (transaction markers,
        compaction) is processed once its last record is: those offsets leave the ledger."""
        for key, h in self._helped.items():
            for ck, run in list(h.runs.items()):
                if ck in h.chain or ck in h.queue or ck not in self._held:
                    continue
                pending = _within(h.ledger.ranges, ck[2], ck[3])
                end = pending.last_end()
                if end is None:
                    continue
                if run.next < end:
                    continue  # stopped before its end (the partition vanished): held, unread
                # (the end of what was pending when it was read: ck[3] unless the chunk's
                # tail was done already, handed back by a member that closed)
                first = pending.first()
                assert first is not None
                last = run.last if run.last is not None else ck[2] - 1
                if first > last:
                    h.ledger.ranges.remove(first, ck[3])
            self._publish_done(key)

    def _maybe_claim(self, now: float) -> None:
        """Claim free chunks until the chunks ahead (won and claimed) make the prefetch."""
        offered_now, self._offered_now = self._offered_now, []
        # the lineage each claim names: that of this member's offer just sent (the log
        # takes it first), else the one the log holds
        offered_in = dict(offered_now)
        offered = list(offered_in)
        if not self.helping:
            return
        if self._held_off:
            if self.assignment_paused():
                return
            self._held_off = False  # a partition assigned since is not paused: it reads
        if any(k in self._owned and self._owned[k].ranges for k in (*self._announce,
                                                                    *self._announced)):
            # its own backlog's chunks are offered once the group's commit carries their
            # lineage (~0.3 s at the start): claimed meanwhile, others' chunks filled what
            # it reads ahead, and its own small partition's chunks went to members busy
            # with big chains (3 members, a 1,500-record partition done at 3.9 s against
            # 1.0 s with per-member catch-up, where its owner reads it first)
            return
        # a partition the application paused reads nothing: its chunks are no work ahead,
        # and none of it is claimed (holding two of them stopped every other partition's)
        paused = self._child.is_paused
        ahead = sum(
            len(h.queue) + len(h.chain) for key, h in self._helped.items() if not paused(key)
        ) + sum(1 for ck in self._claims_out if not paused(ck[:2]))
        if ahead >= self._prefetch:
            return
        free = [
            ck
            for ck in dict.fromkeys([*self._state.free(), *offered])
            if ck not in self._held
            and ck not in self._claims_out
            and not paused(ck[:2])
            and self._reads(ck[0])
            and not self._overlaps_held(ck)
        ]
        while free and ahead < self._prefetch:
            ck = self._pick(free, offered)
            free.remove(ck)
            if any(c[:2] == ck[:2] and c[2] < ck[3] and ck[2] < c[3] for c in self._claims_out):
                continue  # overlaps a claim in flight (another lineage's chunk)
            log.debug("claim %s", ck)
            self._claims_out[ck] = now
            ahead += 1
            lineage = offered_in.get(ck)
            if lineage is None:
                lineage = self._state.lineage(ck) or ""
            self._send(ClaimRecord("claim", self.member, ck[0], ck[1], (ck[2:],), lineage))

    def _pick(self, free: list[ChunkKey], offered: list[ChunkKey]) -> ChunkKey:
        """Which free chunk to claim (the chunks this member holds or claimed count as
        read by it).

        0. The next chunk of a *small* partition this member reads: one whose free chunks
           all fit in what a member holds ahead. Its chain is whole before the child
           reaches its end, so its records come in one fetch, not behind the big
           partitions' (one member, 40,000 / 20,000 / 500 / 1,500 records: the
           1,500-record partition was done last, at 27.3 s of 27.5 s).
        1. A chunk of a partition no live member reads: every partition with a backlog gets
           a reader before any gets two (free chunks come in offer order, one partition's
           after another's: two members that both took the first of them read partition
           0's 30,000 records while partition 1's got none, adversary of issue 32). The
           smallest such partition first; this member's own offers of this tick first, each
           from its first chunk (nobody else knows them yet: no race; a random one among
           them had the owner of a 1,500-record partition hold its last chunk while the
           first two went to a member busy with big chains).
        2. The chunk right after the last one this member reads of a partition (of the
           one it has the fewest chunks ahead of): the child reads on into it
           (``_advance_reading``).
        3. One of a partition with the fewest live readers.

        Within a partition (1, 3): its first free chunk when this member is the only live
        one, else one at random among its first few, so that members starting together
        pick different chunks. Alone, a random start had the chain wrap around: the
        chunks below it were read last, each started afresh (the small partition's first
        chunk at the very end)."""
        readers: dict[Key, set[str]] = {}
        for ck, holder, live in self._state.holdings():
            if holder and live:
                readers.setdefault(ck[:2], set()).add(holder)
        mine = [*self._held, *self._claims_out]
        for ck in mine:
            readers.setdefault(ck[:2], set()).add(self.member)
        left: dict[Key, int] = {}
        for c in free:
            left[c[:2]] = left.get(c[:2], 0) + 1
        alone = all(m == self.member for m in self._state.members())

        def first_of(part: Key, among: list[ChunkKey]) -> ChunkKey:
            chunks = sorted(c for c in among if c[:2] == part)
            return chunks[0] if alone else random.choice(chunks[:_PICK_AMONG])

        # where this member's reading of each partition ends (claims in flight included),
        # and how many chunks it has ahead there
        ends: dict[Key, int] = {}
        ahead: dict[Key, int] = {}
        for k, h in self._helped.items():
            if h.queue or h.chain:
                ends[k] = (h.queue or h.chain)[-1][3]
                ahead[k] = len(h.queue) + len(h.chain)
        for ck in sorted(self._claims_out):
            if ends.get(ck[:2]) == ck[2] or ck[:2] not in ends:
                ends[ck[:2]] = ck[3]
            ahead[ck[:2]] = ahead.get(ck[:2], 0) + 1
        follows = [c for c in free if ends.get(c[:2]) == c[2]]
        small = [c for c in follows if left[c[:2]] <= self._prefetch]
        if small:
            return min(small, key=lambda c: (left[c[:2]], c))
        unread = [c for c in free if c[:2] not in readers]
        own = [c for c in offered if c in unread]
        if own:  # nobody else knows them yet: no race, its first chunk
            part = min({c[:2] for c in own}, key=lambda k: (left[k], k))
            return min(c for c in own if c[:2] == part)
        if unread:
            part = min({c[:2] for c in unread}, key=lambda k: (left[k], random.random()))
            return first_of(part, unread)
        if follows:
            return min(follows, key=lambda c: ahead.get(c[:2], 0))
        # else a partition with the fewest readers
        fewest = min(len(readers.get(c[:2], ())) for c in free)
        parts = sorted({c[:2] for c in free if len(readers.get(c[:2], ())) == fewest})
        return first_of(random.choice(parts), free)

    def _publish_done(self, key: Key) -> None:
        h = self._helped.get(key)
        if h is None:
            return
        for ck in [c for c in self._held if c[0] == key[0] and c[1] == key[1]]:
            if ck in h.queue or ck in h.chain:
                continue
            if h.ledger.ranges.last_overlapping(ck[2], ck[3]) is None:
                self._held.discard(ck)
                lineage = self._held_lineage.pop(ck, "")
                h.runs.pop(ck, None)
                self._send(ClaimRecord("done", self.member, ck[0], ck[1], (ck[2:],), lineage))
                self._done_sent.add(key)
                log.debug("done %s", ck)
                self.chunks_done += 1

    # -- the commit path -----------------------------------------------------------------------
    def holds(self, key: Key, offset: int) -> bool:
        """Whether this member's child handed out ``offset`` of ``key`` from a chunk."""
        h = self._helped.get(key)
        if h is None:
            return False
        return (
            offset in h.history.forgotten
            or offset in h.rewound
            or any(r.holds(offset) for r in h.epoch.child)
        )

    def split(self, messages: Sequence[Message]) -> tuple[dict[Key, list[Claim]], list[Message]]:
        """The claims of the chunk records among ``messages``, and the other records."""
        mine: dict[Key, list[Claim]] = {}
        rest = []
        for m in messages:
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if (
                m.error() is None
                and topic is not None
                and partition is not None
                and (offset is not None and self.holds((topic, partition), offset))
            ):
                key = (topic, partition)
                mine.setdefault(key, []).extend(_stream_claims(self._helped[key], offset))
            else:
                rest.append(m)
        return mine, rest

    def handed(self, limits: dict[Key, int]) -> dict[Key, list[Claim]]:
        """A bare commit's claims of chunk records: what the child handed out (or, with
        enable.auto.offset.store=false, what store_offsets() stored)."""
        out: dict[Key, list[Claim]] = {}
        for key, h in self._helped.items():
            if self._settings.auto_offset_store:
                # the runs dropped from the history (more chunks read than it keeps) were
                # handed out too: without them their chunks were never done
                claims = h.epoch.handed_claims() + _unclaimed(h, h.history.forgotten)
                if key in limits:
                    cut = limits[key]
                    claims = [
                        Claim(c.start, min(c.end, cut), c.child, c.exact)
                        for c in claims
                        if c.start < cut
                    ]
            else:
                claims, h.staged = h.staged, []
            if claims:
                out[key] = claims
        return out

    def history_of(self, key: Key) -> History | None:
        """What this member's child handed out of ``key``'s chunks."""
        h = self._helped.get(key)
        return None if h is None else h.history

    def handed_of(self, key: Key) -> list[Claim]:
        """Every chunk record of ``key`` the child handed out so far, whatever
        enable.auto.offset.store says: a commit of a later record covers them
        (``Committer._earlier``)."""
        h = self._helped.get(key)
        if h is None:
            return []
        return h.epoch.handed_claims() + _unclaimed(h, h.history.forgotten)

    def stage(self, claims: dict[Key, list[Claim]]) -> None:
        """store_offsets() of chunk records: claimed by the next commit."""
        for key, cl in claims.items():
            self._helped[key].staged.extend(cl)

    def commit(self, claims: dict[Key, list[Claim]], sync: bool, timeout_s: float) -> None:
        """The application committed these chunk records: they leave the helper ledgers,
        and each chunk with nothing left is done. ``sync``: wait (bounded) until the done
        records are written."""
        for key, cl in claims.items():
            h = self._helped.get(key)
            if h is None:
                continue
            apply_change(h.ledger, Change(list(cl)))
            # the chunk the child just read to its end is done now, not a tick later (or
            # never: a member that committed its last records and closed left it held)
            self._mark_read(key, h)
            self._publish_done(key)
        if sync and self._log.started:
            self._log.flush(timeout_s)

    # -- reporting and close ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Who holds which chunk of which partition, as this member's log says."""
        state = self._state
        chunks = [
            {
                "topic": ck[0],
                "partition": ck[1],
                "start": ck[2],
                "end": ck[3],
                "holder": holder,
                "live": live,
            }
            for ck, holder, live in state.holdings()
        ]
        held: dict[tuple[str, int, str], int] = {}
        for ck, holder, live in state.holdings():
            if holder is not None and live:
                k = (ck[0], ck[1], holder)
                held[k] = held.get(k, 0) + 1
        return {
            "member": self.member,
            "claims_topic": self._log.topic,
            "unusable": self.unusable,
            "caught_up": self._log.caught_up,
            "members": state.members(),
            "open_chunks": len(chunks),
            "held_here": len(self._held),
            "chunks": chunks[:100],
            "holders": [
                {"topic": t, "partition": p, "holder": h, "chunks": n}
                for (t, p, h), n in sorted(held.items())
            ],
            "chunks_won": self.chunks_won,
            "chunks_done": self.chunks_done,
            "chunks_lost": self.chunks_lost,
            "claims_lost": self.claims_lost,
            "chunks_offered": self.chunks_offered,
            "chunks_absorbed": self.chunks_absorbed,
            "log_send_failures": self._log.send_failures,
        }

    def held_ranges(self) -> dict[Key, RangeSet]:
        """Per partition, the offsets of the chunks this member holds that its
        application has not committed."""
        return {key: h.ledger.ranges for key, h in self._helped.items() if h.ledger.ranges}

    def chunks_of(self, key: Key) -> tuple[tuple[int, int, str | None, bool], ...]:
        """(start, end, holder, live) of the partition's chunks not done."""
        return tuple(
            (ck[2], ck[3], holder, live)
            for ck, holder, live in self._state.holdings()
            if (ck[0], ck[1]) == key
        )

    def close(self, timeout_s: float) -> None:
        """Leave: the chunks still held are free at once (``bye``), for the others."""
        if self._closed:
            return
        self._closed = True
        if self._log.started and self.unusable is None:
            self._hand_back()
            self._log.send(ClaimRecord("bye", self.member))
            helped = self._done_sent - self._owned.keys()
            if helped and self._read_to_end(timeout_s):
                self.orphans = {
                    k: {lin: list(done) for lin, done in self._state.done_lineages(*k).items()}
                    for k in sorted(helped)
                }
        self._log.close(timeout_s)

    def absorb_orphans(
        self, timeout_s: float, remove_dead: Callable[[float], bool] | None = None
    ) -> None:
        """Once this member has left the group (its primary closed): the done chunks of
        partitions it helped with but did not own, absorbed into the group's offset if
        the group has no member left to do it, once those of its members proven dead are
        removed (``remove_dead``, see ``_orphans``)."""
        orphans, self.orphans = self.orphans, {}
        try:
            absorb_orphans(
                self._conf, orphans, self._settings.metadata_max_bytes, timeout_s, remove_dead
            )
        except (KafkaException, RuntimeError) as exc:
            log.warning("done chunks of partitions no member owns stay for the next owner "
                        "to absorb: %s", exc)  # fmt: skip

    def _hand_back(self, chunks: Sequence[ChunkKey] | None = None) -> None:
        """Chunks left with part of them committed: that part becomes chunks of their own,
        offered, claimed and done by this member (the log accepts them in this order, one
        producer), so that whoever takes the rest over does not read it again. Without it
        a clean close() mid-chunk had the next holder read the chunk from its start (700
        records delivered twice with no crash, repro/r04). Each ``done`` is true: its
        offsets left this member's ledger only by its application's commits."""
        for ck in sorted(self._held) if chunks is None else chunks:
            h = self._helped.get((ck[0], ck[1]))
            if h is None:
                continue
            pending = _within(h.ledger.ranges, ck[2], ck[3])
            committed = RangeSet([(ck[2], ck[3])])
            for s, e in pending:
                committed.remove(s, e)
            if not committed or not pending:
                continue  # nothing committed, or all of it (done already sent)
            lin = self._held_lineage.get(ck, "")
            if self._state.lineage(ck) != lin:
                continue  # offered again in another lineage: what was committed is the old one's
            pieces = tuple(committed)
            self._log.send(ClaimRecord("offer", self.member, ck[0], ck[1], pieces, lin))
            self._done_sent.add((ck[0], ck[1]))
            for piece in pieces:
                self._handed_back.add((ck[0], ck[1], *piece))
                self._log.send(ClaimRecord("claim", self.member, *ck[:2], (piece,), lin))
                self._log.send(ClaimRecord("done", self.member, *ck[:2], (piece,), lin))
            log.info("%s [%d] chunk [%d, %d): handed back %d committed offsets",
                     *ck, committed.count())  # fmt: skip


def _lineage(ledger: Ledger) -> str:
    """The owned ledger's backlog lineage, drawn afresh where it has none (a plan that made
    new offsets pending, a rewind): the group's next commit carries it to the next owner."""
    if not ledger.lineage:
        ledger.lineage = uuid.uuid4().hex[:16]
    return ledger.lineage


def _unclaimed(h: _Helped, handed: Iterable[tuple[int, int]]) -> list[Claim]:
    """Claims of what the child handed out in ``handed`` that the helper ledger still
    holds (the rest would claim nothing: skipped, so a commit costs what is left)."""
    return [
        Claim(s, e, child=True)
        for s, e in handed
        if e > s and h.ledger.ranges.last_overlapping(s, e) is not None
    ]


def _stream_claims(h: _Helped, offset: int) -> list[Claim]:
    """``commit(message=)`` of a chunk record: the record and what this member's child
    handed out of the partition before it (its stream), as the contract says. The child
    starts a run per chunk, so the record's own run is not enough: the earlier chunks'
    runs were handed out before it. Without them a loop committing every N-th record by
    message left every chunk whose last records preceded a commit point in the next chunk
    held for ever (adversary of issue 22, repro/r02: 4 of 5 chunks, the group's offset at
    0). A record whose place in the stream is not known (a run dropped from the history,
    or read twice) claims what the history says, alone."""
    claims = [h.history.record_claim(offset)]
    runs = h.epoch.child
    first = next((i for i, r in enumerate(runs) if r.holds(offset)), None)
    if first is None or offset in h.history.forgotten:
        return claims
    before = [(r.start, r.next) for r in runs[:first]]
    return claims + _unclaimed(h, [*h.history.forgotten, *before])


def _may_match(patterns: Sequence[str], topic: str) -> bool:
    """Whether one of librdkafka's subscription patterns may match ``topic``: Python's
    ``re`` stands in for librdkafka's dialect (close for the usual ``^prefix.*``); a
    pattern Python cannot read is taken to match (a claims log never shared with the
    application's records is the safe side)."""
    for pattern in patterns:
        try:
            if re.search(pattern, topic):
                return True
        except re.error:
            return True
    return False


def _passed(position: int | None, ck: ChunkKey) -> bool:
    """The child's ``position`` (None: it reads nothing of the partition) is past ``ck``."""
    return position is None or position >= ck[3]


def _within(ranges: RangeSet, start: int, end: int) -> RangeSet:
    """The part of ``ranges`` inside ``[start, end)``."""
    out = RangeSet()
    piece = ranges.next_from(start)
    while piece is not None and piece[0] < end:
        out.add(max(piece[0], start), min(piece[1], end))
        piece = ranges.next_from(piece[1])
    return out
