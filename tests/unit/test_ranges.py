"""RangeSet against a model: a plain Python set of the pending offsets (small, 0..200)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._ranges import RangeSet

LIMIT = 200

offsets = st.integers(0, LIMIT)
pairs = st.tuples(offsets, offsets).map(sorted).map(tuple)

ops = st.one_of(
    st.tuples(st.just("add"), pairs),
    st.tuples(st.just("remove"), pairs),
    st.tuples(st.just("remove_below"), st.integers(-5, LIMIT + 5)),
    st.tuples(st.just("truncate_from"), st.integers(-5, LIMIT + 5)),
)

range_lists = st.lists(pairs, max_size=25)


# -- helpers -------------------------------------------------------------------
def as_set(rs: RangeSet) -> set[int]:
    out: set[int] = set()
    for start, end in rs:
        out.update(range(start, end))
    return out


def runs(model: set[int]) -> list[tuple[int, int]]:
    """The maximal runs of consecutive offsets: the canonical ranges of ``model``."""
    out: list[tuple[int, int]] = []
    for o in sorted(model):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def assert_canonical(rs: RangeSet) -> None:
    items = list(rs)
    for start, end in items:
        assert isinstance(start, int) and isinstance(end, int)
        assert 0 <= start < end, items
    for (_, e0), (s1, _) in pairwise(items):
        # sorted, disjoint and not touching: touching ranges must have merged
        assert e0 < s1, items
    assert len(rs) == len(items)
    assert bool(rs) == bool(items)


def apply(rs: RangeSet, model: set[int], op: tuple) -> None:
    name, arg = op
    if name == "add":
        rs.add(*arg)
        model.update(range(*arg))
    elif name == "remove":
        rs.remove(*arg)
        model.difference_update(range(*arg))
    elif name == "remove_below":
        rs.remove_below(arg)
        model.difference_update(range(0, max(arg, 0)))
    else:
        rs.truncate_from(arg)
        model.difference_update(range(max(arg, 0), LIMIT + 1))


# -- model-based ---------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(st.lists(ops, max_size=40))
def test_operations_match_set_model(sequence: list[tuple]) -> None:
    rs = RangeSet()
    model: set[int] = set()
    for op in sequence:
        apply(rs, model, op)
        assert_canonical(rs)
        assert as_set(rs) == model, op
        assert list(rs) == runs(model)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=30), st.lists(st.integers(-3, LIMIT + 3), max_size=30))
def test_queries_match_set_model(sequence: list[tuple], probes: list[int]) -> None:
    rs = RangeSet()
    model: set[int] = set()
    for op in sequence:
        apply(rs, model, op)
    model_runs = runs(model)

    assert rs.first() == (min(model) if model else None)
    assert rs.last_end() == (max(model) + 1 if model else None)
    assert rs.count() == len(model)
    assert rs.as_tuple() == tuple(model_runs)

    for p in [*probes, 0, LIMIT]:
        assert (p in rs) == (p in model)
        # range_containing: the maximal run holding p, or None
        expected = next(((s, e) for s, e in model_runs if s <= p < e), None)
        assert rs.range_containing(p) == expected, p
        # next_from: the first pending piece at or after p, clipped to start at p
        nxt = next(((max(s, p), e) for s, e in model_runs if e > p), None)
        assert rs.next_from(p) == nxt, p


@settings(max_examples=200, deadline=None)
@given(range_lists, st.randoms(use_true_random=False))
def test_construction_is_order_independent_and_canonical(
    ranges: list[tuple[int, int]], rnd
) -> None:
    shuffled = list(ranges)
    rnd.shuffle(shuffled)
    a, b = RangeSet(ranges), RangeSet(shuffled)
    assert a == b
    assert repr(a) == repr(b)
    assert_canonical(a)
    model: set[int] = set()
    for s, e in ranges:
        model.update(range(s, e))
    assert as_set(a) == model


# -- coalescing ----------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(range_lists, st.integers(1, 30))
def test_coalesced_is_a_gap_filling_superset(ranges: list[tuple[int, int]], k: int) -> None:
    rs = RangeSet(ranges)
    before = rs.as_tuple()
    original = as_set(rs)
    out = rs.coalesced(k)

    assert rs.as_tuple() == before, "coalesced() must not modify its input"
    assert_canonical(out)
    assert len(out) <= k
    result = as_set(out)
    assert original <= result, "coalescing must never drop a pending offset"
    if k >= len(rs):
        assert out == rs
        assert out is not rs
        return
    assert len(out) == k  # no more merging than needed
    assert out.first() == rs.first()
    assert out.last_end() == rs.last_end()
    added = result - original
    gaps = {(e0, s1) for (_, e0), (s1, _) in pairwise(before)}
    filled = {g for g in gaps if g[0] in added}
    unfilled = gaps - filled
    for start, end in filled:
        # a gap is filled whole or not at all, and only gaps are filled
        assert set(range(start, end)) <= added
    assert added == {o for start, end in filled for o in range(start, end)}
    # the gaps filled are the smallest ones
    if filled and unfilled:
        assert max(e - s for s, e in filled) <= min(e - s for s, e in unfilled)


def test_coalesced_fills_smallest_gap_first() -> None:
    rs = RangeSet([(0, 10), (12, 20), (50, 60), (61, 70)])
    assert rs.coalesced(3).as_tuple() == ((0, 10), (12, 20), (50, 70))
    assert rs.coalesced(2).as_tuple() == ((0, 20), (50, 70))
    assert rs.coalesced(1).as_tuple() == ((0, 70),)


def test_coalesced_rejects_zero_and_copies() -> None:
    rs = RangeSet([(1, 3)])
    with pytest.raises(ValueError):
        rs.coalesced(0)
    out = rs.coalesced(5)
    out.add(10, 20)
    assert rs.as_tuple() == ((1, 3),), "the copy must not alias the original"


# -- examples and argument checks -------------------------------------------------
def test_touching_ranges_merge_and_overlaps_absorb() -> None:
    rs = RangeSet()
    rs.add(10, 20)
    rs.add(20, 30)
    assert rs.as_tuple() == ((10, 30),)
    rs.add(40, 50)
    rs.add(5, 45)
    assert rs.as_tuple() == ((5, 50),)
    rs.add(7, 7)  # empty: no-op
    assert rs.as_tuple() == ((5, 50),)


def test_remove_splits_and_boundaries() -> None:
    rs = RangeSet([(10, 30)])
    rs.remove(15, 20)
    assert rs.as_tuple() == ((10, 15), (20, 30))
    rs.remove(0, 10)  # touching on the left, nothing removed
    rs.remove(30, 40)  # touching on the right, nothing removed
    assert rs.as_tuple() == ((10, 15), (20, 30))
    rs.remove_below(12)
    assert rs.as_tuple() == ((12, 15), (20, 30))
    rs.truncate_from(25)
    assert rs.as_tuple() == ((12, 15), (20, 25))
    rs.truncate_from(-1)
    assert not rs
    assert rs.first() is None and rs.last_end() is None and rs.count() == 0


def test_copy_is_independent() -> None:
    rs = RangeSet([(0, 5)])
    clone = rs.copy()
    clone.remove(0, 5)
    assert rs.as_tuple() == ((0, 5),)
    assert clone != rs


def test_contains_non_int_is_false() -> None:
    rs = RangeSet([(0, 10)])
    assert 5 in rs
    assert 5.0 not in rs
    assert "5" not in rs
    assert (RangeSet() == object()) is False


@pytest.mark.parametrize(
    ("start", "end", "exc"),
    [(5, 3, ValueError), (-1, 3, ValueError), (1.0, 2, TypeError), (1, "2", TypeError)],
)
def test_invalid_ranges_rejected(start, end, exc) -> None:
    rs = RangeSet([(0, 10)])
    with pytest.raises(exc):
        rs.add(start, end)
    with pytest.raises(exc):
        rs.remove(start, end)
    assert rs.as_tuple() == ((0, 10),)
