"""Which stream leads the merge of poll()/consume() while the child reads a backlog.

Fresh records lead (the primary is asked first and for most of a batch, the backlog
gets at least one record in ``CHILD_SHARE``) as long as the primary is at the live end
of the log: that is what keeps their latency. Once the primary has records queued for
as long as ``BEHIND_RUN`` of them were handed out without its queue running dry, it is
behind too: its records wait just as the backlog's do, and the backlog's are older. The
backlog then leads, the primary keeping one record in ``CHILD_SHARE``, and every
``CHILD_SHARE``-th turn is the primary's again (to find out whether it caught up). With
fresh records leading throughout, an application that can barely keep up with the fresh
rate (a loaded CPU) drained its backlog at an eighth of its processing rate: several
times slower than plain confluent-kafka, which reads the backlog first.

Pure bookkeeping, no I/O; owned by the thread that calls poll()/consume().
"""

from __future__ import annotations

__all__ = ["BEHIND_RUN", "CHILD_SHARE", "Lead"]

#: While both streams have records, at least one delivered record in this many comes
#: from the stream that does not lead.
CHILD_SHARE = 8
#: Records the primary handed out without its queue running dry, after which it is
#: behind the live end (a consume(500) that came back full is one such run).
BEHIND_RUN = 256


class Lead:
    """Whether the backlog leads the next call (``consume()``) or record (``poll()``)."""

    __slots__ = ("behind", "run", "turns")

    def __init__(self) -> None:
        #: The primary is behind the live end: the backlog leads.
        self.behind = False
        #: Records the primary handed out since its queue last ran dry.
        self.run = 0
        #: Turns taken since the backlog began to lead.
        self.turns = 0

    # -- consume() ----------------------------------------------------------------------
    def primary_ask(self, num: int, fair: int) -> int:
        """How many of a ``consume(num)`` batch the primary is asked for (the child is
        asked for the rest); ``fair``: primary batches since the child last had one."""
        reserve = num // CHILD_SHARE
        if self.behind and reserve and self.turns % CHILD_SHARE != CHILD_SHARE - 1:
            return reserve
        if reserve == 0 and fair >= CHILD_SHARE:
            reserve = 1
        return num - reserve

    def batched(self, asked: int, fresh: int, child_asked: int, backlog: int) -> None:
        """What one consume() call got from each stream."""
        self.primary(asked, fresh)
        self.child(child_asked, backlog)
        if self.behind:
            self.turns += 1

    # -- poll() -------------------------------------------------------------------------
    def backlog_first(self) -> bool:
        """Whether poll() asks the child first; in every ``CHILD_SHARE`` records the
        primary's one, and every ``CHILD_SHARE``-th round of them the primary's."""
        t = self.turns
        return (
            self.behind
            and t % CHILD_SHARE != CHILD_SHARE - 1
            and (t // CHILD_SHARE) % CHILD_SHARE != CHILD_SHARE - 1
        )

    def polled_primary(self, got: bool) -> None:
        """The primary's poll(0) returned a record, or nothing (its queue ran dry)."""
        self.primary(1, got)
        if got and self.behind:
            self.turns += 1

    def polled_child(self, got: bool) -> None:
        """The child was asked for one record first, and had one or not."""
        self.child(1, got)
        if got and self.behind:
            self.turns += 1

    # -- what the streams had -----------------------------------------------------------
    def primary(self, asked: int, got: int) -> None:
        """The primary returned ``got`` of the ``asked`` records (timeout 0)."""
        if asked <= 0:
            return
        if got < asked:  # its queue ran dry: it is at the live end
            self.behind = False
            self.run = 0
            return
        self.run += got
        if not self.behind and self.run >= BEHIND_RUN:
            self.behind = True
            self.turns = 0

    def child(self, asked: int, got: int) -> None:
        """The child returned ``got`` of the ``asked`` records: fewer, and it has nothing
        queued to lead with."""
        if asked > 0 and got < asked:
            self.behind = False
            self.run = 0
