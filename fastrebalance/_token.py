"""Range tokens <-> OffsetCommit metadata strings: a pure, versioned, size-capped codec.

Two kinds of token travel in Kafka's commit metadata, each in the same OffsetCommit
request as the offset it qualifies, so offset and token can never disagree by
being written at different times:

``GroupToken`` (the user's group, ``group.id``)
    ``~fr1:<crc>:<position>;<ranges>|<user metadata>``. The committed *offset* is
    the safe one (lowest unprocessed); the token adds the primary's real position
    and the pending backlog ranges below it. Tools that know nothing of tokens read
    the offset and re-read at worst; we read the token and skip nothing.
    With group-wide catch-up the backlog has a *lineage* (``_groupcatchup``), written
    as ``~fr2:<crc>:<lineage>:<payload>`` (the CRC covers both): a version that does
    not read it ignores the token and uses the offset alone, which is safe.

``ChildCheckpoint`` (the child's own group, ``<group.id>.catchup``)
    ``~frc1:<crc>:<range start>:<range end>``, stored with the child's committed
    offset ``c``: "the offsets of range ``[start, end)`` below ``c`` are processed".

Numbers are base 36; ranges are ``gap+length`` pairs (the first gap counted from 0,
the others from the previous end) so a token costs a few bytes per range. A CRC-32
covers the payload (and, for checkpoints, the offset they were stored with):
a truncated, edited or misplaced token is detected and ignored, and ignoring a
token is always safe because the offset alone never claims an unprocessed record.

``encode_group_token`` enforces ``max_bytes`` (the broker's ``offset.metadata.max.bytes``;
a real broker rejects the whole commit beyond it) by coalescing the ranges that are
closest together: the result re-reads a few processed records, it never drops one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from ._ranges import RangeSet

__all__ = [
    "DEFAULT_METADATA_MAX_BYTES",
    "NO_CHECKPOINT",
    "ChildCheckpoint",
    "CorruptTokenError",
    "GroupToken",
    "TokenError",
    "TokenTooLargeError",
    "UnknownTokenVersionError",
    "decode_child_checkpoint",
    "decode_group_token",
    "encode_child_checkpoint",
    "encode_group_token",
    "is_child_metadata",
    "is_ours",
    "valid_lineage",
]

#: Kafka's default ``offset.metadata.max.bytes`` is 4096, and Apache Kafka 3.6 was
#: measured rejecting 4096-byte metadata while accepting 4000: keep a margin.
DEFAULT_METADATA_MAX_BYTES = 4000

_GROUP_PREFIX = "~fr"
_GROUP_VERSION = "1"
#: the same token with a backlog lineage (group-wide catch-up)
_GROUP_LINEAGE_VERSION = "2"
#: a lineage is a short random name: base 36 digits only (no separator can hide in it)
_LINEAGE_MAX = 32
_CHILD_PREFIX = "~frc"
#: Between a group token's ranges and the application's metadata (none: nothing after it,
#: as every version wrote it); an empty string ("", not none) ends the token instead with
#: _EMPTY_USER and nothing after (a version before it ignores such a token as corrupt and
#: resumes from the bare safe offset: records re-read, none skipped).
_USER = "|"
_EMPTY_USER = "!"
_CHILD_VERSION = "1"
#: What the child writes to clear a checkpoint: ours, and no checkpoint.
NO_CHECKPOINT = "~frc:none"


class TokenError(ValueError):
    """Metadata that claims to be ours but cannot be trusted."""


class UnknownTokenVersionError(TokenError):
    """Written by a newer (or older) fastrebalance with a format we do not read."""


class CorruptTokenError(TokenError):
    """Truncated, edited or otherwise invalid: the offset alone must be used."""


class TokenTooLargeError(ValueError):
    """The token does not fit its budget: not even coalesced to one range (the user's
    own metadata takes the room), or, for exactly-once, not without coalescing."""


@dataclass(frozen=True)
class GroupToken:
    """What the user's group commit means beyond its offset.

    Attributes:
        position: the primary consumer's committed position: every offset below it
            that is not in ``ranges`` is processed; nothing at or above it is.
        ranges: pending backlog ranges ``[start, end)``, sorted, disjoint, all
            below ``position``.
        user_metadata: the metadata string the application itself committed; None: it
            gave none (confluent-kafka reads such a commit back as None, and "" as "").
        lineage: which incarnation of the backlog ``ranges`` belong to (group-wide
            catch-up: the claims log's ``done`` records of another lineage say nothing
            about them); "" for none.
    """

    position: int
    ranges: tuple[tuple[int, int], ...] = ()
    user_metadata: str | None = None
    lineage: str = ""

    @property
    def safe_offset(self) -> int:
        """The offset Kafka must store: the lowest one not yet processed."""
        return self.ranges[0][0] if self.ranges else self.position


@dataclass(frozen=True)
class ChildCheckpoint:
    """The child's progress: offsets of ``[start, end)`` below ``offset`` are processed."""

    start: int
    end: int
    offset: int


