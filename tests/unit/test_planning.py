"""restore() and plan_assignment(): the KIP-333 examples, token and checkpoint handling,
the threshold, retention, an application's own start offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._commits import group_write
from fastrebalance._ledger import Ledger
from fastrebalance._planning import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Restored,
    checkpoint_is_stale,
    plan_assignment,
    restore,
)
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import History
from fastrebalance._token import (
    ChildCheckpoint,
    GroupToken,
    TokenError,
    decode_child_checkpoint,
    decode_group_token,
    encode_child_checkpoint,
    encode_group_token,
)


def token_text(position: int, ranges: tuple[tuple[int, int], ...], user: str = "") -> str:
    text, written = encode_group_token(GroupToken(position, ranges, user))
    assert written.ranges == ranges
    return text


def pending(ranges: RangeSet) -> set[int]:
    return {o for s, e in ranges for o in range(s, e)}


# -- restore ------------------------------------------------------------------------
def test_restore_never_committed() -> None:
    r = restore(-1, "whatever")
    assert r.position is None and r.safe_offset is None and not r.ranges
    plan = plan_assignment(r, 0, 500, 0)
    assert plan.start is None and plan.ledger.position is None and not plan.ledger.ranges


@pytest.mark.parametrize("metadata", [None, "", "my-app-state", "~frc1:00000000:1:2"])
def test_restore_foreign_metadata_keeps_offset_and_user_metadata(metadata) -> None:
    r = restore(42, metadata)
    assert r.position == 42
    assert not r.ranges
    assert r.safe_offset == 42
    assert r.user_metadata == metadata  # None (none committed) is not "" (issue 44)
    assert r.problem is None


def test_restore_trusts_a_matching_token() -> None:
    text = token_text(140, ((70, 120),), "app")
    r = restore(70, text)
    assert r.position == 140
    assert r.ranges.as_tuple() == ((70, 120),)
    assert r.user_metadata == "app"
    assert r.safe_offset == 70
    assert r.problem is None


def corrupt(text: str) -> str:
    i = len(text) - 3  # inside the payload: the CRC no longer matches
    return text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1 :]


@pytest.mark.parametrize(
    "metadata",
    [
        corrupt(token_text(140, ((70, 120),), "app")),
        token_text(140, ((70, 120),), "app")[:-4],  # truncated
        "~fr7:whatever",  # a version we do not read
    ],
)
def test_restore_untrusted_token_falls_back_to_offset(metadata: str) -> None:
    r = restore(70, metadata)
    assert r.position == 70
    assert not r.ranges
    assert r.safe_offset == 70
    assert r.problem
    with pytest.raises(TokenError):
        decode_group_token(metadata)


def test_restore_token_written_with_another_offset_falls_back() -> None:
    # an operator reset the offset to 50 with a tool that kept the metadata
    text = token_text(140, ((70, 120),), "app")
    r = restore(50, text)
    assert r.position == 50
    assert not r.ranges
    assert r.user_metadata == "app"
    assert r.problem and "50" in r.problem and "70" in r.problem
    # the same token without ranges: its safe offset is its position
    r = restore(130, token_text(140, (), "app"))
    assert (r.position, r.ranges.as_tuple()) == (130, ())
    assert r.problem


def test_restore_applies_child_checkpoint_matching_a_range_end() -> None:
    text = token_text(300, ((70, 120), (150, 200)))
    cp = encode_child_checkpoint(ChildCheckpoint(70, 120, 100))
    r = restore(70, text, 100, cp)
    assert r.ranges.as_tuple() == ((100, 120), (150, 200))
    assert r.position == 300 and r.problem is None
    assert r.safe_offset == 100

    cp = encode_child_checkpoint(ChildCheckpoint(150, 200, 170))
    r = restore(70, text, 170, cp)
    assert r.ranges.as_tuple() == ((70, 120), (170, 200))

    # finished a range: it disappears
    cp = encode_child_checkpoint(ChildCheckpoint(70, 120, 120))
    r = restore(70, text, 120, cp)
    assert r.ranges.as_tuple() == ((150, 200),)


@pytest.mark.parametrize(
    ("cp", "offset"),
    [
        (ChildCheckpoint(70, 130, 100), 100),  # range end 130 is pending nowhere
        (ChildCheckpoint(70, 150, 100), 100),  # 150 is a start, not an end
        (ChildCheckpoint(0, 70, 60), 60),
    ],
)
def test_restore_ignores_checkpoint_of_another_range(cp: ChildCheckpoint, offset: int) -> None:
    text = token_text(300, ((70, 120), (150, 200)))
    r = restore(70, text, offset, encode_child_checkpoint(cp))
    assert r.ranges.as_tuple() == ((70, 120), (150, 200))
    assert r.problem is None


def test_restore_ignores_untrusted_checkpoint() -> None:
    text = token_text(300, ((70, 120),))
    cp = encode_child_checkpoint(ChildCheckpoint(70, 120, 100))
    # the child's offset was moved to 110 by a tool: the CRC covers the offset
    r = restore(70, text, 110, cp)
    assert r.ranges.as_tuple() == ((70, 120),)
    assert r.position == 300
    assert r.problem
    # no child commit at all (offset -1): the checkpoint text is not even looked at
    r = restore(70, text, -1, cp)
    assert r.ranges.as_tuple() == ((70, 120),)
    assert r.problem is None
    # corrupt and foreign checkpoints
    r = restore(70, text, 100, corrupt(cp))
    assert r.ranges.as_tuple() == ((70, 120),) and r.problem
    r = restore(70, text, 100, "not ours")
    assert r.ranges.as_tuple() == ((70, 120),) and r.problem is None


# -- plan_assignment: KIP-333 examples ------------------------------------------------
def test_kip_example_first_crash() -> None:
    """Crash at 100 with 70 committed, log end 120: fresh records first, [70, 120) caught up."""
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=0)
    assert plan.start == 120
    assert plan.ledger.ranges.as_tuple() == ((70, 120),)
    assert plan.caught_up == (70, 120)
    assert plan.deleted == ()


def first_session() -> tuple[Ledger, History]:
    """The KIP's first crash: the primary at 120, the child reading [70, 120)."""
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=0)
    history = History()
    history.begin(plan.floor, plan.run_start)
    return plan.ledger, history


