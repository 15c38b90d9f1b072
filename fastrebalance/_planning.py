"""Restoring a partition from the two commit logs and planning its catch-up: pure, no I/O.

``restore()`` merges what the user's group stores (the safe offset and the range token)
with the child's checkpoint into a ``Ledger`` (see ``_ledger``); ``plan_assignment()``
decides where the primary starts and which backlog the child reads. Both only ever keep
or add unprocessed offsets, never remove one that is not proven processed, so a plan made
from stale or partial information re-reads at worst.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._ledger import Ledger
from ._ranges import RangeSet
from ._routing import UNKNOWN_START
from ._token import (
    ChildCheckpoint,
    TokenError,
    TokenTooLargeError,
    decode_child_checkpoint,
    decode_group_token,
    encode_group_token,
    is_ours,
)

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TOKEN_HEADROOM_BYTES",
    "Plan",
    "Restored",
    "checkpoint_applies",
    "checkpoint_is_stale",
    "plan_assignment",
    "restore",
    "token_fits",
]


@dataclass
class Restored:
    """What the two commit logs say about one partition."""

    position: int | None  #: P; None: the group never committed this partition
    ranges: RangeSet = field(default_factory=RangeSet)
    user_metadata: str | None = None  #: the application's; None: none (not even "")
    problem: str | None = None  #: why a token was ignored (to log once)
    lineage: str = ""  #: the token's backlog lineage (group-wide catch-up)

    @property
    def safe_offset(self) -> int | None:
        return self.ledger().safe_offset

    def ledger(self) -> Ledger:
        return Ledger(self.position, self.ranges.copy(), self.lineage)


def restore(
    group_offset: int,
    group_metadata: str | None,
    child_offset: int = -1,
    child_metadata: str | None = None,
) -> Restored:
    """Merge the user's group commit and the child's checkpoint.

    Falls back to the bare group offset whenever the token is missing, foreign,
    corrupt, or does not match the offset it was stored with (another tool moved
    the offset): the bare offset never passes an unprocessed record. Metadata that
    looks like a token but is not one (an application's own string starting with the
    token prefix, written by a plain consumer) is handed back as the application's.
    """
    if group_offset < 0:
        return Restored(None)
    problem = None
    try:
        token = decode_group_token(group_metadata)
    except TokenError as exc:
        token, problem = None, f"ignored commit metadata: {exc}"
    if token is None:
        return Restored(group_offset, RangeSet(), group_metadata, problem)
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
    return Restored(token.position, ranges, token.user_metadata, problem, token.lineage)


def checkpoint_applies(cp: ChildCheckpoint, ranges: RangeSet) -> bool:
    # A checkpoint names the end of the range it was taken in; range ends are log
    # ends at the time of a crash, so a match ties it to this history and not to an
    # older one an operator has since rewound.
    return any(end == cp.end for _, end in ranges)


#: confluent-kafka's logical offsets, by value (this module imports nothing of Kafka's).
OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, OFFSET_INVALID = -2, -1, -1000, -1001


@dataclass(frozen=True)
class Plan:
    """Where the primary starts, where its stream begins, and what is unprocessed."""

    #: the offset handed to librdkafka's assign(); None: let auto.offset.reset decide
    start: int | None
    ledger: Ledger
    #: F: the primary's stream begins here; offsets below it are backlog
    floor: int = 0
    #: where the primary's first run of deliveries begins (F unless the application
    #: asked for its own start)
    run_start: int = 0
    deleted: tuple[tuple[int, int], ...] = ()  #: pending ranges already gone by retention
    caught_up: tuple[int, int] | None = None  #: the new range this plan added, if any
    #: the range a catch-up would have added, declined because the token could not hold it
    declined: tuple[int, int] | None = None


#: Room an exactly-once token keeps below its budget when a plan adds a range: later
#: positions take more digits, and a commit out of order splits a range.
TOKEN_HEADROOM_BYTES = 64


def token_fits(ledger: Ledger, user_metadata: str | None, max_bytes: int) -> bool:
    """Whether ``ledger``'s token encodes within ``max_bytes`` as it is (no coalescing)."""
    token = ledger.token(user_metadata, force=is_ours(user_metadata))
    if token is None:
        return True
    try:
        _, written = encode_group_token(token, max_bytes)
    except TokenTooLargeError:
        return False
    return written.ranges == token.ranges