def is_child_metadata(metadata: str | None) -> bool:
    """Whether a commit in the catch-up group's log was written by a child consumer."""
    return bool(metadata) and metadata.startswith(_CHILD_PREFIX)  # type: ignore[union-attr]


def is_ours(metadata: str | None) -> bool:
    """Whether commit metadata starts like one of our tokens (it may still be corrupt,
    or an application's own string with the same prefix: decode to know)."""
    return bool(metadata) and metadata.startswith(_GROUP_PREFIX)  # type: ignore[union-attr]


# -- base 36 ------------------------------------------------------------------
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError("negative number in token")
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


def _int36(s: str) -> int:
    if not s or len(s) > 13 or any(ch not in _DIGITS for ch in s):
        raise CorruptTokenError(f"bad number {s[:20]!r} in token")
    return int(s, 36)


def _crc(payload: str) -> str:
    # surrogatepass: any str has a checksum, so a decode of garbage fails as a mismatch
    # (TokenError), never as a UnicodeEncodeError out of poll()
    return format(zlib.crc32(payload.encode("utf-8", "surrogatepass")), "08x")


# -- group token --------------------------------------------------------------
def _group_payload(position: int, ranges: tuple[tuple[int, int], ...], user: str | None) -> str:
    parts = []
    prev = 0
    for start, end in ranges:
        parts.append(f"{_b36(start - prev)}+{_b36(end - start)}")
        prev = end
    body = _b36(position)
    if parts:
        body += ";" + ",".join(parts)
    if user == "":
        return f"{body}{_EMPTY_USER}"
    return f"{body}{_USER}{user or ''}"


def _group_string(
    position: int, ranges: tuple[tuple[int, int], ...], user: str | None, lineage: str = ""
) -> str:
    payload = _group_payload(position, ranges, user)
    if not lineage:
        return f"{_GROUP_PREFIX}{_GROUP_VERSION}:{_crc(payload)}:{payload}"
    signed = f"{lineage}:{payload}"
    return f"{_GROUP_PREFIX}{_GROUP_LINEAGE_VERSION}:{_crc(signed)}:{signed}"


def valid_lineage(lineage: str) -> bool:
    """Whether ``lineage`` can travel in a token ("" is none, and valid)."""
    return len(lineage) <= _LINEAGE_MAX and all(ch in _DIGITS for ch in lineage)


def encode_group_token(
    token: GroupToken, max_bytes: int = DEFAULT_METADATA_MAX_BYTES
) -> tuple[str, GroupToken]:
    """Encode ``token`` within ``max_bytes`` UTF-8 bytes.

    Returns:
        The metadata string and the token it actually encodes (its ranges may be a
        coalesced superset of the input's; the caller should adopt them so that
        memory and Kafka agree). Coalescing keeps the lineage; only a token that fits
        no other way drops it (the next owner then starts a new lineage: safe, its
        done chunks are read again).

    Raises:
        TokenTooLargeError: the user metadata leaves no room for even one range.
        ValueError: ranges not sorted, disjoint and below ``position``; a lineage
            other than base 36 digits.
    """
    _validate(token.position, token.ranges)
    if not valid_lineage(token.lineage):
        raise ValueError(f"lineage {token.lineage[:40]!r} is not {_LINEAGE_MAX} base 36 digits")
    try:
        return _encode_group_token(token, max_bytes)
    except TokenTooLargeError:
        if not token.lineage:
            raise
        return _encode_group_token(
            GroupToken(token.position, token.ranges, token.user_metadata), max_bytes
        )


def _encode_group_token(token: GroupToken, max_bytes: int) -> tuple[str, GroupToken]:
    lineage = token.lineage
    text = _group_string(token.position, token.ranges, token.user_metadata, lineage)
    if len(text.encode("utf-8")) <= max_bytes:
        return text, token
    full = RangeSet(token.ranges)
    lo, hi = 1, max(len(token.ranges) - 1, 1)
    best: tuple[str, GroupToken] | None = None
    # Fewer ranges never encode longer (a merge deletes one gap+len pair and grows
    # one length by a digit at most), so the largest count that fits is found by
    # bisection.
    while lo <= hi:
        mid = (lo + hi) // 2
        ranges = full.coalesced(mid).as_tuple()
        candidate = _group_string(token.position, ranges, token.user_metadata, lineage)
        if len(candidate.encode("utf-8")) <= max_bytes:
            best = (candidate, GroupToken(token.position, ranges, token.user_metadata, lineage))
            lo = mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise TokenTooLargeError(
            f"commit metadata of {len((token.user_metadata or '').encode('utf-8'))} bytes "
            f"leaves no room for the range token within {max_bytes} bytes"
        )
    return best