def persist(ledger: Ledger) -> tuple[int, str]:
    token = ledger.token()
    if token is None:
        assert ledger.position is not None
        return ledger.position, ""
    text, written = encode_group_token(token)
    return written.safe_offset, text


@pytest.mark.parametrize(
    ("child_commit", "expected"),
    [
        (None, ((70, 120), (140, 190))),  # the child had processed nothing
        (100, ((100, 120), (140, 190))),  # the child got to 100
        (120, ((140, 190),)),  # the child had finished the first range
    ],
)
def test_kip_example_second_crash(child_commit, expected) -> None:
    """Second crash at 170 with 140 committed and log end 190: [140, 190) plus what is
    still pending of the first range."""
    ledger, history = first_session()
    epoch = history.current
    assert epoch is not None
    checkpoint = None
    if child_commit is not None:
        run = epoch.child_run(70)
        for o in range(70, child_commit):
            run.handed(o)
        claim = history.record_claim(child_commit - 1)
        assert (claim.start, claim.end, claim.child) == (70, child_commit, True)
        cp = ChildCheckpoint(70, 120, child_commit)
        ledger.claim(claim.start, claim.end)
        checkpoint = (child_commit, encode_child_checkpoint(cp))
    # the primary processed 120..139: its record 139 claims [120, 140)
    epoch.live.advance(140)
    claim = history.record_claim(139)
    assert (claim.start, claim.end, claim.child) == (120, 140, False)
    ledger.claim(claim.start, claim.end)
    assert ledger.position == 140
    offset, metadata = persist(ledger)
    assert offset == (70 if child_commit is None else expected[0][0])

    r = restore(offset, metadata, *(checkpoint or (-1, None)))
    plan = plan_assignment(r, low=0, high=190, threshold=0)
    assert plan.start == 190
    assert plan.ledger.ranges.as_tuple() == expected
    assert plan.caught_up == (140, 190)


