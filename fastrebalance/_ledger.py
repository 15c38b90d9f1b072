"""What is unprocessed in one partition: pure bookkeeping, no Kafka.

A ``Ledger`` is the set ``U`` of offsets that may not be claimed processed, kept as

    U = ranges | [position, inf)

with every range below ``position``. ``ranges`` is the backlog the child consumer reads;
``[position, inf)`` is the primary's. The offset the user's group stores is ``min(U)``
(``safe_offset``), so anything that reads only that offset re-reads at worst.

The safety invariant, stated on ``U``: an offset leaves ``U`` only through ``claim()``,
whose caller has proven the offsets processed (the application said so through the
commit API; see ``_routing``). Every other operation only *adds* offsets to ``U``
(``rewind()``, ``pend()``) or re-draws the line between the two parts without changing
the set (``split_at()``). Processed is a fact that never becomes false, so every
``(safe offset, token)`` pair ever written from a ledger is true when it lands, however
late, and a stale one only claims less.

``lineage`` (group-wide catch-up) names the incarnation of the backlog: the claims log's
``done`` records are facts about offsets *of one lineage*, and an owner absorbs only its
own lineage's. It is kept while ``U`` only shrinks or keeps its offsets (``claim()``,
coalescing) and dropped ("" : a new one is drawn before anything is offered) when offsets
already processed become unprocessed again (``rewind()``): a ``done`` of the old lineage
may name them, and it is no longer true of them.
"""

from __future__ import annotations

from ._ranges import RangeSet
from ._token import GroupToken

__all__ = ["Ledger"]


class Ledger:
    """``U = ranges | [position, inf)``; ``position`` None: nothing known yet (no commit).

    Owned by the thread that calls the facade (the user's thread), like the handles.
    """

    __slots__ = ("lineage", "position", "ranges")

    def __init__(
        self, position: int | None = None, ranges: RangeSet | None = None, lineage: str = ""
    ) -> None:
        self.position = position
        self.ranges = ranges if ranges is not None else RangeSet()
        self.lineage = lineage

    def __repr__(self) -> str:
        return (
            f"Ledger(position={self.position}, ranges={self.ranges.as_tuple()}, "
            f"lineage={self.lineage!r})"
        )

    def copy(self) -> Ledger:
        return Ledger(self.position, self.ranges.copy(), self.lineage)

    @property
    def safe_offset(self) -> int | None:
        """The lowest offset not claimed processed: what the group may store."""
        first = self.ranges.first()
        if self.position is None:
            return first
        return self.position if first is None else min(first, self.position)

    def unprocessed(self, offset: int) -> bool:
        if self.position is None:
            return True
        return offset >= self.position or offset in self.ranges

    # -- the only way out of U --------------------------------------------------------
    def claim(self, start: int, end: int) -> None:
        """Offsets ``[start, end)`` are processed (the caller proved it)."""
        if end <= start:
            return
        p = self.position
        if p is None:
            # Nothing was ever committed: a plain consumer's first commit defines the
            # group's offset, and so does ours. There is no backlog to protect.
            self.position = end
            return
        if end <= p:
            self.ranges.remove(start, end)
            return
        if start <= p:
            if start < p:
                self.ranges.remove(start, p)
        else:
            # [p, start) stays unprocessed: it becomes backlog below the new position.
            self.ranges.add(p, start)
        self.position = end

    # -- ways into U --------------------------------------------------------------------
    def rewind(self, offset: int) -> None:
        """Everything at or after ``offset`` is unprocessed again (a rewind commit):
        re-reading is always safe, so a rewind is always honoured. With nothing committed
        yet, the first commit defines the group's offset, as a plain consumer's does
        (there is no backlog to keep)."""
        if self.position is None:
            self.position = offset
        elif offset < self.position:
            self.ranges.truncate_from(offset)
            self.position = offset
            self.lineage = ""  # processed offsets are unprocessed again: a new backlog

    def pend(self, ranges: RangeSet) -> None:
        """Replace the backlog by a superset of it (coalescing to fit the token):
        the offsets added are re-read, none is dropped."""
        self.ranges = ranges

    def split_at(self, offset: int) -> None:
        """Move the line between backlog and the primary's part to ``offset`` (>= position):
        ``[position, offset)`` becomes backlog for the child. ``U`` is unchanged; a plan
        does this when the primary starts at the log end."""
        if self.position is None or offset <= self.position:
            return
        self.ranges.add(self.position, offset)
        self.position = offset

    def drop_below(self, offset: int) -> list[tuple[int, int]]:
        """Offsets below ``offset`` no longer exist (deleted by retention): they leave U
        (nobody can process them; the caller reports them). Returns the pieces dropped."""
        gone = [(s, min(e, offset)) for s, e in self.ranges if s < offset]
        self.ranges.remove_below(offset)
        return gone

    # -- encoding -----------------------------------------------------------------------
    def token(self, user_metadata: str | None = None, force: bool = False) -> GroupToken | None:
        """The group token for the next commit; None when the safe offset says it all (no
        backlog), so tools and a rollback see a plain commit. ``force``: write one anyway
        (the application's own metadata looks like a token and must be wrapped)."""
        if self.position is None or (not self.ranges and not force):
            return None
        return GroupToken(self.position, self.ranges.as_tuple(), user_metadata, self.lineage)
