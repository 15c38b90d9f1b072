"""What one commit writes to each log, from a ledger: pure, no Kafka I/O.

Both writes are derived from the ledger *after* the commit's claims were applied, so
each is a true statement on its own (see ``_ledger``): the group's offset is the safe
offset, the token says what lies beyond it, and a child checkpoint says which offsets of
one backlog range are processed. Either may be lost or land late; a restart merges the
two and a stale one only claims less.
"""

from __future__ import annotations

import logging

from ._ledger import Ledger
from ._ranges import RangeSet
from ._routing import Claim
from ._token import ChildCheckpoint, TokenTooLargeError, encode_group_token, is_ours

__all__ = ["Change", "GroupWrite", "apply_change", "checkpoint_for", "group_write"]

log = logging.getLogger("fastrebalance.consumer")


class Change:
    """What one commit does to one partition: claims, a rewind, the user's metadata."""

    __slots__ = ("claims", "metadata", "position", "rewind")

    def __init__(self, claims: list[Claim] | None = None) -> None:
        self.claims: list[Claim] = claims or []
        self.rewind: int | None = None
        #: commit(offsets=) for a partition this consumer never had: stored as a plain
        #: consumer stores it, against what the group holds (its pending ranges kept)
        self.position: int | None = None
        #: the application's commit metadata; None: none given (not even "")
        self.metadata: str | None = None


def apply_change(ledger: Ledger, change: Change) -> ChildCheckpoint | None:
    """Apply one partition's change to its ledger; returns the child checkpoint to write."""
    checkpoint = None
    for claim in change.claims:
        if claim.child:
            checkpoint = checkpoint_for(ledger, claim) or checkpoint
        end = claim.end
        if not claim.exact:
            # a record of unknown provenance: it alone, and only inside the backlog
            top = ledger.position if ledger.position is not None else claim.start
            end = min(end, top)
        ledger.claim(claim.start, end)
    if change.position is not None:
        p = ledger.position
        if p is None or change.position > p:
            ledger.claim(p if p is not None else 0, change.position)
    return checkpoint


def checkpoint_for(ledger: Ledger, claim: Claim) -> ChildCheckpoint | None:
    """The checkpoint a child-stream claim writes, computed *before* the claim is applied:
    the claimed part of the highest pending range it touches, tied to that range's end.
    None when the claim touches no pending range (nothing left to checkpoint)."""
    piece = ledger.ranges.last_overlapping(claim.start, claim.end)
    if piece is None:
        return None
    start = max(piece[0], claim.start)
    offset = min(piece[1], claim.end)
    if offset <= start:
        return None
    return ChildCheckpoint(start, piece[1], offset)


class GroupWrite:
    """The user's group commit for one partition: offset, metadata, and the ranges the
    ledger must adopt when the token had to be coalesced to fit."""

    __slots__ = ("coalesced", "metadata", "offset")

    def __init__(
        self, offset: int, metadata: str | None, coalesced: RangeSet | None = None
    ) -> None:
        self.offset = offset
        self.metadata = metadata
        self.coalesced = coalesced


def group_write(
    ledger: Ledger,
    user_metadata: str | None,
    max_bytes: int,
    rewind: int | None = None,
    exact: bool = False,
) -> GroupWrite | None:
    """The safe offset with the range token (or the application's metadata alone when
    nothing is pending, exactly as confluent-kafka would write it). None: nothing to say.

    ``rewind``: the application committed this lower offset (a rewind): this write says
    everything from it on is unprocessed, as confluent-kafka's would store it, but the
    ledger keeps what it knows; as with confluent-kafka, the next commit (or a restart
    from this one) decides where the group resumes. Rewinding the ledger itself would
    leave offsets that nobody reads again pending forever.

    A token that cannot fit ``max_bytes`` even coalesced to one range (the application's
    own metadata takes the room) gives way: the bare safe offset is written with the
    application's metadata, as a plain consumer would write it. That is safe (the offset
    alone never passes an unprocessed record); the backlog beyond it is re-read after a
    crash. Metadata of the application's that looks like a token is wrapped in one, so it
    reads back as the application's.

    ``exact`` (exactly-once): coalescing and the bare-offset fallback both make processed
    offsets pending again, which at-least-once tolerates (they are re-read) and
    exactly-once does not (their output would be written twice): raise instead.

    Raises:
        TokenTooLargeError: ``exact`` and the token does not fit ``max_bytes`` as it is.
    """
    rewound = rewind is not None and (ledger.position is None or rewind < ledger.position)
    if rewound:
        ledger = ledger.copy()
        ledger.rewind(rewind)  # type: ignore[arg-type]
    safe = ledger.safe_offset
    if safe is None or ledger.position is None:
        return None
    token = ledger.token(user_metadata, force=is_ours(user_metadata))
    if token is None:
        return GroupWrite(safe, user_metadata)
    try:
        text, written = encode_group_token(token, max_bytes)
    except TokenTooLargeError as exc:
        if exact:
            raise
        log.warning("%s: committing the safe offset %d without a range token", exc, safe)
        return GroupWrite(safe, user_metadata)
    if exact and written.ranges != token.ranges:
        raise TokenTooLargeError(
            f"{len(token.ranges)} pending ranges need coalescing to fit {max_bytes} bytes"
        )
    coalesced = None
    if written.ranges != token.ranges and not rewound:  # the ledger adopts what it wrote
        coalesced = RangeSet(written.ranges)
    return GroupWrite(written.safe_offset, text, coalesced)
