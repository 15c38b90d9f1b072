"""restore(), plan_assignment() and PartitionState: examples from KIP-333 and a model-based
safety property over whole histories of deliveries, commits, crashes and restores."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._ranges import RangeSet
from fastrebalance._state import (
    PartitionState,
    Plan,
    Restored,
    checkpoint_is_stale,
    plan_assignment,
    restore,
)
from fastrebalance._token import (
    ChildCheckpoint,
    GroupToken,
    TokenError,
    TokenTooLargeError,
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
    assert plan_assignment(r, 0, 500, 0) == Plan(None, RangeSet())


@pytest.mark.parametrize("metadata", [None, "", "my-app-state", "~frc1:00000000:1:2"])
def test_restore_foreign_metadata_keeps_offset_and_user_metadata(metadata) -> None:
    r = restore(42, metadata)
    assert r.position == 42
    assert not r.ranges
    assert r.safe_offset == 42
    assert r.user_metadata == (metadata or "")
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
    assert plan.ranges.as_tuple() == ((70, 120),)
    assert plan.caught_up == (70, 120)
    assert plan.deleted == ()


def first_session() -> PartitionState:
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=0)
    return PartitionState(plan.start, plan.ranges, plan.start)


def persist(state: PartitionState) -> tuple[int, str]:
    token = state.token()
    if token is None:
        assert state.position is not None
        return state.position, state.user_metadata
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
    st_ = first_session()
    checkpoint = None
    if child_commit is not None:
        st_.child_delivered = child_commit  # the child delivered 70..child_commit-1
        cp = st_.commit(child_commit)
        assert cp == ChildCheckpoint(70, 120, child_commit)
        checkpoint = (child_commit, encode_child_checkpoint(cp))
    assert st_.commit(140) is None  # the primary processed 120..139
    assert st_.position == 140
    offset, metadata = persist(st_)
    assert offset == (70 if child_commit is None else expected[0][0])

    r = restore(offset, metadata, *(checkpoint or (-1, None)))
    plan = plan_assignment(r, low=0, high=190, threshold=0)
    assert plan.start == 190
    assert plan.ranges.as_tuple() == expected
    assert plan.caught_up == (140, 190)


def test_checkpoint_newer_than_group_commit_is_applied() -> None:
    # crash between the child's checkpoint commit and the group commit
    st_ = first_session()
    offset, metadata = persist(st_)  # written before the child progressed
    st_.child_delivered = 110
    cp = st_.commit(110)
    r = restore(offset, metadata, 110, encode_child_checkpoint(cp))
    assert r.ranges.as_tuple() == ((110, 120),)
    assert r.position == 120


@pytest.mark.parametrize(
    ("threshold", "catch_up"), [(0, True), (49, True), (50, False), (10**9, False)]
)
def test_threshold(threshold: int, catch_up: bool) -> None:
    plan = plan_assignment(restore(70, ""), low=0, high=120, threshold=threshold)
    if catch_up:
        assert (plan.start, plan.ranges.as_tuple(), plan.caught_up) == (
            120,
            ((70, 120),),
            (70, 120),
        )
    else:
        assert (plan.start, plan.ranges.as_tuple(), plan.caught_up) == (70, (), None)


def test_pending_ranges_survive_any_threshold() -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=0, high=150, threshold=1000)
    assert plan.start == 140
    assert plan.ranges.as_tuple() == ((70, 120),)
    assert plan.caught_up is None


def test_log_end_below_position_starts_at_position() -> None:
    plan = plan_assignment(restore(70, ""), low=0, high=40, threshold=0)
    assert (plan.start, plan.ranges.as_tuple(), plan.caught_up) == (70, (), None)


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
    assert plan.ranges.as_tuple() == remaining
    assert r.ranges.as_tuple() == ((70, 120),), "plan_assignment must not modify its input"


def test_retention_without_catch_up() -> None:
    r = restore(70, token_text(140, ((70, 120),)))
    plan = plan_assignment(r, low=100, high=150, threshold=1000)
    assert plan.start == 140
    assert plan.deleted == ((70, 100),)
    assert plan.ranges.as_tuple() == ((100, 120),)


# -- PartitionState ------------------------------------------------------------------
def test_partition_state_routes_commits_by_floor() -> None:
    s = PartitionState(120, RangeSet([(10, 20), (70, 120)]), 120, "app")
    assert s.safe_offset == 10
    assert s.token() == GroupToken(120, ((10, 20), (70, 120)), "app")
    s.child_delivered = 81  # the child has delivered 10..19 and 70..80
    # child stream: every child offset below 15 processed
    assert s.commit(15) == ChildCheckpoint(10, 20, 15)
    assert s.ranges.as_tuple() == ((15, 20), (70, 120))
    assert s.position == 120
    # a commit inside a gap: nothing pending moves, no checkpoint
    assert s.commit(40) is None
    assert s.ranges.as_tuple() == ((70, 120),)
    assert s.commit(80) == ChildCheckpoint(70, 120, 80)
    # primary stream
    assert s.commit(130) is None
    assert s.position == 130 and s.ranges.as_tuple() == ((80, 120),)
    assert s.safe_offset == 80
    assert s.commit(120) is None, "the child has not delivered 119 yet"
    assert s.ranges.as_tuple() == ((80, 120),)
    s.child_delivered = 120
    assert s.commit(120) == ChildCheckpoint(80, 120, 120)  # the child finished
    assert not s.ranges and s.safe_offset == 130
    assert s.token() is None


def test_partition_state_without_commit_history() -> None:
    s = PartitionState(None, RangeSet(), None)
    assert s.safe_offset is None and s.token() is None
    assert s.commit(5) is None and s.position == 5


def test_primary_commit_of_its_start_offset_claims_nothing() -> None:
    """commit(floor) is ambiguous: the child finishing the range that ends at the floor,
    or the primary committing its start before reading anything. Only the child having
    delivered floor - 1 makes it the child's."""
    # KIP example: the primary starts at 120, the child has [70, 120) to read.
    s = first_session()
    # The application commits the primary's position before processing anything
    # (e.g. commit(offsets=[TopicPartition(t, p, 120)]) from its own bookkeeping).
    assert s.commit(120) is None
    assert s.ranges.as_tuple() == ((70, 120),)
    offset, metadata = persist(s)
    r = restore(offset, metadata)
    assert r.safe_offset == 70, "offsets 70..119 were never processed"
    # the child halfway through the range: still not the child's commit
    s.child_delivered = 95
    assert s.commit(120) is None
    assert s.ranges.as_tuple() == ((70, 120),)
    # once the child has delivered 119, commit(120) is the child finishing
    s.child_delivered = 120
    assert s.commit(120) == ChildCheckpoint(70, 120, 120)
    assert not s.ranges


