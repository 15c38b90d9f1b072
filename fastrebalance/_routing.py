"""Which offsets a commit claims processed, from the delivery history: pure, no Kafka.

Kafka's contract for ``commit(message=m)`` is "m and every record before it are
processed". With two streams per partition, "before it" means before it *in the stream
that delivered it*: the primary reads ``[F, ∞)`` (F: where it started in this
assignment, the log end after a crash), the child reads the backlog ranges below F.

A record's stream cannot be read off the record (a ``confluent_kafka.Message`` takes no
attributes and no weak references), and it must not be guessed from today's assignment:
a record held across a revoke, or from an earlier assignment, belongs to the stream that
delivered it then. So every assignment of a partition opens an ``Epoch`` that records,
per stream, the *runs* it handed out: contiguous offsets ``[start, next)`` in delivery
order (a seek, a child restart or a jump to a non-adjacent range starts a new run). A
commit is attributed by looking the offset up in that history:

* a record the primary delivered at or above F claims ``[F, o]`` (plain Kafka semantics
  for fresh records: a forward seek skips what it skips);
* a record delivered below F (the child, or the primary after a backward seek) claims
  ``[run start, o]``: backlog is only ever claimed by records actually delivered;
* a record several streams delivered claims only what they all agree on; a record no
  remembered stream delivered claims itself alone;
* an offset ``n`` (``commit(offsets=)``) whose record ``n - 1`` a child handed out
  claims what ``commit(message=)`` of that record would: the textbook
  ``commit(offsets=[TopicPartition(t, p, m.offset() + 1)])`` of a backlog record. Plain
  Kafka reads it as "everything below n is processed": this claims a part of that. Unless
  ``n`` is also a position a primary was at (its start: the end of the backlog);
* any other offset is a position of the current assignment's primary: it claims what the
  primary's record just below it would, and nothing if the primary did not hand that out
  (an offset from an earlier assignment cannot be told from a rewind).

Everything here is the user's thread's (no lock), like the handles beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._ranges import RangeSet

__all__ = ["UNKNOWN_START", "Claim", "Epoch", "History", "Run"]

#: The start of a primary run not known yet, wherever librdkafka alone knows where the
#: primary lands: a partition assigned without a plan (its logs could not be read) at a
#: logical offset, an OFFSET_TAIL(n) start or seek, a group that never committed in
#: exactly-once mode. Such a run holds nothing and claims nothing until its first record
#: says where it starts (``Epoch.resolve``): claiming from 0, or from any guess, could
#: claim a pending backlog that nobody read.
UNKNOWN_START = 1 << 62

#: Assignments remembered per partition; older ones only keep what they delivered, so a
#: late commit of one of their records claims that record alone.
MAX_EPOCHS = 8
#: Runs remembered per stream of one assignment (seeks and child restarts add runs).
MAX_RUNS = 64
#: Ranges kept in the "forgotten" coverage before its smallest gaps are filled.
MAX_FORGOTTEN_RANGES = 256


@dataclass(frozen=True)
class Claim:
    """Offsets ``[start, end)`` are processed. ``child``: the claim came from the
    child's stream (it also moves the child's checkpoint). ``exact``: the claim may
    move the primary's position; an unattributed record only claims inside the backlog."""

    start: int
    end: int
    child: bool = False
    exact: bool = True


