"""Delivery order across streams (issue 45, point 5): what a commit of one record may
claim of the other streams' records, from the latest call's records, without Kafka."""

from __future__ import annotations

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


def _delivery(latest: list[Message], latest_only: bool) -> Delivery:
    d = Delivery.__new__(Delivery)
    d.latest = tuple(latest)
    d.latest_only = latest_only
    return d


def _m(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset)


def test_the_records_after_one_in_the_latest_call_are_those_of_its_partition() -> None:
    # consume(): fresh records first (offsets 500, 501), then the child's (10, 11)
    d = _delivery([_m(0, 500), _m(1, 7), _m(0, 501), _m(0, 10), _m(0, 11)], True)
    assert d.after_in_latest(("t", 0), 501) == ([10, 11], True, False)
    assert d.after_in_latest(("t", 0), 11) == ([], True, False)
    assert d.after_in_latest(("t", 1), 7) == ([], True, False)


def test_a_record_delivered_twice_is_told_apart_by_the_message_itself() -> None:
    again = _m(0, 10)
    d = _delivery([_m(0, 10), _m(0, 11), again], True)
    assert d.after_in_latest(("t", 0), 10, again) == ([], True, True)
    # the offset alone names its first delivery in the call: the later ones follow it
    assert d.after_in_latest(("t", 0), 10) == ([11, 10], True, False)
    assert d.after_in_latest(("t", 0), 10, _m(0, 10)) == ([11, 10], True, False)


def test_a_record_not_in_the_latest_call_has_no_known_place() -> None:
    d = _delivery([_m(0, 500)], False)
    assert d.after_in_latest(("t", 0), 499) is None
    assert d.after_in_latest(("t", 1), 500) is None
    # hot calls since: the primary's records may follow it
    assert d.after_in_latest(("t", 0), 500) == ([], False, False)