def test_primary_rewind_commit_below_its_start_drops_no_backlog() -> None:
    s = first_session()  # [70, 120) pending, the primary at 120
    s.child_delivered = 75  # the child delivered 70..74
    # the application commits 90 for the primary (to restart from there): the child
    # has not delivered 89, so nothing of the backlog below 90 may be dropped
    assert s.commit(90) is None
    assert s.ranges.as_tuple() == ((70, 120),) and s.position == 120
    assert s.commit(75) == ChildCheckpoint(70, 120, 75)  # a child record, delivered
    assert s.ranges.as_tuple() == ((75, 120),)


def test_stale_primary_commit_after_seek_claims_only_what_it_read() -> None:
    # Primary started at 120 after a crash, the child owns [70, 120) and has read nothing.
    s = first_session()
    # The primary delivers and processes 120..125, then the application seeks back to 100
    # to re-read (a seek moves where the primary reads, not what was processed), and
    # commits the record it had already processed (offset 125).
    s.commit(126)
    offset, metadata = persist(s)
    r = restore(offset, metadata)
    claimed = set(range(r.position)) - pending(r.ranges)
    # A plain consumer's commit(126) would be true here (it read 70..125 in order);
    # ours must not claim [100, 120), which nobody has read yet.
    assert not claimed & set(range(70, 120))