def test_checkpoint_newer_than_group_commit_is_applied() -> None:
    # crash between the child's checkpoint commit and the group commit
    ledger, _ = first_session()
    offset, metadata = persist(ledger)  # written before the child progressed
    cp = ChildCheckpoint(70, 120, 110)
    r = restore(offset, metadata, 110, encode_child_checkpoint(cp))
    assert r.ranges.as_tuple() == ((110, 120),)
    assert r.position == 120


@pytest.mark.parametrize(
    ("threshold", "catch_up"), [(0, True), (49, True), (50, False), (10**9, False)]
)
def test_threshold(threshold: int, catch_up: bool) -> None:
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=threshold)
    if catch_up:
        assert (plan.start, plan.ledger.ranges.as_tuple(), plan.caught_up) == (
            120,
            ((70, 120),),
            (70, 120),
        )
    else:
        assert (plan.start, plan.ledger.ranges.as_tuple(), plan.caught_up) == (70, (), None)


def test_pending_ranges_survive_any_threshold() -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=0, high=150, threshold=1000)
    assert plan.start == 140
    assert plan.ledger.ranges.as_tuple() == ((70, 120),)
    assert plan.caught_up is None


def test_log_end_below_position_starts_at_position() -> None:
    plan = plan_assignment(restore(70, ""), low=0, high=40, threshold=0)
    assert (plan.start, plan.ledger.ranges.as_tuple(), plan.caught_up) == (70, (), None)


@pytest.mark.parametrize(
    ("low", "deleted", "remaining"),
    [
        (0, (), ((70, 120), (140, 190))),
        (70, (), ((70, 120), (140, 190))),
        (100, ((70, 100),), ((100, 120), (140, 190))),
        (130, ((70, 120),), ((140, 190),)),
        (150, ((70, 120), (140, 150)), ((150, 190),)),
    ],
)
def test_retention_clips_ranges_and_reports(low, deleted, remaining) -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=low, high=190, threshold=0)
    assert plan.start == 190
    assert plan.deleted == deleted
    assert plan.ledger.ranges.as_tuple() == remaining
    assert r.ranges.as_tuple() == ((70, 120),), "plan_assignment must not modify its input"


def test_retention_without_catch_up() -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=100, high=150, threshold=1000)
    assert plan.start == 140
    assert plan.deleted == ((70, 100),)
    assert plan.ledger.ranges.as_tuple() == ((100, 120),)


def test_checkpoint_from_before_an_offset_reset_is_retired() -> None:
    ledger, _ = first_session()  # [70, 120) pending, the primary at 120
    ledger.claim(70, 100)  # the child processed 70..99
    cp = ChildCheckpoint(70, 120, 100)
    child = (100, encode_child_checkpoint(cp))
    persist(ledger)
    # The group is stopped; an operator resets it to 50 to reprocess everything from 50
    # (kafka-consumer-groups --reset-offsets: the metadata is dropped, the child's own
    # group, <group.id>.catchup, is left alone). Nothing is produced meanwhile.
    r = restore(50, "", *child)
    assert (r.position, r.ranges.as_tuple()) == (50, ())
    plan = plan_assignment(r, low=0, high=120, threshold=0)
    assert plan.ledger.ranges.as_tuple() == ((50, 120),) and plan.caught_up == (50, 120)
    offset, metadata = persist(plan.ledger)  # the new session commits, then crashes
    # Left in the child's log, the old checkpoint would apply to the new range (same end)
    # and skip 70..99, which the operator asked to reprocess.
    assert restore(offset, metadata, *child).ranges.as_tuple() == ((50, 70), (100, 120))
    # So the plan retires it (a bare offset: no checkpoint) before that first commit.
    assert checkpoint_is_stale(decode_child_checkpoint(child[1], child[0]), plan.caught_up)
    r = restore(offset, metadata, 50, "")
    assert r.ranges.as_tuple() == ((50, 120),), "70..99 are reprocessed after the reset"


