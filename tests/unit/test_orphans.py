"""The group's commit a helper writes once it has left a group nobody else is in: the last
token minus the chunks the claims log says are done (``_orphans.orphan_write``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from fastrebalance import _orphans
from fastrebalance._orphans import absorb_orphans, orphan_write
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


class _Refusing:
    """A consumer outside the group whose commits the broker refuses while ``members``
    (the group's members it lists) is not empty."""

    def __init__(self, members: list[str]) -> None:
        self.members = members
        self.commits: list[list[TopicPartition]] = []

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        meta = _token(10_000, ((0, 4000),))
        return [TopicPartition(t.topic, t.partition, 0, metadata=meta) for t in tps]

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append(offsets)
        if self.members:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_MEMBER_ID))

    def close(self) -> None:
        pass


@pytest.mark.parametrize("dead", [True, False])
def test_a_refused_write_is_made_again_once_the_dead_members_are_removed(
    monkeypatch: pytest.MonkeyPatch, dead: bool
) -> None:
    # issue 45: the owner SIGKILLed, still listed; the helper's write was refused and never
    # made again: once the owner's session expired nobody wrote the group's offset
    c = _Refusing(["the killed owner"])
    monkeypatch.setattr(_orphans, "_RdConsumer", lambda conf: c)
    calls: list[float] = []

    def remove_dead(timeout_s: float) -> bool:
        calls.append(timeout_s)
        if dead:
            c.members.clear()
        return dead

    conf: dict[str, Any] = {"group.id": "g", "bootstrap.servers": "x"}
    orphans = {("t", 0): {L: [(0, 1000)]}}
    written = absorb_orphans(conf, orphans, MAX, 5.0, remove_dead)
    assert len(calls) == 1 and 0 < calls[0] <= 5.0  # once, within the close()'s bound
    assert written == (1 if dead else 0)
    assert len(c.commits) == (2 if dead else 1)
    assert c.commits[-1][0].offset == 1000