def plan_assignment(
    restored: Restored,
    low: int,
    high: int,
    threshold: int,
    requested: int = OFFSET_INVALID,
    exact_token_bytes: int | None = None,
    from_start: bool = False,
) -> Plan:
    """Decide the primary's start and the backlog for a partition just gained.

    Catch-up starts when ``high - P > threshold``: the primary jumps to the log end and
    ``[P, high)`` joins the pending ranges. Ranges already pending (a previous crash) are
    always kept, whatever the threshold or the start: they are unprocessed.

    ``requested`` is the offset the application gave assign(). A logical "committed"
    offset means: plan. An explicit start (absolute, or OFFSET_BEGINNING/OFFSET_END) is
    the application's choice, as with a plain consumer: the primary starts there and no
    new range is added; its stream begins at the lower of that start and P, so a later
    commit skips what a plain consumer's would (fresh records between P and a later
    start) and never the pending backlog.

    ``from_start``: a partition the group never committed (P unknown) starts where
    auto.offset.reset says; when that is the log start, ``[low, high)`` is its backlog,
    caught up as any other when it passes the threshold (a new service whose first member
    crashed on its first read restarted with its whole log in order: first fresh record
    after 18.9 s at p50, issue 47).

    ``exact_token_bytes`` (exactly-once): the range token may never be coalesced, so a
    new range is added only if the token still fits this budget with room to spare
    (``TOKEN_HEADROOM_BYTES``); otherwise the primary resumes at P and reads the new
    backlog in order. A pipeline that crash-loops with a pending backlog would otherwise
    add a range at every restart until no transaction could carry its offsets.
    """
    if restored.position is None:
        if requested not in (OFFSET_INVALID, OFFSET_STORED):
            return Plan(requested, Ledger(), 0, max(requested, 0))
        if not from_start or high - low <= threshold:
            return Plan(None, Ledger())
        # Never committed, and auto.offset.reset=earliest: the whole log is backlog, as
        # if the group had committed its start. Nothing is claimed processed: the offset
        # the group may store is still the log start until records are committed.
        fresh = Ledger(low)
        fresh.split_at(high)
        if exact_token_bytes is not None and not token_fits(
            fresh, "", exact_token_bytes - TOKEN_HEADROOM_BYTES
        ):
            return Plan(None, Ledger(), declined=(low, high))
        return Plan(high, fresh, high, high, (), (low, high))
    ledger = restored.ledger()
    position = restored.position
    added = declined = None
    if requested in (OFFSET_INVALID, OFFSET_STORED):
        if high - position > threshold:
            ledger.split_at(high)
            added = (position, high)
            if exact_token_bytes is not None and not token_fits(
                ledger, restored.user_metadata, exact_token_bytes - TOKEN_HEADROOM_BYTES
            ):
                ledger, added, declined = restored.ledger(), None, added
        start: int | None = ledger.position
        assert start is not None
        floor = run_start = start
    else:
        if requested == OFFSET_END:
            run_start = max(high, position)
        elif requested == OFFSET_BEGINNING:
            run_start = low
        elif requested >= 0:
            run_start = requested
        else:
            # OFFSET_TAIL(n): librdkafka resolves it against a log end that may have
            # moved since it was read here; the primary's first record says where it
            # starts (a start guessed too low would claim backlog it never read)
            run_start = UNKNOWN_START
        start = requested
        floor = min(run_start, position)
    deleted = tuple(ledger.drop_below(low)) if low > 0 else ()
    # The ledger keeps the token's backlog lineage (group-wide catch-up), a range added or
    # not: a done record of that lineage is a fact about these very records, since
    # everything that makes processed offsets unprocessed again ends the lineage (an
    # operator's reset drops or moves the token, a rewind commit writes none, a rewind in
    # memory clears it, a group or topic deleted takes the token with it). Dropping it
    # whenever a range was added would start a new lineage at every owner change under
    # load (fresh records make a new range), and every chunk in flight or done but not
    # absorbed yet would be read again.
    return Plan(start, ledger, floor, run_start, deleted, added, declined)


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

