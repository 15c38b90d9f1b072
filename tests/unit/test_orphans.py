"""The group's commit a helper writes once it has left a group nobody else is in: the last
token minus the chunks the claims log says are done (``_orphans.orphan_write``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastrebalance._orphans import orphan_write
from fastrebalance._planning import restore
from fastrebalance._token import GroupToken, encode_group_token

MAX = 4096


L = "1a2b"


def _token(
    position: int, ranges: tuple[tuple[int, int], ...], user: str = "", lineage: str = L
) -> str:
    return encode_group_token(GroupToken(position, ranges, user, lineage), MAX)[0]


def test_done_chunks_leave_the_pending_ranges_and_the_offset_moves_past_them() -> None:
    meta = _token(10_000, ((0, 4000),), "app")
    w = orphan_write(0, meta, {L: [(0, 1000), (1000, 2000), (3000, 4000)]}, MAX)
    assert w is not None and w.offset == 2000
    back = restore(w.offset, w.metadata)
    assert back.position == 10_000 and back.ranges.as_tuple() == ((2000, 3000),)
    assert back.user_metadata == "app"  # the application's metadata is kept
    assert back.lineage == L  # the next owner absorbs the rest in the same lineage


def test_done_chunks_of_another_lineage_are_not_the_tokens() -> None:
    """Issue 48: a done record of an earlier reading of the same offsets (before an
    operator's reset) says nothing of the backlog the token holds now."""
    meta = _token(10_000, ((0, 4000),))
    assert orphan_write(0, meta, {"0ld": [(0, 4000)]}, MAX) is None
    w = orphan_write(0, meta, {"0ld": [(0, 4000)], L: [(0, 1000)]}, MAX)
    assert w is not None and w.offset == 1000
    # a token with no lineage (an older version's, or none drawn): nothing is its
    assert orphan_write(0, _token(10_000, ((0, 4000),), lineage=""), {"": [(0, 4000)]}, MAX) is None


def test_every_chunk_done_writes_the_position_as_a_plain_commit() -> None:
    w = orphan_write(0, _token(10_000, ((0, 4000),)), {L: [(0, 4000)]}, MAX)
    assert w is not None and (w.offset, w.metadata) == (10_000, "")


def test_nothing_to_say_without_a_token_or_a_done_pending_chunk() -> None:
    assert orphan_write(500, "", {L: [(0, 1000)]}, MAX) is None  # a plain commit: no token
    assert orphan_write(0, _token(10_000, ((0, 4000),)), {L: [(5000, 6000)]}, MAX) is None
    # a done chunk above the token's position is not the token's to absorb
    assert orphan_write(0, _token(3000, ((0, 1000),)), {L: [(3000, 4000)]}, MAX) is None
    # a token that does not match its offset (another tool moved it) is not trusted
    assert orphan_write(7, _token(10_000, ((0, 4000),)), {L: [(0, 4000)]}, MAX) is None


@given(
    st.lists(st.tuples(st.integers(0, 99), st.integers(1, 20)), max_size=6),
    st.lists(st.tuples(st.integers(0, 119), st.integers(1, 30)), max_size=6),
)
def test_the_write_never_claims_an_offset_neither_the_token_nor_a_done_chunk_did(
    pending: list[tuple[int, int]], done: list[tuple[int, int]]
) -> None:
    from fastrebalance._ranges import RangeSet

    position = 120
    ranges = RangeSet()
    for s, n in pending:
        ranges.add(s, min(s + n, position))
    if not ranges:
        return
    meta = _token(position, ranges.as_tuple())
    done_ranges = [(s, s + n) for s, n in done]
    w = orphan_write(ranges.first() or 0, meta, {L: done_ranges}, MAX)  # type: ignore[arg-type]
    if w is None:
        return
    after = restore(w.offset, w.metadata).ledger()
    for o in range(position):
        unprocessed = o in ranges and not any(s <= o < e for s, e in done_ranges)
        if unprocessed:  # still pending for whoever restores the write
            assert o >= w.offset and o in after.ranges, (o, w.offset, after.ranges)
