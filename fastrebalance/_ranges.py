"""Pending offset ranges of one partition: pure bookkeeping, no Kafka.

A ``RangeSet`` holds the offsets of a partition that are known *not yet processed*
below the primary consumer's position: the backlog the child consumer must read.
Every operation keeps the ranges half-open ``[start, end)``, disjoint, sorted and
non-adjacent (touching ranges merge), so that the encoded token is canonical and
two equal sets always compare and encode equal.

The safety invariant this module protects: an operation may only *add* offsets
that are unprocessed or re-readable (``add``, ``coalesced``), and may only *remove*
offsets that the caller has proven processed (``remove``, ``remove_below``) or that
another reader now owns (``truncate_from``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sortedcontainers import SortedList

__all__ = ["RangeSet"]

_AFTER = 1 << 63  # (offset, _AFTER) sorts after every range starting at offset


class RangeSet:
    """Disjoint half-open offset ranges ``[start, end)``, as ``(start, end)`` tuples in a
    ``SortedList``.

    Lookups are O(log n) by bisecting the tuples (disjoint ranges sort by their starts);
    the hot path (is this child record still inside its range?) never touches this class:
    the child caches its current range as two ints. The list is created with the first
    range: most partitions of a large assignment have nothing pending, and an empty
    ``SortedList`` still costs a few hundred bytes.
    """

    __slots__ = ("_items",)

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._items: SortedList | None = None
        for start, end in ranges:
            self.add(start, end)

    def _list(self) -> SortedList:
        if self._items is None:
            self._items = SortedList()
        return self._items

    # -- queries ---------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._items or ())

    def __len__(self) -> int:
        return len(self._items) if self._items else 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RangeSet):
            return self.as_tuple() == other.as_tuple()
        return NotImplemented

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        return self.range_containing(offset) is not None

    def copy(self) -> RangeSet:
        clone = RangeSet()
        if self._items:
            clone._items = self._items.copy()
        return clone

    def as_tuple(self) -> tuple[tuple[int, int], ...]:
        return tuple(self)

    def first(self) -> int | None:
        """Lowest pending offset, or None when nothing is pending."""
        return self._items[0][0] if self._items else None

    def last_end(self) -> int | None:
        return self._items[-1][1] if self._items else None

    def count(self) -> int:
        """Number of offsets pending (records still to read, gaps excluded)."""
        return sum(end - start for start, end in self)

    def _at_or_before(self, offset: int) -> int:
        """Index of the last range starting at or before ``offset`` (-1: none)."""
        return self._items.bisect_right((offset, _AFTER)) - 1 if self._items else -1

    def range_containing(self, offset: int) -> tuple[int, int] | None:
        i = self._at_or_before(offset)
        if i < 0:
            return None
        start, end = self._list()[i]
        return (start, end) if offset < end else None

    def next_from(self, offset: int) -> tuple[int, int] | None:
        """The first pending piece at or after ``offset``, clipped to start there."""
        if not self._items:
            return None
        items = self._items
        i = self._at_or_before(offset)
        if i >= 0:
            start, end = items[i]
            if offset < end:
                return (max(start, offset), end)
        i += 1
        if i < len(items):
            start, end = items[i]
            return (start, end)
        return None

    def last_overlapping(self, start: int, end: int) -> tuple[int, int] | None:
        """The highest range that shares an offset with ``[start, end)``."""
        if not self._items:
            return None
        i = self._items.bisect_left((end, -1)) - 1
        if i < 0:
            return None
        s, e = self._items[i]
        return (s, e) if e > start else None

    # -- updates ---------------------------------------------------------------
    def add(self, start: int, end: int) -> None:
        """Union with ``[start, end)``; merges with overlapping or touching ranges."""
        _check(start, end)
        if start == end:
            return
        items = self._list()
        i = self._at_or_before(start)
        if i >= 0:
            s0, e0 = items[i]
            if e0 >= start:  # overlaps or touches on the left
                start = s0
                end = max(end, e0)
                del items[i]
        # absorb every range starting inside [start, end]
        i = items.bisect_left((start, -1))
        while i < len(items):
            s1, e1 = items[i]
            if s1 > end:
                break
            end = max(end, e1)
            del items[i]
        items.add((start, end))

    def remove(self, start: int, end: int) -> None:
        """Difference with ``[start, end)``: those offsets are proven processed."""
        _check(start, end)
        if start == end or not self._items:
            return
        items = self._items
        i = max(self._at_or_before(start), 0)
        pieces: list[tuple[int, int]] = []
        doomed: list[tuple[int, int]] = []
        while i < len(items):
            s, e = items[i]
            if s >= end:
                break
            if e > start:
                doomed.append((s, e))
                if s < start:
                    pieces.append((s, start))
                if e > end:
                    pieces.append((end, e))
            i += 1
        for item in doomed:
            items.remove(item)
        items.update(pieces)

    def remove_below(self, offset: int) -> None:
        """Drop every offset < ``offset`` (all of them are proven processed)."""
        first = self.first()
        if first is not None and offset > first:
            self.remove(first, offset)

    def truncate_from(self, offset: int) -> None:
        """Drop every offset >= ``offset``: a reader positioned there re-reads them."""
        end = self.last_end()
        if end is not None and offset < end:
            self.remove(max(offset, 0), end)

    def coalesced(self, max_ranges: int) -> RangeSet:
        """A superset with at most ``max_ranges`` ranges, filling the smallest gaps.

        Filling a gap re-reads offsets already processed (duplicates), never drops
        one: the only safe direction when the token must shrink.
        """
        if max_ranges < 1:
            raise ValueError("max_ranges must be >= 1")
        items = list(self)
        if len(items) <= max_ranges:
            return self.copy()
        gaps = sorted(
            ((items[k + 1][0] - items[k][1], k) for k in range(len(items) - 1)),
        )
        fill = {k for _, k in gaps[: len(items) - max_ranges]}
        kept: list[tuple[int, int]] = []
        start, end = items[0]
        for k in range(len(items) - 1):
            nxt_start, nxt_end = items[k + 1]
            if k in fill:
                end = nxt_end
            else:
                kept.append((start, end))
                start, end = nxt_start, nxt_end
        kept.append((start, end))
        out = RangeSet()
        out._items = SortedList(kept)
        return out


def _check(start: int, end: int) -> None:
    if not (isinstance(start, int) and isinstance(end, int)):
        raise TypeError("offsets must be int")
    if start < 0 or end < start:
        raise ValueError(f"invalid offset range [{start}, {end})")