@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(1, 100)), max_size=6),
    st.integers(0, 600),
    st.integers(1, 400),
    st.integers(0, 50),
)
def test_no_checkpoint_of_the_same_history_is_ever_retired(
    pieces: list[tuple[int, int]], position: int, growth: int, threshold: int
) -> None:
    """Every range of a history ends at or below its position, and a new range ends at
    the log end above it: a checkpoint that restore() applies is never taken for stale."""
    ranges = RangeSet()
    for start, length in pieces:
        if start < position:
            ranges.add(start, min(start + length, position))
    restored = Restored(position, ranges)
    plan = plan_assignment(restored, low=0, high=position + growth, threshold=threshold)
    if plan.caught_up is None:
        return
    for start, end in ranges:
        for offset in (start, end):
            assert not checkpoint_is_stale(ChildCheckpoint(start, end, offset), plan.caught_up)


# -- an application's own start offset ----------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "start", "floor", "run_start"),
    [
        (500, 500, 140, 500),  # past P: fresh records up to 500 are skipped, as plain does
        (100, 100, 100, 100),  # below P: the primary re-reads from 100
        (OFFSET_BEGINNING, OFFSET_BEGINNING, 0, 0),
        (OFFSET_END, OFFSET_END, 140, 900),
    ],
)
def test_an_explicit_start_adds_no_range_and_keeps_the_backlog(
    requested: int, start: int, floor: int, run_start: int
) -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=0, high=900, threshold=0, requested=requested)
    assert (plan.start, plan.floor, plan.run_start) == (start, floor, run_start)
    assert plan.caught_up is None
    assert plan.ledger.ranges.as_tuple() == ((70, 120),), "the backlog stays pending"
    assert plan.ledger.safe_offset == 70


def test_an_explicit_start_without_a_committed_offset() -> None:
    plan = plan_assignment(restore(-1, None), low=0, high=900, threshold=0, requested=300)
    assert (plan.start, plan.floor, plan.run_start, plan.ledger.position) == (300, 0, 300, None)


def test_a_partition_never_committed_catches_up_from_the_log_start() -> None:
    # issue 47: a new service whose first member crashed before its first commit restarted
    # with auto.offset.reset=earliest and read its whole log in order (first fresh record
    # after 18.9 s at p50): [log start, end) is its backlog now
    plan = plan_assignment(restore(-1, None), low=40, high=900, threshold=100, from_start=True)
    assert (plan.start, plan.floor, plan.run_start) == (900, 900, 900)
    assert plan.ledger.ranges.as_tuple() == ((40, 900),) and plan.caught_up == (40, 900)
    assert plan.ledger.safe_offset == 40  # what the group may store: nothing claimed
    # below the threshold, with latest (from_start False), or asked not to: as before
    for low, high, from_start in ((40, 140, True), (40, 900, False)):
        plan = plan_assignment(
            restore(-1, None), low=low, high=high, threshold=100, from_start=from_start
        )
        assert (plan.start, plan.ledger.position, plan.caught_up) == (None, None, None)
    # an explicit start is the application's, as before
    plan = plan_assignment(
        restore(-1, None), low=0, high=900, threshold=0, requested=300, from_start=True
    )
    assert (plan.start, plan.caught_up) == (300, None)


