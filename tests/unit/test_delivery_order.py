"""Delivery order across streams (issue 45, point 5): what a commit of one record may
claim of the other streams' records, from the recent calls' records, without Kafka."""

from __future__ import annotations

from collections import deque

from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from fastrebalance._committing import _before
from fastrebalance._delivery import Delivery
from fastrebalance._routing import Claim

claims = st.lists(
    st.tuples(st.integers(0, 200), st.integers(1, 50), st.booleans()).map(
        lambda t: Claim(t[0], t[0] + t[1], child=t[2])
    ),
    max_size=6,
)


@given(claims, st.lists(st.integers(0, 260), max_size=8))
def test_a_claim_stops_at_the_first_record_handed_out_after(
    cs: list[Claim], after: list[int]
) -> None:
    out = _before(cs, after)
    covered = {o for c in out for o in range(c.start, c.end)}
    assert not covered & set(after)  # nothing handed out after the record
    for c in cs:  # and all of each claim below the first later record in it
        stop = min((o for o in after if c.start <= o < c.end), default=c.end)
        assert set(range(c.start, stop)) <= covered
    assert covered <= {o for c in cs for o in range(c.start, c.end)}
    assert all(
        any(o.start == i.start and o.end <= i.end and o.child == i.child for i in cs)
        for o in out
    )


def _delivery(*calls: list[Message], hot_since: bool = False) -> Delivery:
    """A Delivery whose calls off the hot path returned ``calls``, in order."""
    d = Delivery.__new__(Delivery)
    d._calls, d._window, d._ncalls, d._hot_from = deque(), 0, 0, 0
    d.steady = False
    for msgs in calls:
        d._handed(msgs)
    if hot_since:
        d._hot_from = d._ncalls  # as a move onto the hot path does
    return d


def _m(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset)


def test_the_records_after_one_in_the_latest_call_are_those_of_its_partition() -> None:
    # consume(): fresh records first (offsets 500, 501), then the child's (10, 11)
    d = _delivery([_m(0, 500), _m(1, 7), _m(0, 501), _m(0, 10), _m(0, 11)])
    assert d.place(("t", 0), 501) == ([10, 11], True, False)
    assert d.place(("t", 0), 11) == ([], True, False)
    assert d.place(("t", 1), 7) == ([], True, False)


def test_the_records_of_later_calls_come_after_it() -> None:
    # poll(): one record a call; the last record of each partition is placed after all
    # that came before it, and before what came after
    d = _delivery([_m(0, 500)], [_m(1, 7)], [_m(0, 10)], [_m(1, 8)])
    assert d.place(("t", 0), 10) == ([], True, False)
    assert d.place(("t", 0), 500) == ([10], True, False)
    assert d.place(("t", 1), 7) == ([8], True, False)


def test_a_record_delivered_twice_is_told_apart_by_the_message_itself() -> None:
    first, again = _m(0, 10), _m(0, 10)
    d = _delivery([first, _m(0, 11)], [again])
    assert d.place(("t", 0), 10, again) == ([], True, True)
    assert d.place(("t", 0), 10, first) == ([11, 10], True, True)
    # the offset alone (a Message built again): the newest delivery; the commit path then
    # extends nothing, for two runs handed the offset out (Committer._deliveries)
    assert d.place(("t", 0), 10, _m(0, 10)) == ([], True, False)


def test_a_record_not_in_the_recent_calls_has_no_known_place() -> None:
    d = _delivery([_m(0, 500)], hot_since=True)
    assert d.place(("t", 0), 499) is None
    assert d.place(("t", 1), 500) is None
    # hot calls since: the primary's records may follow it
    assert d.place(("t", 0), 500) == ([], False, False)


def test_the_window_keeps_the_latest_call_whatever_its_size() -> None:
    big = [_m(0, o) for o in range(5000)]
    d = _delivery([_m(0, 9000)], big)
    assert d.place(("t", 0), 9000) is None  # dropped: the window is full
    assert d.place(("t", 0), 4998) == ([4999], True, False)
