"""Per-partition catch-up state and the pure decisions made on it: no Kafka I/O.

The whole safety argument lives here, so it can be property-tested:

* ``position`` (P) and ``ranges`` (R) say: every offset below P that is not in R
  is processed; every offset in R or at/after P is not. The offset written to
  the user's group is ``safe_offset = min(R.first, P)``, so a tool that reads only
  the offset re-reads at worst.
* Each update either *removes* offsets that the application declared processed
  (a commit), or *adds* offsets as unprocessed. No update ever claims an offset
  processed that was not, so any interleaving of commits, crashes and restores
  keeps the claim true; stale state only means re-reading (duplicates).
* Offsets below ``floor`` (where the primary started for this assignment) belong
  to the child's stream; commits are routed by that, not by whether an offset is
  still pending, so a late commit of an old child record can never be mistaken
  for a rewind of the primary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._ranges import RangeSet
from ._token import (
    ChildCheckpoint,
    GroupToken,
    TokenError,
    decode_child_checkpoint,
    decode_group_token,
)

__all__ = [
    "PartitionState",
    "Plan",
    "Restored",
    "checkpoint_applies",
    "checkpoint_is_stale",
    "plan_assignment",
    "restore",
]


@dataclass
class Restored:
    """What the two commit logs say about one partition."""

    position: int | None  #: P; None: the group never committed this partition
    ranges: RangeSet = field(default_factory=RangeSet)
    user_metadata: str = ""
    problem: str | None = None  #: why a token was ignored (to log once)

    @property
    def safe_offset(self) -> int | None:
        first = self.ranges.first()
        if self.position is None:
            return None
        return self.position if first is None else min(first, self.position)


def restore(
    group_offset: int,
    group_metadata: str | None,
    child_offset: int = -1,
    child_metadata: str | None = None,
) -> Restored:
    """Merge the user's group commit and the child's checkpoint.

    Falls back to the bare group offset whenever the token is missing, foreign,
    corrupt, or does not match the offset it was stored with (another tool moved
    the offset): the bare offset never passes an unprocessed record.
    """
    if group_offset < 0:
        return Restored(None)
    problem = None
    try:
        token = decode_group_token(group_metadata)
    except TokenError as exc:
        token, problem = None, f"ignored commit metadata: {exc}"
    if token is None:
        user = "" if problem else (group_metadata or "")
        return Restored(group_offset, RangeSet(), user, problem)
    if token.safe_offset != group_offset:
        return Restored(
            group_offset,
            RangeSet(),
            token.user_metadata,
            f"ignored range token: it was written with offset {token.safe_offset} "
            f"but the committed offset is {group_offset} (moved by another tool)",
        )
    ranges = RangeSet(token.ranges)
    try:
        cp = decode_child_checkpoint(child_metadata, child_offset) if child_offset >= 0 else None
    except TokenError as exc:
        cp, problem = None, f"ignored child checkpoint: {exc}"
    if cp is not None and checkpoint_applies(cp, ranges):
        ranges.remove(cp.start, cp.offset)
    return Restored(token.position, ranges, token.user_metadata, problem)


def checkpoint_applies(cp: ChildCheckpoint, ranges: RangeSet) -> bool:
    # A checkpoint names the end of the range it was taken in; range ends are log
    # ends at the time of a crash, so a match ties it to this history and not to an
    # older one an operator has since rewound.
    return any(end == cp.end for _, end in ranges)


@dataclass(frozen=True)
class Plan:
    """Where the primary starts and what the child must read."""

    start: int | None  #: primary's start offset; None: let auto.offset.reset decide
    ranges: RangeSet
    deleted: tuple[tuple[int, int], ...] = ()  #: pending ranges already gone by retention
    caught_up: tuple[int, int] | None = None  #: the new range this plan added, if any


def plan_assignment(restored: Restored, low: int, high: int, threshold: int) -> Plan:
    """Decide the primary's start and the backlog for a partition just gained.

    Catch-up starts when ``high - P > threshold``: the primary jumps to the log end
    and ``[P, high)`` joins the pending ranges. Ranges already pending (a previous
    crash) are always kept, whatever the threshold: they are unprocessed.
    """
    if restored.position is None:
        return Plan(None, RangeSet())
    ranges = restored.ranges.copy()
    position = restored.position
    added = None
    start = position
    if high - position > threshold:
        ranges.add(position, high)
        added = (position, high)
        start = high
    deleted: list[tuple[int, int]] = []
    if low > 0:
        for s, e in ranges:
            if s >= low:
                break
            deleted.append((s, min(e, low)))
        ranges.remove_below(low)
    return Plan(start, ranges, tuple(deleted), added)


def checkpoint_is_stale(cp: ChildCheckpoint, added: tuple[int, int]) -> bool:
    """Whether a checkpoint in the child's log must be retired before the group commits
    a token with the range ``added`` that a plan just created.

    Checkpoints are tied to their history by the end of their range, and a new range
    ends at the current log end, above every range of its own history (those lie below
    the position it starts from). So a checkpoint naming the new range's end comes from
    another history: written before an operator reset the group's offsets (which drops
    our token) with nothing produced since. Left in place it would apply to the new
    range and skip the records the operator asked to reprocess.
    """
    return cp.end == added[1]


class PartitionState:
    """The catch-up state of one assigned partition.

    Owned by the thread that calls poll()/consume()/commit() (the user's thread):
    no lock, like the confluent-kafka handle it sits beside.
    """

    __slots__ = ("child_delivered", "floor", "position", "ranges", "user_metadata")

    def __init__(
        self, position: int | None, ranges: RangeSet, floor: int | None, user_metadata: str = ""
    ) -> None:
        self.position = position  # P: the primary's committed position
        self.ranges = ranges  # unprocessed backlog below P, as last declared
        self.floor = floor  # offsets below belong to the child's stream
        self.user_metadata = user_metadata
        self.child_delivered: int | None = None  # next offset the child will deliver

    @property
    def safe_offset(self) -> int | None:
        first = self.ranges.first()
        if self.position is None:
            return first
        return self.position if first is None else min(first, self.position)

    def is_child_offset(self, offset: int) -> bool:
        return self.floor is not None and offset < self.floor

    def commit(self, next_offset: int) -> ChildCheckpoint | None:
        """The application declares every record before ``next_offset`` processed,
        in the stream that ``next_offset - 1`` belongs to.

        Returns:
            The child checkpoint to write when it is a child-stream commit that
            still moves pending ranges; None otherwise.
        """
        last = next_offset - 1
        if self.is_child_offset(last):
            if self.child_delivered is None or next_offset > self.child_delivered:
                # The child has not delivered ``last``: this is no child commit but the
                # primary's own offset at or below its start (``commit(floor)`` before
                # it read anything, a rewind). It proves nothing processed, and taking
                # it for the child's would drop the backlog below ``next_offset``.
                return None
            piece = self.ranges.range_containing(last)
            self.ranges.remove_below(next_offset)
            if piece is None:
                return None
            return ChildCheckpoint(piece[0], piece[1], next_offset)
        self.position = next_offset
        self.ranges.truncate_from(next_offset)
        return None

    def token(self) -> GroupToken | None:
        """The token for the next group commit; None when there is nothing to say
        beyond the offset (no backlog pending), so rollback tools see plain commits."""
        if self.position is None or not self.ranges:
            return None
        return GroupToken(self.position, self.ranges.as_tuple(), self.user_metadata)