# -- exactly-once: never a token no transaction can carry ---------------------------
@settings(deadline=None, max_examples=40)
@given(
    restarts=st.integers(min_value=1, max_value=200),
    budget=st.integers(min_value=256, max_value=4000),
    progress=st.integers(min_value=1, max_value=50),
)
def test_an_exact_plan_never_makes_a_token_beyond_its_budget(
    restarts: int, budget: int, progress: int
) -> None:
    """A crash loop with a pending backlog: every restart plans (a range is added while the
    token still fits), the primary then processes ``progress`` fresh records and dies.
    However long the loop, every token it leaves encodes within the budget without
    coalescing (exactly-once cannot coalesce), and the declined backlog is read in order:
    nothing leaves the pending set unclaimed."""
    ranges: tuple[tuple[int, int], ...] = ((0, 10),)  # the poison record's range
    position = end = 10
    for _ in range(restarts):
        end += 100  # written while it was down
        r = Restored(position, RangeSet(ranges))
        plan = plan_assignment(r, low=0, high=end, threshold=10, exact_token_bytes=budget)
        assert (plan.caught_up is None) != (plan.declined is None)
        _, written = encode_group_token(
            GroupToken(plan.ledger.position, plan.ledger.ranges.as_tuple()), budget
        )
        assert written.ranges == plan.ledger.ranges.as_tuple(), "it would need coalescing"
        assert all(
            plan.ledger.unprocessed(o) for s, e in r.ranges for o in (s, e - 1)
        ), "a pending range was dropped"
        if plan.declined is not None:
            # in order: the primary starts at P, the new backlog is still its to read
            assert plan.start == position and plan.declined == (position, end)
        start = plan.start
        assert start is not None
        plan.ledger.claim(start, start + progress)  # the fresh records it processed
        position, ranges = plan.ledger.position, plan.ledger.ranges.as_tuple()
        assert position is not None
        end = max(end, position)


def test_an_exact_plan_adds_a_range_while_it_fits() -> None:
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=0, exact_token_bytes=4000)
    assert plan.caught_up == (70, 120) and plan.declined is None
    full = tuple((10 * i, 10 * i + 3) for i in range(60))
    r = Restored(700, RangeSet(full))
    plan = plan_assignment(r, low=0, high=900, threshold=0, exact_token_bytes=256)
    assert plan.caught_up is None and plan.declined == (700, 900)
    assert plan.start == 700 and plan.ledger.ranges.as_tuple() == full
    # at-least-once keeps adding (the token is coalesced when it is written)
    assert plan_assignment(r, low=0, high=900, threshold=0).caught_up == (700, 900)


# -- the backlog's lineage (group-wide catch-up) ----------------------------------------
def _lineage_token(position: int, ranges: tuple[tuple[int, int], ...], lineage: str) -> str:
    return encode_group_token(GroupToken(position, ranges, "", lineage))[0]


def test_a_plan_keeps_the_tokens_lineage() -> None:
    """The claims log's done records of the lineage are facts about these very records:
    the next owner absorbs them, a new range above the position or not (an owner change
    under load: a new lineage there had every new owner's backlog read again)."""
    meta = _lineage_token(5000, ((1000, 3000),), "ab12")
    restored = restore(1000, meta)
    assert restored.lineage == "ab12" and restored.ledger().lineage == "ab12"
    plan = plan_assignment(restored, low=0, high=5500, threshold=1000)
    assert plan.caught_up is None and plan.ledger.lineage == "ab12"
    plan = plan_assignment(restore(1000, meta), low=0, high=9000, threshold=1000)
    assert plan.caught_up == (5000, 9000) and plan.ledger.lineage == "ab12"
    # retention dropping part of it keeps it too (offsets only left)
    plan = plan_assignment(restore(1000, meta), low=2000, high=5500, threshold=1000)
    assert plan.ledger.ranges.as_tuple() == ((2000, 3000),) and plan.ledger.lineage == "ab12"


def test_a_plan_without_the_tokens_lineage_has_none() -> None:
    """What ends a lineage: an operator's reset (no metadata), a token whose offset another
    tool moved, a token written by a rewind commit (see group_write) or before lineages."""
    meta = _lineage_token(5000, ((1000, 3000),), "ab12")
    plan = plan_assignment(restore(0, ""), low=0, high=9000, threshold=1000)
    assert plan.ledger.ranges.as_tuple() == ((0, 9000),) and plan.ledger.lineage == ""
    assert restore(0, meta).lineage == ""  # moved by another tool: the token is ignored
    plan = plan_assignment(restore(1000, token_text(5000, ((1000, 3000),))), 0, 9000, 1000)
    assert plan.ledger.lineage == ""


