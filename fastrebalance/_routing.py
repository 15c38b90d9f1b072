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
* an offset (``commit(offsets=)``) is a position of the primary: it claims what the
  primary's record just below it would, and nothing if the primary did not hand that
  out (a backlog record cannot be told processed from an offset alone).

Everything here is the user's thread's (no lock), like the handles beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._ranges import RangeSet

__all__ = ["Claim", "Epoch", "History", "Run"]

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
    record to hand out)."""

    __slots__ = ("last", "next", "start")

    def __init__(self, start: int, next_: int | None = None) -> None:
        self.start = start
        self.next = start if next_ is None else next_
        self.last: int | None = None

    def __repr__(self) -> str:
        return f"Run({self.start}, {self.next}, last={self.last})"

    def handed(self, offset: int) -> None:
        """The stream handed the record at ``offset`` to the application."""
        self.last = offset
        if offset >= self.next:
            self.next = offset + 1

    def reach(self, offset: int) -> None:
        """Nothing left to hand out below ``offset`` (end of a range, a gap passed)."""
        if offset > self.next:
            self.next = offset


class Epoch:
    """One assignment of one partition: the primary's start F and both streams' runs.

    While the assignment is open, the primary's last run ends at librdkafka's position
    (what it has handed out), which the caller passes as ``live_next``: the hot path
    records nothing per record.
    """

    __slots__ = ("child", "floor", "open", "primary")

    def __init__(self, floor: int, primary_start: int) -> None:
        self.floor = floor
        self.primary: list[Run] = [Run(primary_start)]
        self.child: list[Run] = []
        self.open = True

    def __repr__(self) -> str:
        return f"Epoch(F={self.floor}, primary={self.primary}, child={self.child})"

    # -- recording ----------------------------------------------------------------------
    def seek(self, offset: int, handed_next: int | None) -> None:
        """The primary moves to ``offset``; it had handed out up to ``handed_next``."""
        live = self.primary[-1]
        if handed_next is not None:
            live.reach(handed_next)
        self.primary.append(Run(offset))

    def close(self, handed_next: int | None) -> None:
        """The partition left the assignment; the primary had handed up to ``handed_next``."""
        if self.open and handed_next is not None:
            self.primary[-1].reach(handed_next)
        self.open = False

    def child_run(self, start: int) -> Run:
        run = Run(start)
        self.child.append(run)
        return run

    def trim(self, forgotten: RangeSet) -> None:
        """Keep at most MAX_RUNS runs per stream; the oldest only leave their coverage
        (the live run is the newest, so it is never dropped)."""
        for runs in (self.primary, self.child):
            while len(runs) > MAX_RUNS:
                old = runs.pop(0)
                if old.next > old.start:
                    forgotten.add(old.start, old.next)

    # -- attribution --------------------------------------------------------------------
    def _primary_runs(self, live_next: int | None) -> list[tuple[int, int]]:
        out = []
        last = len(self.primary) - 1
        for i, run in enumerate(self.primary):
            nxt = run.next
            if i == last and self.open and live_next is not None:
                nxt = max(nxt, live_next)
            out.append((run.start, nxt))
        return out

    def record_claims(self, offset: int, live_next: int | None) -> list[Claim]:
        """The claim each stream of this epoch makes for a record at ``offset`` it handed
        out (none if neither did). The primary's first run that holds it decides."""
        out = []
        for start, nxt in self._primary_runs(live_next):
            if start <= offset < nxt:
                if offset >= self.floor:
                    out.append(Claim(self.floor, offset + 1))
                else:
                    out.append(Claim(start, offset + 1))
                break
        for run in self.child:
            if run.start <= offset < run.next:
                end = run.next if offset == run.last else offset + 1
                out.append(Claim(run.start, end, child=True))
                break
        return out

    def handed_claims(self, live_next: int | None) -> list[Claim]:
        """Everything both streams handed out (a bare commit, the auto-commit)."""
        out = []
        fresh_end = self.floor
        for start, nxt in self._primary_runs(live_next):
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

    def position_claim(self, offset: int, live_next: int | None) -> Claim | None:
        """``commit(offsets=[offset])``: a position of the primary's stream, "the primary
        handed out everything below ``offset``". Above F it claims ``[F, offset)`` (what
        the primary skipped there, by a seek or the application's own start, is skipped
        as by a plain consumer); at or below F only what a primary run re-read there. A
        position the primary never reached claims nothing: the backlog records the child
        handed out cannot be told processed from an offset alone."""
        for start, nxt in self._primary_runs(live_next):
            if start <= offset <= nxt:
                if offset > self.floor:
                    return Claim(self.floor, offset)
                return Claim(start, offset) if start < offset else None
        return None

    def delivered(self, live_next: int | None) -> RangeSet:
        out = RangeSet()
        for start, nxt in self._primary_runs(live_next):
            if nxt > start:
                out.add(start, nxt)
        for run in self.child:
            if run.next > run.start:
                out.add(run.start, run.next)
        return out


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
            cur.close(None)
        epoch = Epoch(floor, primary_start)
        self.epochs.append(epoch)
        while len(self.epochs) > MAX_EPOCHS:
            old = self.epochs.pop(0)
            for s, e in old.delivered(None):
                self.forgotten.add(s, e)
        if len(self.forgotten) > MAX_FORGOTTEN_RANGES:
            self.forgotten = self.forgotten.coalesced(MAX_FORGOTTEN_RANGES // 2)
        return epoch

    def trim(self, epoch: Epoch) -> None:
        epoch.trim(self.forgotten)

    def record_claim(self, offset: int, live_next: int | None) -> Claim:
        """What ``commit(message=)`` of the record at ``offset`` claims: the intersection
        of what every stream that handed it out would claim (each is true if the record
        came from it, so their intersection is true whichever it came from)."""
        claims: list[Claim] = []
        for epoch in self.epochs:
            claims += epoch.record_claims(offset, live_next if epoch.open else None)
        if not claims or offset in self.forgotten:
            return Claim(offset, offset + 1, exact=False)
        return _intersection(claims)

    def position_claim(self, offset: int, live_next: int | None) -> Claim | None:
        """What ``commit(offsets=[offset])`` claims: the intersection over the assignments
        whose primary handed out ``offset - 1`` (see ``Epoch.position_claim``). Nothing if
        a child handed it out too: the offset may come from that record, and an offset of
        the child's claims nothing."""
        last = offset - 1
        if last in self.forgotten or any(
            run.start <= last < run.next for epoch in self.epochs for run in epoch.child
        ):
            return None
        claims = []
        for epoch in self.epochs:
            claim = epoch.position_claim(offset, live_next if epoch.open else None)
            if claim is not None:
                claims.append(claim)
        return _intersection(claims) if claims else None


def _intersection(claims: list[Claim]) -> Claim:
    """Each claim is true if the record came from its stream, and each covers the record
    itself: what they all claim is true whichever stream it came from."""
    start = max(c.start for c in claims)
    end = min(c.end for c in claims)
    return Claim(start, end, child=all(c.child for c in claims))