def test_checkpoint_from_before_an_offset_reset_is_retired() -> None:
    s = first_session()  # [70, 120) pending, the primary at 120
    s.child_delivered = 100
    cp = s.commit(100)  # the child processed 70..99
    assert cp is not None
    child = (100, encode_child_checkpoint(cp))
    persist(s)
    # The group is stopped; an operator resets it to 50 to reprocess everything from 50
    # (kafka-consumer-groups --reset-offsets: the metadata is dropped, the child's own
    # group, <group.id>.catchup, is left alone). Nothing is produced meanwhile.
    r = restore(50, "", *child)
    assert (r.position, r.ranges.as_tuple()) == (50, ())
    plan = plan_assignment(r, low=0, high=120, threshold=0)
    assert plan.ranges.as_tuple() == ((50, 120),) and plan.caught_up == (50, 120)
    s = PartitionState(plan.start, plan.ranges, plan.start)
    offset, metadata = persist(s)  # the new session commits, then crashes
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


# -- model-based safety property -------------------------------------------------------
@dataclass
class Model:
    """One partition's log, what the application really processed, and what Kafka stores.

    The application processes every record as it is delivered (at-least-once) and commits
    only offsets of records it was delivered (or, for the primary, offsets up to its
    position). The safety invariant: whatever the in-memory state, the stored
    (offset, metadata) pairs, restore() or a plan claim processed, was processed (or
    deleted by retention). Not modelled: an operator's intent to reprocess after a
    reset (processed stays processed here; the retirement test above covers it).
    """

    threshold: int
    max_bytes: int
    log_end: int = 0
    low: int = 0
    processed: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)  # deleted by retention, never processed
    group: tuple[int, str] | None = None  # the user's group commit: (offset, metadata)
    child: tuple[int, str] | None = None  # the child's group commit
    # the live session
    state: PartitionState = field(default_factory=lambda: PartitionState(None, RangeSet(), None))
    p_next: int = 0
    c_next: int = 0
    p_delivered: list[int] = field(default_factory=list)
    c_delivered: list[int] = field(default_factory=list)

    # -- the claim check -------------------------------------------------------------
    def assert_true_claim(self, claim: set[int], what: str) -> None:
        wrong = claim - self.processed - self.lost
        assert not wrong, f"{what} claims unprocessed offsets {sorted(wrong)[:10]}"

    def check(self) -> None:
        s = self.state
        if s.position is not None:
            self.assert_true_claim(
                set(range(s.position)) - pending(s.ranges), "the in-memory state"
            )
        if self.group is not None:
            offset, metadata = self.group
            self.assert_true_claim(set(range(offset)), "the group offset")
            try:
                token = decode_group_token(metadata)
            except TokenError:
                token = None
            if token is not None and token.safe_offset == offset:
                claim = set(range(token.position)) - pending(RangeSet(token.ranges))
                self.assert_true_claim(claim, "the group token")
        if self.child is not None:
            offset, metadata = self.child
            try:
                cp = decode_child_checkpoint(metadata, offset)
            except TokenError:
                cp = None
            if cp is not None:
                self.assert_true_claim(set(range(cp.start, cp.offset)), "the child checkpoint")
        r = self.restored()
        if r.position is not None:
            self.assert_true_claim(set(range(r.position)) - pending(r.ranges), "restore()")

    def restored(self) -> Restored:
        if self.group is None:
            return restore(-1, None)
        c_offset, c_metadata = self.child if self.child is not None else (-1, None)
        return restore(self.group[0], self.group[1], c_offset, c_metadata)

    # -- what the consumer does ---------------------------------------------------------
    def write_group(self) -> None:
        """As Consumer._group_offset: the safe offset and the token, in one commit."""
        s = self.state
        token = s.token()
        if token is None:
            if s.position is not None:
                self.group = (s.position, s.user_metadata)
            return
        try:
            text, written = encode_group_token(token, self.max_bytes)
        except TokenTooLargeError:
            return  # the commit fails; Kafka keeps the previous pair
        assert len(text.encode("utf-8")) <= self.max_bytes
        if written.ranges != token.ranges:
            s.ranges = RangeSet(written.ranges)
        self.group = (written.safe_offset, text)

    def commit(self, next_offset: int, write: bool, metadata: str | None = None) -> None:
        s = self.state
        if metadata is not None and not s.is_child_offset(next_offset - 1):
            s.user_metadata = metadata
        cp = s.commit(next_offset)
        if cp is not None:
            self.child = (cp.offset, encode_child_checkpoint(cp))
        if write:
            self.write_group()

    def start_session(self) -> None:
        r = self.restored()
        plan = plan_assignment(r, self.low, self.log_end, self.threshold)
        self.check_plan(r, plan)
        if plan.start is None:
            self.state = PartitionState(None, RangeSet(), None)
            self.p_next = self.low  # auto.offset.reset=earliest
        else:
            self.state = PartitionState(plan.start, plan.ranges, plan.start, r.user_metadata)
            self.p_next = max(plan.start, self.low)
        self.c_next = 0
        self.p_delivered = []
        self.c_delivered = []

    def check_plan(self, r: Restored, plan: Plan) -> None:
        if r.position is None:
            assert plan.start is None and not plan.ranges
            return
        before = pending(r.ranges)
        if self.log_end - r.position > self.threshold:
            assert plan.caught_up == (r.position, self.log_end)
            assert plan.start == self.log_end
            before |= set(range(r.position, self.log_end))
        else:
            assert plan.caught_up is None
            assert plan.start == r.position
        deleted = {o for s, e in plan.deleted for o in range(s, e)}
        assert deleted == {o for o in before if o < self.low}
        assert pending(plan.ranges) == {o for o in before if o >= self.low}
        self.assert_true_claim(set(range(plan.start)) - pending(plan.ranges), "the plan")

    # -- operations -----------------------------------------------------------------------
    def apply(self, op: tuple) -> None:
        name = op[0]
        s = self.state
        if name == "produce":
            self.log_end += op[1]
        elif name == "primary":
            for _ in range(op[1]):
                if self.p_next >= self.log_end:
                    break
                self.processed.add(self.p_next)
                self.p_delivered.append(self.p_next)
                self.p_next += 1
        elif name == "child":
            for _ in range(op[1]):
                piece = s.ranges.next_from(self.c_next)
                if piece is None:
                    break
                o = piece[0]
                assert self.low <= o < self.log_end
                self.processed.add(o)
                self.c_delivered.append(o)
                self.c_next = o + 1
                s.child_delivered = self.c_next
        elif name == "commit_primary":
            _, pick, write, metadata = op
            if self.p_delivered:
                self.commit(self.p_delivered[pick % len(self.p_delivered)] + 1, write, metadata)
        elif name == "commit_offset":
            # commit(offsets=[...]) of an offset the primary has reached, or lower: its
            # start before reading anything (commit(floor)), or a rewind
            self.commit(self.low + (self.p_next - self.low) * op[1] // 100, op[2])
        elif name == "commit_child":
            _, pick, write = op
            if self.c_delivered:
                self.commit(self.c_delivered[pick % len(self.c_delivered)] + 1, write)
        elif name == "write":
            self.write_group()
        elif name == "seek":  # the application re-reads from an earlier offset
            offset = self.low + (self.p_next - self.low) * op[1] // 100
            self.p_next = offset  # Consumer.seek moves the primary only, not the state
            # Only records delivered after the seek are committed on the primary stream:
            # see test_stale_primary_commit_after_seek_claims_only_what_it_read.
            self.p_delivered = []
        elif name == "crash":
            _, final_write, retention, rewind = op
            if final_write:
                self.write_group()
            if retention:
                new_low = min(self.low + retention, self.log_end)
                self.lost |= set(range(self.low, new_low)) - self.processed
                self.low = max(self.low, new_low)
            if rewind is not None and self.group is not None:
                # kafka-consumer-groups --reset-offsets while the group is empty
                fraction, keep_metadata, drop_child = rewind
                offset = self.group[0] * fraction // 100
                self.group = (offset, self.group[1] if keep_metadata else "")
                if drop_child:
                    self.child = None
            self.start_session()
        else:  # pragma: no cover
            raise AssertionError(op)


user_metadata = st.one_of(
    st.none(), st.sampled_from(["", "app", "~fr", "~fr1:x", "~frc1:x", "é", "x" * 40])
)
# pick -1 is the last record delivered (commit(message) right after processing it)
picks = st.one_of(st.just(-1), st.integers(0, 50))
produce = st.tuples(st.just("produce"), st.integers(1, 40))
deliver_primary = st.tuples(st.just("primary"), st.integers(1, 30))
deliver_child = st.tuples(st.just("child"), st.integers(1, 30))
commit_primary = st.tuples(st.just("commit_primary"), picks, st.booleans(), user_metadata)
commit_child = st.tuples(st.just("commit_child"), picks, st.booleans())
session_operations = st.one_of(
    produce,
    deliver_primary,
    deliver_child,
    deliver_child,
    commit_primary,
    st.tuples(st.just("commit_offset"), st.sampled_from([0, 50, 90, 100]), st.booleans()),
    commit_child,
    commit_child,
    st.tuples(st.just("write")),
    st.tuples(st.just("seek"), st.integers(0, 100)),
)
crash = st.tuples(
    st.just("crash"),
    st.booleans(),  # a last group commit on the way out (a clean rebalance)
    st.sampled_from([0, 0, 0, 5, 30]),  # records deleted by retention meanwhile
    st.one_of(  # an operator's offset reset meanwhile
        st.none(),
        st.none(),
        st.none(),
        st.tuples(st.integers(0, 100), st.booleans(), st.booleans()),
    ),
)


@st.composite
def sessions(draw) -> list[tuple]:
    """One consumer lifetime: a typical start (produce, read, commit), then anything,
    then a crash (or a rebalance) and a restart."""
    ops: list[tuple] = [
        ("produce", draw(st.integers(0, 40))),
        ("primary", draw(st.integers(0, 30))),
    ]
    if draw(st.booleans()):
        ops.append(("commit_primary", -1, True, None))
    ops += draw(st.lists(session_operations, max_size=20))
    ops.append(draw(crash))
    return ops


@settings(max_examples=500, deadline=None)
@given(
    threshold=st.sampled_from([0, 0, 5, 30, 10**6]),
    max_bytes=st.sampled_from([22, 26, 30, 40, 60, 4000]),
    history=st.lists(sessions(), min_size=1, max_size=6),
)
def test_no_history_claims_an_unprocessed_offset(threshold, max_bytes, history) -> None:
    model = Model(threshold=threshold, max_bytes=max_bytes)
    model.start_session()
    for session in history:
        for op in session:
            model.apply(op)
            model.check()
    # and a last restart, after the log grew once more
    model.log_end += 10
    model.apply(("crash", True, 0, None))
    model.check()


def test_model_detects_a_lie() -> None:
    """The checker itself: a group commit past an unprocessed record must be flagged."""
    model = Model(threshold=0, max_bytes=4000)
    model.start_session()
    model.apply(("produce", 10))
    model.apply(("primary", 3))
    model.group = (5, "")
    with pytest.raises(AssertionError, match=r"\[3, 4\]"):
        model.check()


def test_model_full_cycle_catches_up_everything() -> None:
    """A scripted history: after the child finishes and everything is committed, a
    restart has nothing pending and nothing unprocessed below its start."""
    model = Model(threshold=0, max_bytes=4000)
    model.start_session()
    for op in [
        ("produce", 100),
        ("primary", 70),
        ("commit_primary", 69, True, "app"),  # commits 70
        ("primary", 30),
        ("produce", 20),
        ("crash", False, 0, None),  # restart: committed 70, log end 120
    ]:
        model.apply(op)
        model.check()
    assert model.state.ranges.as_tuple() == ((70, 120),)
    assert model.p_next == 120
    model.apply(("child", 50))
    model.apply(("commit_child", 49, True))
    model.check()
    assert not model.state.ranges
    assert model.group == (120, "app")
    model.apply(("crash", False, 0, None))
    assert model.state.position == 120 and not model.state.ranges
    assert set(range(120)) <= model.processed