def test_a_rewind_drops_the_lineage_and_a_claim_keeps_it() -> None:
    ledger = Ledger(5000, RangeSet([(1000, 3000)]), "ab12")
    ledger.claim(1000, 2000)
    ledger.claim(5000, 5100)
    assert ledger.lineage == "ab12" and ledger.copy().lineage == "ab12"
    token = ledger.token()
    assert token is not None and token.lineage == "ab12"
    ledger.rewind(6000)  # not below the position: nothing becomes unprocessed
    assert ledger.lineage == "ab12"
    ledger.rewind(1500)
    assert ledger.lineage == ""


def test_every_group_write_carries_the_lineage_but_a_rewind() -> None:
    """The group's commits carry the owner's lineage to the next owner (coalesced to fit
    too); a commit that rewinds says processed offsets are unprocessed again: no lineage,
    so the next owner draws a new one and reads them."""
    from fastrebalance._commits import group_write

    ledger = Ledger(5000, RangeSet([(1000, 2000), (3000, 4000)]), "ab12")
    w = group_write(ledger, "app", 4000)
    assert w is not None and w.offset == 1000
    back = restore(w.offset, w.metadata)
    assert back.lineage == "ab12" and back.user_metadata == "app"
    many = Ledger(10**6, RangeSet([(i * 10, i * 10 + 5) for i in range(2000)]), "ab12")
    w = group_write(many, "", 200)
    assert w is not None and w.coalesced is not None
    assert restore(w.offset, w.metadata).lineage == "ab12"
    w = group_write(ledger, "", 4000, rewind=1500)
    assert w is not None and w.offset == 1000
    assert restore(w.offset, w.metadata).lineage == ""
    assert ledger.lineage == "ab12"  # the ledger keeps what it knows (see group_write)


# -- a late write of a partition never committed ------------------------------------
@settings(deadline=None, max_examples=200)
@given(
    low=st.integers(0, 50),
    backlog=st.integers(1, 60),
    claims=st.lists(
        st.tuples(st.booleans(), st.integers(0, 80), st.integers(1, 30)), min_size=1, max_size=8
    ),
)
def test_a_late_write_of_a_partition_never_committed_claims_only_what_was_processed(
    low: int, backlog: int, claims: list[tuple[bool, int, int]]
) -> None:
    """The plan of a partition never committed (earliest) makes [low, high) backlog and
    starts the primary at high. Commits that land after the partition left are written
    from what the group stores, which for a group that never committed is read as its log
    start (``Planner.read_to_write``). Whatever the claims (primary runs [high, o], child
    runs inside [low, high)) and their order, every write, read back as a restart (or the
    chaos checker) reads it, claims only offsets processed (or below the log start)."""
    high = low + backlog
    plan = plan_assignment(restore(-1, None), low, high, threshold=0, from_start=True)
    assert plan.floor == high
    processed: set[int] = set()
    written = (-1001, None)  # what the group stores: nothing yet
    for primary, a, n in claims:
        start, end = (high, high + a + 1) if primary else (low + a % backlog, 0)
        if not primary:
            end = min(start + n, high)  # a child run, inside the backlog
        processed |= set(range(start, end))
        ledger = Restored(low).ledger() if written[0] < 0 else restore(*written).ledger()
        ledger.claim(start, end)
        gw = group_write(ledger, None, 4000)
        assert gw is not None
        written = (gw.offset, gw.metadata)
        back = restore(*written)
        assert back.position is not None
        claimed = set(range(low, back.position)) - pending(back.ranges)
        assert claimed <= processed, sorted(claimed - processed)[:5]
        assert gw.offset <= min(set(range(low, high + 200)) - processed)