class Run:
    """Offsets ``[start, next)`` one stream handed out in order, ``last`` the last record
    (``next`` may pass it: transaction markers, aborted or compacted records hold no
    record to hand out).

    ``bound`` is where the run may have reached: equal to ``next`` when what was handed
    out is known exactly, higher when only an upper bound is (a revoke served inside the
    primary's consume(), where librdkafka's position also counts records collected for the
    batch), None when not even that is. A bare commit claims up to ``next`` (what surely
    was handed out); a record is looked up up to ``bound`` (what may have been).
    """

    __slots__ = ("bound", "last", "next", "stale", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self.next = start
        self.bound: int | None = start
        self.last: int | None = None
        #: the position librdkafka still reported from the partition's previous
        #: assignment when this run began (it lags an assign() for a moment): not a
        #: position of this run, so observing it says nothing
        self.stale: int | None = None

    def __repr__(self) -> str:
        return f"Run({self.start}, {self.next}, bound={self.bound}, last={self.last})"

    def handed(self, offset: int) -> None:
        """The stream handed the record at ``offset`` to the application."""
        self.last = offset
        self.advance(offset + 1)

    def advance(self, offset: int) -> None:
        """Everything below ``offset`` was handed out, or holds no record."""
        if offset > self.next:
            self.next = offset
        self.widen(offset)

    def widen(self, offset: int | None) -> None:
        """The run may have reached ``offset`` (None: somewhere unknown)."""
        if self.bound is not None:
            self.bound = None if offset is None else max(self.bound, offset)

    def holds(self, offset: int) -> bool:
        """Whether the run may have handed out ``offset``."""
        return self.start <= offset and (self.bound is None or offset < self.bound)


class Epoch:
    """One assignment of one partition: the primary's start F and both streams' runs.

    The primary's live run records nothing on the hot path: the caller observes
    librdkafka's position into it (``Run.advance``/``Run.widen``) before asking for a
    claim, and when the primary seeks or the partition leaves the assignment.
    """

    __slots__ = ("child", "floor", "open", "primary")

    def __init__(self, floor: int, primary_start: int) -> None:
        self.floor = floor
        self.primary: list[Run] = [Run(primary_start)]
        self.child: list[Run] = []
        self.open = True

    def __repr__(self) -> str:
        return f"Epoch(F={self.floor}, primary={self.primary}, child={self.child})"

    @property
    def live(self) -> Run:
        """The primary's current run."""
        return self.primary[-1]

    # -- recording ----------------------------------------------------------------------
    def seek(self, offset: int) -> None:
        """The primary moves to ``offset`` (its live run observed first)."""
        self.primary.append(Run(offset))

    def close(self) -> None:
        """The partition left the assignment (its live run observed first)."""
        self.open = False

    @property
    def unresolved(self) -> bool:
        return self.primary[-1].start == UNKNOWN_START

    def resolve(self, offset: int) -> None:
        """The primary's live run of unknown start handed out its first record, at
        ``offset``: the run begins there, and so does the primary's stream if the epoch
        had no floor. Records before it in the run (a record returned before this was
        called) are not covered: a late commit of one claims that record alone."""
        if self.primary[-1].start != UNKNOWN_START:
            return
        self.primary[-1] = Run(offset)
        if self.floor == UNKNOWN_START:
            self.floor = offset

    def child_run(self, start: int) -> Run:
        run = Run(start)
        self.child.append(run)
        return run

    def trim(self, forgotten: RangeSet) -> None:
        """Keep at most MAX_RUNS runs per stream; the oldest only leave their coverage
        (the live run is the newest, so it is never dropped)."""
        for runs in (self.primary, self.child):
            while len(runs) > MAX_RUNS:
                _cover(forgotten, runs.pop(0))

    # -- attribution --------------------------------------------------------------------
    def record_claims(self, offset: int) -> list[Claim]:
        """The claim each stream of this epoch makes for a record at ``offset`` it may
        have handed out (none if neither did). The primary's first run that may hold it
        decides."""
        out = []
        for run in self.primary:
            if run.holds(offset):
                start = self.floor if offset >= self.floor else run.start
                out.append(Claim(start, offset + 1))
                break
        for run in self.child:
            if run.holds(offset):
                end = run.next if offset == run.last else offset + 1
                out.append(Claim(run.start, end, child=True))
                break
        return out

    def handed_claims(self) -> list[Claim]:
        """Everything both streams surely handed out (a bare commit, the auto-commit)."""
        out = []
        fresh_end = self.floor
        for run in self.primary:
            start, nxt = run.start, run.next
            if nxt <= start:
                continue  # nothing handed out yet (a seek, an application's own start)
            if nxt > self.floor:
                fresh_end = max(fresh_end, nxt)
                nxt = self.floor
            if start < nxt:
                out.append(Claim(start, nxt))
        if fresh_end > self.floor:
            out.append(Claim(self.floor, fresh_end))
        out += [Claim(r.start, r.next, child=True) for r in self.child if r.next > r.start]
        return out

    def position_claim(self, offset: int) -> Claim | None:
        """``commit(offsets=[offset])``: a position of the primary's stream, "the primary
        handed out everything below ``offset``". Above F it claims ``[F, offset)`` (what
        the primary skipped there, by a seek or the application's own start, is skipped
        as by a plain consumer); at or below F only what a primary run re-read there. A
        position the primary surely reached is needed: the backlog records the child
        handed out cannot be told processed from an offset alone."""
        for run in self.primary:
            if run.start <= offset <= run.next:
                if offset > self.floor:
                    return Claim(self.floor, offset)
                return Claim(run.start, offset) if run.start < offset else None
        return None

    def cover(self, into: RangeSet) -> None:
        for run in (*self.primary, *self.child):
            _cover(into, run)


def _cover(into: RangeSet, run: Run) -> None:
    """What a run may have handed out, into a coverage (an unknown bound: what it surely
    did; records beyond claim themselves alone once no epoch remembers the run)."""
    end = run.bound if run.bound is not None else run.next
    if end > run.start:
        into.add(run.start, end)


class History:
    """The epochs of one partition, newest last; what older ones delivered is kept as a
    coverage so that a late commit of one of their records never borrows a claim from a
    stream that did not deliver it."""

    __slots__ = ("epochs", "forgotten")

    def __init__(self) -> None:
        self.epochs: list[Epoch] = []
        self.forgotten = RangeSet()

    @property
    def current(self) -> Epoch | None:
        if self.epochs and self.epochs[-1].open:
            return self.epochs[-1]
        return None

    @property
    def latest(self) -> Epoch | None:
        return self.epochs[-1] if self.epochs else None

    def begin(self, floor: int, primary_start: int) -> Epoch:
        cur = self.current
        if cur is not None:
            # a new assignment of a partition still assigned: what its primary handed out
            # is not known here, so it may have handed out anything from its run's start
            cur.live.widen(None)
            cur.close()
        epoch = Epoch(floor, primary_start)
        self.epochs.append(epoch)
        while len(self.epochs) > MAX_EPOCHS:
            self.epochs.pop(0).cover(self.forgotten)
        if len(self.forgotten) > MAX_FORGOTTEN_RANGES:
            self.forgotten = self.forgotten.coalesced(MAX_FORGOTTEN_RANGES // 2)
        return epoch

    def trim(self, epoch: Epoch) -> None:
        epoch.trim(self.forgotten)

    def record_claim(self, offset: int) -> Claim:
        """What ``commit(message=)`` of the record at ``offset`` claims: the intersection
        of what every stream that handed it out would claim (each is true if the record
        came from it, so their intersection is true whichever it came from)."""
        claims: list[Claim] = []
        for epoch in self.epochs:
            claims += epoch.record_claims(offset)
        if not claims or offset in self.forgotten:
            return Claim(offset, offset + 1, exact=False)
        return _intersection(claims)

    def child_offset_claim(self, offset: int) -> Claim | None:
        """What ``commit(offsets=[offset])`` claims when a child handed out the record at
        ``offset - 1``: what committing that record would (None: no child did). It is no
        rewind: the offset follows a backlog record, below the primary's stream."""
        last = offset - 1
        if last in self.forgotten or not any(
            run.holds(last) for e in self.epochs for run in e.child
        ):
            return None
        if offset in self.forgotten or any(
            r.start <= offset and (r.bound is None or offset <= r.bound)  # bound >= next
            for e in self.epochs for r in e.primary
        ):  # fmt: skip
            # also a position a primary was at, in this assignment or an earlier one: its
            # start, right above the backlog (the application committing position()), or
            # after a seek back into the backlog. Which one is meant cannot be told: what
            # the primary's reading claims (nothing there, and a rewind) is true either way
            return None
        return self.record_claim(last)

    def primary_only(self, offset: int) -> bool:
        """Whether a primary run may have handed out ``offset`` and no child run did."""
        if offset in self.forgotten:
            return False
        runs = [(r, False) for e in self.epochs for r in e.primary]
        runs += [(r, True) for e in self.epochs for r in e.child]
        held = [child for r, child in runs if r.holds(offset)]
        return bool(held) and not any(held)

    def unhand_child(self, offset: int) -> RangeSet:
        """A seek back to ``offset`` of what the child streams read: their records from
        ``offset`` on count as not handed out (a bare commit claims them only once a run
        hands them out again), as the application said by seeking that it will process
        them again. Returns what they had handed out there, so that a late commit of one
        of those records can still be told from a record of no stream of this history."""
        removed = RangeSet()
        for epoch in self.epochs:
            for run in epoch.child:
                end = max(run.next, run.bound if run.bound is not None else run.next)
                if end <= offset:
                    continue
                removed.add(max(run.start, offset), end)
                if run.start >= offset:
                    run.next = run.bound = run.start
                    run.last = None
                else:
                    run.next = run.bound = offset
                    if run.last is not None and run.last >= offset:
                        run.last = offset - 1
        for s, e in self.forgotten:
            if e > offset:
                removed.add(max(s, offset), e)
        self.forgotten.truncate_from(offset)
        return removed

    def position_claim(self, offset: int) -> Claim | None:
        """What ``commit(offsets=[offset])`` claims: a position of the primary of the
        current assignment (or of the last one, once the partition has left), see
        ``Epoch.position_claim``. An offset carries no record, so nothing tells it came
        from an earlier assignment rather than being a rewind: it claims nothing there
        (a rewind claims nothing). Nothing either if a child handed out ``offset - 1``:
        that is ``child_offset_claim``'s."""
        last = offset - 1
        epoch = self.latest
        if epoch is None or last in self.forgotten or any(
            run.holds(last) for e in self.epochs for run in e.child
        ):
            return None
        return epoch.position_claim(offset)


def _intersection(claims: list[Claim]) -> Claim:
    """Each claim is true if the record came from its stream, and each covers the record
    itself: what they all claim is true whichever stream it came from."""
    start = max(c.start for c in claims)
    end = min(c.end for c in claims)
    return Claim(start, end, child=all(c.child for c in claims))