def decode_group_token(metadata: str | None) -> GroupToken | None:
    """Parse a group commit's metadata.

    Returns:
        The token, or None when the metadata is not ours at all (empty, or written
        by another tool): the committed offset then stands alone.

    Raises:
        UnknownTokenVersionError, CorruptTokenError: ours, but not to be trusted.
    """
    if not metadata or not metadata.startswith(_GROUP_PREFIX) or metadata.startswith(_CHILD_PREFIX):
        return None
    head, sep, rest = metadata.partition(":")
    if not sep:
        raise CorruptTokenError("token has no version separator")
    version = head[len(_GROUP_PREFIX) :]
    if version not in (_GROUP_VERSION, _GROUP_LINEAGE_VERSION):
        raise UnknownTokenVersionError(f"token version {version[:10]!r} is not supported")
    crc, sep, payload = rest.partition(":")
    if not sep or crc != _crc(payload):
        raise CorruptTokenError("token checksum mismatch (truncated or edited)")
    lineage = ""
    if version == _GROUP_LINEAGE_VERSION:
        lineage, sep, payload = payload.partition(":")
        if not sep or not lineage or not valid_lineage(lineage):
            raise CorruptTokenError("token without a valid lineage")
    body, sep, user = payload.partition(_USER)
    empty_body, empty, after = payload.partition(_EMPTY_USER)
    user_metadata: str | None
    if empty and len(empty_body) < len(body):
        if after:
            raise CorruptTokenError("token has text after its empty user metadata")
        body, user_metadata = empty_body, ""
    elif not sep:
        raise CorruptTokenError("token has no user-metadata separator")
    else:
        user_metadata = user or None
    pos_text, _, ranges_text = body.partition(";")
    position = _int36(pos_text)
    ranges: list[tuple[int, int]] = []
    prev = 0
    if ranges_text:
        for pair in ranges_text.split(","):
            gap_text, plus, len_text = pair.partition("+")
            if not plus:
                raise CorruptTokenError("range without '+'")
            start = prev + _int36(gap_text)
            end = start + _int36(len_text)
            ranges.append((start, end))
            prev = end
    try:
        _validate(position, tuple(ranges))
    except ValueError as exc:
        raise CorruptTokenError(str(exc)) from None
    return GroupToken(position, tuple(ranges), user_metadata, lineage)


def _validate(position: int, ranges: tuple[tuple[int, int], ...]) -> None:
    if position < 0:
        raise ValueError("token position must be >= 0")
    prev_end = -1
    for start, end in ranges:
        if not (0 <= start < end):
            raise ValueError(f"empty or negative range [{start}, {end})")
        if start <= prev_end:
            raise ValueError("ranges must be sorted, disjoint and not touching")
        prev_end = end
    if ranges and prev_end > position:
        raise ValueError("pending ranges must lie below the primary position")


# -- child checkpoint ---------------------------------------------------------
def encode_child_checkpoint(cp: ChildCheckpoint) -> str:
    if not (0 <= cp.start <= cp.offset <= cp.end):
        raise ValueError(f"checkpoint offset {cp.offset} outside range [{cp.start}, {cp.end})")
    payload = f"{_b36(cp.start)}:{_b36(cp.end)}"
    crc = _crc(f"{payload}@{cp.offset}")
    return f"{_CHILD_PREFIX}{_CHILD_VERSION}:{crc}:{payload}"


def decode_child_checkpoint(metadata: str | None, offset: int) -> ChildCheckpoint | None:
    """Parse the child's commit metadata, stored with committed offset ``offset``.

    The CRC covers the offset too, so a checkpoint whose offset was moved by a tool
    (kafka-consumer-groups --reset-offsets keeps nothing of ours) is rejected.
    """
    if not metadata or not metadata.startswith(_CHILD_PREFIX) or metadata == NO_CHECKPOINT:
        return None
    head, sep, rest = metadata.partition(":")
    if not sep:
        raise CorruptTokenError("checkpoint has no version separator")
    version = head[len(_CHILD_PREFIX) :]
    if version != _CHILD_VERSION:
        raise UnknownTokenVersionError(f"checkpoint version {version[:10]!r} is not supported")
    crc, sep, payload = rest.partition(":")
    if not sep or crc != _crc(f"{payload}@{offset}"):
        raise CorruptTokenError("checkpoint checksum mismatch")
    start_text, sep, end_text = payload.partition(":")
    if not sep:
        raise CorruptTokenError("checkpoint without range end")
    start, end = _int36(start_text), _int36(end_text)
    if not (start <= offset <= end):
        raise CorruptTokenError("checkpoint offset outside its range")
    return ChildCheckpoint(start, end, offset)
