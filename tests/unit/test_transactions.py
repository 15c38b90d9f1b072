"""The open transaction's bookkeeping: claims reach the ledger only once it commits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrebalance._commits import Change, apply_change, group_write
from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import Claim
from fastrebalance._token import TokenTooLargeError
from fastrebalance._transactions import OpenTransaction

KEY = ("t", 0)


def _ledger() -> Ledger:
    return Ledger(5000, RangeSet([(0, 3000)]))


claims = st.lists(
    st.tuples(st.integers(0, 5200), st.integers(1, 300), st.booleans()), max_size=12
).map(lambda xs: [Claim(s, s + n, child, True) for s, n, child in xs])


@given(st.lists(claims, min_size=1, max_size=4))
def test_a_committed_transaction_claims_what_its_views_showed(batches) -> None:
    ledger = _ledger()
    txn = OpenTransaction(producer=object())
    for batch in batches:
        view = txn.view(KEY, ledger)
        change = Change(batch)
        apply_change(view, change)
        txn.stage(KEY, ledger, change)
        assert ledger.ranges.as_tuple() == ((0, 3000),), "claimed before the commit"
    expected = txn.view(KEY, ledger)
    txn.settle()
    assert ledger.ranges.as_tuple() == expected.ranges.as_tuple()
    assert ledger.position == expected.position


def test_a_ledger_planned_anew_does_not_see_an_older_transaction_s_claims() -> None:
    old, new = _ledger(), _ledger()
    txn = OpenTransaction(producer=object())
    txn.stage(KEY, old, Change([Claim(0, 100, True, True)]))
    assert txn.view(KEY, new).ranges.as_tuple() == ((0, 3000),)
    assert txn.view(KEY, old).ranges.as_tuple() == ((100, 3000),)


def test_exactly_once_refuses_to_coalesce_the_token() -> None:
    # every other record processed: many ranges, more than 256 bytes of token
    ledger = Ledger(5000, RangeSet([(i, i + 1) for i in range(0, 400, 2)]))
    assert group_write(ledger.copy(), "", 256) is not None  # at-least-once coalesces
    with pytest.raises(TokenTooLargeError):
        group_write(ledger, "", 256, exact=True)
    small = Ledger(5000, RangeSet([(0, 10), (20, 30)]))
    gw = group_write(small, "", 256, exact=True)
    assert gw is not None and gw.coalesced is None
