"""The commit-metadata codec: round trips, the size cap, and hostile input."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastrebalance._ranges import RangeSet
from fastrebalance._token import (
    DEFAULT_METADATA_MAX_BYTES,
    ChildCheckpoint,
    CorruptTokenError,
    GroupToken,
    TokenError,
    TokenTooLargeError,
    UnknownTokenVersionError,
    decode_child_checkpoint,
    decode_group_token,
    encode_child_checkpoint,
    encode_group_token,
)

MAX_OFFSET = 2**53
UNLIMITED = 10**9


# -- strategies ----------------------------------------------------------------
LINEAGES = st.one_of(
    st.just(""), st.text(alphabet="0123456789abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=32)
)


@st.composite
def group_tokens(
    draw, bound: int = MAX_OFFSET, max_ranges: int = 12, user=None, lineage=LINEAGES
) -> GroupToken:
    """Sorted, disjoint, non-touching ranges below a position, all <= bound; a lineage
    (group-wide catch-up) or none."""
    scale = draw(st.sampled_from([bound, 1000, 50]))
    edges = sorted(draw(st.sets(st.integers(0, scale), max_size=2 * max_ranges)))
    if len(edges) % 2:
        edges.pop()
    ranges = tuple(zip(edges[0::2], edges[1::2], strict=True))
    floor = ranges[-1][1] if ranges else 0
    position = draw(st.integers(floor, max(draw(st.sampled_from([bound, scale])), floor)))
    metadata = draw(user if user is not None else st.text(max_size=40))
    return GroupToken(position, ranges, metadata, draw(lineage))


@st.composite
def checkpoints(draw) -> ChildCheckpoint:
    a, b, c = sorted(draw(st.lists(st.integers(0, MAX_OFFSET), min_size=3, max_size=3)))
    return ChildCheckpoint(a, c, b)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def crafted(payload: str, version: str = "1") -> str:
    """A group token with a correct CRC around an arbitrary payload (CRC computed here,
    independently of the module, from the documented format)."""
    return f"~fr{version}:{zlib.crc32(payload.encode('utf-8')):08x}:{payload}"


def covers(outer: tuple[tuple[int, int], ...], inner: tuple[tuple[int, int], ...]) -> bool:
    """Every offset of ``inner`` is in ``outer`` (checked by range, offsets can be 2**53)."""
    rs = RangeSet(outer)
    for start, end in inner:
        piece = rs.range_containing(start)
        if piece is None or piece[1] < end:
            return False
    return True


# -- wire format ----------------------------------------------------------------
def test_wire_format_is_stable() -> None:
    # 100 = "2s", 70 = "1y", 20 = "k" in base 36; ranges are gap+length pairs
    token = GroupToken(100, ((70, 90), (95, 99)), "app")
    text, written = encode_group_token(token)
    payload = "2s;1y+k,5+4|app"
    assert text == f"~fr1:{zlib.crc32(payload.encode()):08x}:{payload}"
    assert written == token
    assert token.safe_offset == 70
    assert GroupToken(100).safe_offset == 100

    cp = ChildCheckpoint(70, 120, 100)
    ctext = encode_child_checkpoint(cp)
    assert ctext == f"~frc1:{zlib.crc32(b'1y:3c@100'):08x}:1y:3c"


def test_a_lineage_is_a_second_version_whose_checksum_covers_it() -> None:
    # group-wide catch-up: the backlog's lineage travels to the next owner; a version that
    # does not know ~fr2 ignores the token (UnknownTokenVersionError) and re-reads: safe
    token = GroupToken(100, ((70, 90), (95, 99)), "app", "4f0c2a")
    text, written = encode_group_token(token)
    signed = "4f0c2a:2s;1y+k,5+4|app"
    assert text == f"~fr2:{zlib.crc32(signed.encode()):08x}:{signed}"
    assert written == token and decode_group_token(text) == token
    # without a lineage the token is the first version's, byte for byte
    assert encode_group_token(GroupToken(100, ((70, 90),), "app"))[0].startswith("~fr1:")
    # another lineage under the same checksum is an edit
    with pytest.raises(CorruptTokenError):
        decode_group_token(text.replace("4f0c2a", "4f0c2b"))
    for bad in ("", "a:b", "ABC", "x" * 33):
        with pytest.raises(CorruptTokenError):
            decode_group_token(crafted(f"{bad}:2s|", version="2"))
        if bad:
            with pytest.raises(ValueError):
                encode_group_token(GroupToken(100, (), "", bad))


# -- group token round trip ------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(group_tokens())
def test_group_token_round_trip(token: GroupToken) -> None:
    text, written = encode_group_token(token, UNLIMITED)
    assert written == token
    assert decode_group_token(text) == token
    assert text.startswith("~fr2:" if token.lineage else "~fr1:")
    fits = utf8_len(text) <= DEFAULT_METADATA_MAX_BYTES
    text_default, written_default = encode_group_token(token)
    if fits:
        assert (text_default, written_default) == (text, token)
    assert decode_group_token(text_default) == written_default


@settings(max_examples=400, deadline=None)
@given(
    group_tokens(max_ranges=30, user=st.text(max_size=12)),
    st.integers(18, 160),
)
def test_size_cap_coalesces_without_losing_offsets(token: GroupToken, max_bytes: int) -> None:
    try:
        text, written = encode_group_token(token, max_bytes)
    except TokenTooLargeError:
        # only legitimate when not even a single coalesced range fits
        one = RangeSet(token.ranges).coalesced(1).as_tuple()
        smallest, _ = encode_group_token(
            GroupToken(token.position, one, token.user_metadata), UNLIMITED
        )
        assert utf8_len(smallest) > max_bytes
        return
    assert utf8_len(text) <= max_bytes
    assert decode_group_token(text) == written
    assert written.position == token.position
    assert written.user_metadata == token.user_metadata
    if written.lineage != token.lineage:
        # coalescing keeps the lineage: it is dropped (the next owner draws a new one: safe)
        # only when even one range does not fit with it
        assert written.lineage == ""
        one = RangeSet(token.ranges).coalesced(1).as_tuple()
        with_lineage, _ = encode_group_token(
            GroupToken(token.position, one, token.user_metadata, token.lineage), UNLIMITED
        )
        assert utf8_len(with_lineage) > max_bytes
    assert written.safe_offset == token.safe_offset
    assert covers(written.ranges, token.ranges), "coalescing lost an offset"
    if token.ranges:
        # only gaps were filled: nothing outside first..last end
        assert written.ranges[0][0] == token.ranges[0][0]
        assert written.ranges[-1][1] == token.ranges[-1][1]
    if written.ranges != token.ranges:
        # as many ranges as fit (bisection found the best), no more duplicates than needed
        more = RangeSet(token.ranges).coalesced(len(written.ranges) + 1).as_tuple()
        bigger, _ = encode_group_token(
            GroupToken(token.position, more, token.user_metadata, written.lineage), UNLIMITED
        )
        assert utf8_len(bigger) > max_bytes


def test_five_thousand_crash_ranges_fit_in_default_size() -> None:
    rnd = random.Random(333)
    ranges = []
    offset = rnd.randrange(0, 10**12)
    for _ in range(5000):
        offset += rnd.randrange(1, 10**6)
        length = rnd.randrange(1, 10**6)
        ranges.append((offset, offset + length))
        offset += length
    token = GroupToken(offset + 10**9, tuple(ranges), "user-state")
    full, _ = encode_group_token(token, UNLIMITED)
    assert utf8_len(full) > DEFAULT_METADATA_MAX_BYTES  # the test really needs coalescing

    text, written = encode_group_token(token)
    assert utf8_len(text) <= DEFAULT_METADATA_MAX_BYTES
    assert decode_group_token(text) == written
    assert 1 < len(written.ranges) < 5000
    assert covers(written.ranges, token.ranges)
    assert written.safe_offset == ranges[0][0]
    assert written.user_metadata == "user-state"


def test_dense_ranges_cover_every_original_offset() -> None:
    # small offsets, so coverage can be checked offset by offset
    ranges = tuple((3 * i, 3 * i + 1 + (i % 2)) for i in range(2000))
    token = GroupToken(7000, ranges)
    text, _ = encode_group_token(token, 300)
    assert utf8_len(text) <= 300
    original = {o for s, e in ranges for o in range(s, e)}
    result = {o for s, e in decode_group_token(text).ranges for o in range(s, e)}
    assert original <= result
    assert result <= set(range(ranges[0][0], ranges[-1][1]))


def test_user_metadata_too_large() -> None:
    with pytest.raises(TokenTooLargeError):
        encode_group_token(GroupToken(10, ((1, 2),), "x" * 4000))
    with pytest.raises(TokenTooLargeError):
        encode_group_token(GroupToken(10, (), "x" * 4000))
    # the cap is in UTF-8 bytes, not characters: 2000 'é' are 4000 bytes
    with pytest.raises(TokenTooLargeError):
        encode_group_token(GroupToken(10, ((1, 2),), "é" * 2000))
    text, _ = encode_group_token(GroupToken(10, ((1, 2),), "é" * 1900))
    assert utf8_len(text) <= DEFAULT_METADATA_MAX_BYTES
    # TokenTooLargeError is not a TokenError: callers must not confuse them
    assert not issubclass(TokenTooLargeError, TokenError)


@pytest.mark.parametrize(
    "token",
    [
        GroupToken(-1),
        GroupToken(10, ((5, 3),)),
        GroupToken(10, ((5, 5),)),
        GroupToken(10, ((-2, 3),)),
        GroupToken(10, ((4, 6), (1, 2))),
        GroupToken(10, ((1, 4), (3, 6))),
        GroupToken(10, ((1, 4), (4, 6))),
        GroupToken(10, ((1, 11),)),
    ],
)
def test_encode_rejects_invalid_tokens(token: GroupToken) -> None:
    with pytest.raises(ValueError) as info:
        encode_group_token(token)
    assert not isinstance(info.value, TokenTooLargeError)


# -- hostile input ----------------------------------------------------------------
@pytest.mark.parametrize(
    "metadata", [None, "", "hello", "fr1:00:1|", "~f", "~FR1:x", " ~fr1:x", "~frc1:abc:1:2"]
)
def test_foreign_metadata_is_not_ours(metadata) -> None:
    assert decode_group_token(metadata) is None


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.text().map(lambda t: "~fr" + t),
        st.text().map(lambda t: "~fr1:" + t),
        st.text(alphabet="~fr1:0123456789abcdefz+;,|-").map(lambda t: "~fr1:" + t),
    )
)
def test_arbitrary_text_never_decodes_to_a_token(text: str) -> None:
    try:
        result = decode_group_token(text)
    except TokenError:
        return
    # random text cannot carry a correct CRC: it is foreign, never a token
    assert result is None


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789abcdefxyzA+;,|:-"),
        st.lists(st.integers(0, 40), max_size=8).map(
            lambda xs: (
                ";".join([str(x) for x in xs[:1]] + [",".join(f"{x}+{x}" for x in xs[1:])]) + "|u"
            )
        ),
    )
)
def test_parser_behind_a_valid_crc_is_strict(payload: str) -> None:
    """With the CRC right, the parser itself must still reject anything malformed and
    never return a token that breaks the invariants."""
    try:
        token = decode_group_token(crafted(payload))
    except TokenError:
        return
    assert token is not None
    prev = -1
    for start, end in token.ranges:
        assert prev < start < end
        prev = end
    assert prev <= token.position
    # whatever was accepted re-encodes to the same token
    again, _ = encode_group_token(token, UNLIMITED)
    assert decode_group_token(again) == token


@pytest.mark.parametrize(
    "payload",
    [
        "zzzzzzzzzzzzzz|",  # 14 base-36 digits: beyond int64
        "a;0+0|",  # empty range
        "a;1+1,0+1|",  # touching ranges
        "5;0+a|",  # range above the position
        "A|",  # upper case is not base 36 here
        "a",  # no user-metadata separator
        "a;5|",  # range without '+'
        "-1|",
        "a;+1|",
        "a;1+|",
        "|",
    ],
)
def test_malformed_payload_with_valid_crc_is_corrupt(payload: str) -> None:
    with pytest.raises(CorruptTokenError):
        decode_group_token(crafted(payload))


def test_valid_crafted_payload_is_accepted() -> None:
    assert decode_group_token(crafted("a;1+2,3+4|a|b:c")) == GroupToken(
        10, ((1, 3), (6, 10)), "a|b:c"
    )


@pytest.mark.parametrize(
    "metadata",
    [
        "~fr9:00000000:a|",
        "~fr3:x",
        crafted("a|", version="3"),
        crafted("a|", version="10"),
        "~fr:1",
    ],
)
def test_unknown_version(metadata: str) -> None:
    with pytest.raises(UnknownTokenVersionError):
        decode_group_token(metadata)


def test_no_version_separator_is_corrupt() -> None:
    with pytest.raises(CorruptTokenError):
        decode_group_token("~fr1")


@settings(max_examples=500, deadline=None)
@given(group_tokens(user=st.text(max_size=10)), st.data())
def test_any_single_edit_is_detected(token: GroupToken, data) -> None:
    text, _ = encode_group_token(token, UNLIMITED)
    i = data.draw(st.integers(0, len(text) - 1), label="index")
    kind = data.draw(st.sampled_from(["replace", "delete", "insert", "truncate"]), label="kind")
    if kind == "replace":
        ch = data.draw(st.characters(), label="char")
        assume(ch != text[i])
        mutated = text[:i] + ch + text[i + 1 :]
    elif kind == "delete":
        mutated = text[:i] + text[i + 1 :]
    elif kind == "insert":
        mutated = text[:i] + data.draw(st.characters(), label="char") + text[i:]
    else:
        mutated = text[:i]
    assume(mutated != text)
    try:
        result = decode_group_token(mutated)
    except TokenError:
        return
    assert result is None, f"edited token {mutated!r} decoded to {result!r}"


def test_a_lone_surrogate_is_corrupt_not_an_encoding_error() -> None:
    """Found by test_any_single_edit_is_detected: the checksum encoded the text strictly,
    so a lone surrogate raised UnicodeEncodeError instead of TokenError."""
    text, _ = encode_group_token(GroupToken(0, ()), UNLIMITED)
    with pytest.raises(CorruptTokenError):
        decode_group_token(text[:14] + "\ud800" + text[15:])


# -- child checkpoints -----------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(checkpoints())
def test_checkpoint_round_trip(cp: ChildCheckpoint) -> None:
    text = encode_child_checkpoint(cp)
    assert text.startswith("~frc1:")
    assert decode_child_checkpoint(text, cp.offset) == cp
    # a checkpoint never passes for a group token, nor the reverse
    assert decode_group_token(text) is None
    group_text, _ = encode_group_token(
        GroupToken(cp.end, ((cp.start, cp.end),) if cp.start < cp.end else ()), UNLIMITED
    )
    assert decode_child_checkpoint(group_text, cp.offset) is None


@settings(max_examples=300, deadline=None)
@given(checkpoints(), st.integers(0, MAX_OFFSET))
def test_checkpoint_moved_offset_is_corrupt(cp: ChildCheckpoint, other: int) -> None:
    assume(other != cp.offset)
    text = encode_child_checkpoint(cp)
    with pytest.raises(CorruptTokenError):
        decode_child_checkpoint(text, other)


@settings(max_examples=300, deadline=None)
@given(checkpoints(), st.data())
def test_checkpoint_single_edit_is_detected(cp: ChildCheckpoint, data) -> None:
    text = encode_child_checkpoint(cp)
    i = data.draw(st.integers(0, len(text) - 1))
    ch = data.draw(st.characters())
    mutated = data.draw(st.sampled_from([text[:i] + ch + text[i + 1 :], text[:i]]))
    assume(mutated != text)
    try:
        result = decode_child_checkpoint(mutated, cp.offset)
    except TokenError:
        return
    assert result is None


@pytest.mark.parametrize(
    ("metadata", "exc"),
    [
        ("~frc9:00000000:1:2", UnknownTokenVersionError),
        ("~frc1", CorruptTokenError),
        ("~frc1:00000000:1:2", CorruptTokenError),
    ],
)
def test_checkpoint_bad_input(metadata: str, exc: type) -> None:
    with pytest.raises(exc):
        decode_child_checkpoint(metadata, 1)


def test_checkpoint_crafted_offset_outside_range_is_corrupt() -> None:
    payload = "a:k"  # [10, 20)
    text = f"~frc1:{zlib.crc32(f'{payload}@25'.encode()):08x}:{payload}"
    with pytest.raises(CorruptTokenError):
        decode_child_checkpoint(text, 25)
    text = f"~frc1:{zlib.crc32(f'{payload}@15'.encode()):08x}:{payload}"
    assert decode_child_checkpoint(text, 15) == ChildCheckpoint(10, 20, 15)


@pytest.mark.parametrize("metadata", [None, "", "app-state", "~fr1:0:a|"])
def test_checkpoint_foreign_metadata(metadata) -> None:
    assert decode_child_checkpoint(metadata, 5) is None


@pytest.mark.parametrize("cp", [ChildCheckpoint(5, 10, 11), ChildCheckpoint(5, 10, 4)])
def test_checkpoint_encode_rejects_offset_outside_range(cp: ChildCheckpoint) -> None:
    with pytest.raises(ValueError):
        encode_child_checkpoint(cp)
