"""Which offsets a commit claims: the delivery history (``_routing``) with the ledger.

First the KIP's story and the four ways the first implementation broke its promise, at
the level of the bookkeeping; then a stateful model of one partition over many
assignments, processes and crashes, whose application holds records, processes them out
of order, and commits them late, by message, by offset, bare, and as rewinds. After every
step, everything any log claims processed must have been processed (or skipped by the
application's own forward seek), whatever was written when.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fastrebalance._commits import Change, apply_change, group_write
from fastrebalance._ledger import Ledger
from fastrebalance._planning import Restored, plan_assignment, restore
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import UNKNOWN_START, Claim, Epoch, History, Run
from fastrebalance._token import (
    TokenError,
    decode_child_checkpoint,
    decode_group_token,
    encode_child_checkpoint,
)


def kip_session(committed: int = 70, log_end: int = 120) -> tuple[Ledger, History, Epoch]:
    """The KIP's first crash: the primary starts at the log end, the child reads the rest."""
    plan = plan_assignment(Restored(committed), low=0, high=log_end, threshold=0)
    history = History()
    return plan.ledger, history, history.begin(plan.floor, plan.run_start)


def hand(run: Run, start: int, end: int) -> None:
    for o in range(start, end):
        run.handed(o)


def claimed(ledger: Ledger) -> set[int]:
    assert ledger.position is not None
    return set(range(ledger.position)) - {o for s, e in ledger.ranges for o in range(s, e)}


# -- the KIP's story --------------------------------------------------------------------
def test_a_record_claims_its_own_stream_only() -> None:
    _ledger, history, epoch = kip_session()
    child = epoch.child_run(70)
    hand(child, 70, 90)
    epoch.live.advance(130)  # the primary handed 120..129 (librdkafka's position: 130)
    # its record 125 claims [120, 126)
    assert history.record_claim(125) == Claim(120, 126)
    # the child's record 80 claims [70, 81)
    assert history.record_claim(80) == Claim(70, 81, child=True)
    # a backlog offset the child has not handed out: that record alone, and not exactly
    assert history.record_claim(100) == Claim(100, 101, exact=False)


def test_the_child_reaching_a_range_end_with_no_record_claims_up_to_it() -> None:
    """A range ending in a transaction marker: its last record claims the marker too."""
    ledger, history, epoch = kip_session(70, 121)  # offset 120 is a commit marker
    run = epoch.child_run(70)
    hand(run, 70, 120)
    run.advance(121)  # the end of the partition (EOF) at or past the range end
    assert history.record_claim(119) == Claim(70, 121, child=True)
    ledger.claim(70, 121)
    assert not ledger.ranges and ledger.safe_offset == 121


# -- the four violations of issue 10, in bookkeeping terms ------------------------------------
def test_a_commit_after_the_partition_left_keeps_the_backlog() -> None:
    """Violation 1: backlog [0, 20000), the application holds fresh record 20000, the
    partition leaves the assignment, then the record is committed."""
    ledger, history, epoch = kip_session(0, 20000)
    epoch.live.advance(20001)  # the primary had handed out 20000
    epoch.close()
    claim = history.record_claim(20000)
    assert claim == Claim(20000, 20001)
    ledger.claim(claim.start, claim.end)
    assert ledger.safe_offset == 0 and ledger.ranges.as_tuple() == ((0, 20000),)


def test_a_late_commit_from_an_earlier_assignment_claims_that_assignment_s_stream() -> None:
    """Violation 3: primary record 5000 from assignment A (the primary started at 4000);
    regained as B with [0, 7300) pending and B's child past 5000; then record 5000."""
    history = History()
    a = history.begin(4000, 4000)
    a.live.advance(5001)
    a.close()
    plan = plan_assignment(Restored(0), low=0, high=7300, threshold=0)
    b = history.begin(plan.floor, plan.run_start)
    hand(b.child_run(0), 0, 6000)
    b.live.advance(7300)
    claim = history.record_claim(5000)
    # A's primary: [4000, 5001); B's child: [0, 5001): only [4000, 5001) is true of both
    assert claim == Claim(4000, 5001)
    plan.ledger.claim(claim.start, claim.end)
    assert plan.ledger.safe_offset == 0


@pytest.mark.parametrize("how", ["inside a consume() batch", "assigned again while assigned"])
def test_a_record_held_across_a_reassignment_of_unknown_position_claims_safely(how) -> None:
    """Crash with 0 committed, log end 20000; the application holds fresh record 20050 of
    the primary (processed: so is the primary's stream before it). The partition is
    assigned again without a trustworthy position of the primary (a revoke served inside
    the primary's consume(), where its position also counts collected records; or assign()
    of a partition still assigned); the new child reads [0, 20100) past 20050; then the
    held record is committed. It claims [20000, 20051), never the backlog below."""
    history = History()
    a = history.begin(20000, 20000)
    if how == "inside a consume() batch":
        a.live.widen(20100 + 37)  # librdkafka's position, 37 collected records included
        a.close()
    plan = plan_assignment(Restored(0), low=0, high=20100, threshold=0)
    b = history.begin(plan.floor, plan.run_start)
    hand(b.child_run(0), 0, 20060)
    claim = history.record_claim(20050)
    assert (claim.start, claim.end) == (20000, 20051)


def test_committing_the_primary_s_start_offset_claims_nothing() -> None:
    """Violation 4: the primary starts at 3000, the child has handed out [0, 3000) (not
    processed); the application commits offset 3000."""
    ledger, history, epoch = kip_session(0, 3000)
    hand(epoch.child_run(0), 0, 3000)
    assert history.position_claim(3000) is None
    change = Change()
    change.rewind = 3000
    apply_change(ledger, change)
    assert ledger.safe_offset == 0 and ledger.ranges.as_tuple() == ((0, 3000),)


def test_an_offset_below_the_stored_one_is_a_rewind_until_the_next_commit() -> None:
    """As with confluent-kafka: the rewind is what this commit stores; the next commit
    stores what is known again. (Rewinding the ledger would make offsets pending that
    nobody reads again, and keep the group offset down for good.)"""
    ledger, _history, _ = kip_session(0, 3000)
    ledger.claim(0, 3000)  # the child's stream, all of it
    ledger.claim(3000, 3100)  # the primary's records up to 3100
    change = Change()
    change.rewind = 50
    apply_change(ledger, change)
    gw = group_write(ledger, "", 4000, change.rewind)
    assert gw is not None and gw.offset == 50
    assert ledger.safe_offset == 3100, "the ledger keeps what it knows"
    gw = group_write(ledger, "", 4000)  # the next commit
    assert gw is not None and gw.offset == 3100


def test_a_backward_seek_re_reads_backlog_and_claims_only_what_it_re_read() -> None:
    _ledger, history, epoch = kip_session(70, 120)
    epoch.live.advance(126)  # the primary had handed 120..125, then seeks back to 100
    epoch.seek(100)
    epoch.live.advance(115)
    # its record 110: [100, 111), not the backlog below 100
    assert history.record_claim(110) == Claim(100, 111)
    # its old record 125 still claims from where it started
    assert history.record_claim(125) == Claim(120, 126)


def test_a_forward_seek_skips_fresh_records_as_a_plain_consumer_does() -> None:
    _, history, epoch = kip_session(70, 120)
    epoch.live.advance(126)
    epoch.seek(200)
    epoch.live.advance(206)
    assert history.record_claim(205) == Claim(120, 206)


def test_an_offset_after_a_child_record_claims_as_that_record_unless_the_primary_was_there() -> (
    None
):
    _, history, epoch = kip_session(70, 120)
    child = epoch.child_run(70)
    hand(child, 70, 120)
    epoch.live.advance(130)
    # commit(offsets=[m.offset() + 1]) of the child's record 89: commit(message=) of it
    assert history.child_offset_claim(90) == Claim(70, 90, child=True)
    # 120 follows the backlog's last record, and is where the primary started: position()
    # after the assignment said 120 too, and that claims nothing of the backlog
    assert history.child_offset_claim(120) is None
    assert history.position_claim(120) is None
    # an offset after no child record: the primary's position
    assert history.child_offset_claim(126) is None
    assert history.position_claim(126) == Claim(120, 126)
    # regained later with the log at 150, everything from 70 pending again: 120 was where a
    # primary started (an application may still hold that position()), 110 was not
    epoch.close()
    again = history.begin(150, 150)
    hand(again.child_run(70), 70, 150)
    assert history.child_offset_claim(120) is None
    assert history.child_offset_claim(110) == Claim(70, 110, child=True)


def test_a_seek_back_of_the_child_s_stream_unhands_what_it_handed_out_from_there() -> None:
    # issue 45: a bare commit after a helper's seek back claimed the records it had been
    # handed past the seek, before they were delivered again
    history = History()
    epoch = history.begin(UNKNOWN_START, UNKNOWN_START)
    first, second = epoch.child_run(0), epoch.child_run(20)
    hand(first, 0, 10)
    hand(second, 20, 30)
    assert history.unhand_child(5) == RangeSet([(5, 10), (20, 30)])
    assert epoch.handed_claims() == [Claim(0, 5, child=True)]
    assert history.record_claim(4) == Claim(0, 5, child=True)  # below the seek: as before
    assert history.record_claim(7) == Claim(7, 8, exact=False)  # above: itself alone
    # handed out again by a new run: claimed again, from that run's start
    again = epoch.child_run(5)
    hand(again, 5, 8)
    assert Claim(5, 8, child=True) in epoch.handed_claims()
    assert history.unhand_child(100) == RangeSet()


def test_forgotten_assignments_make_their_records_claim_themselves_alone() -> None:
    history = History()
    first = history.begin(100, 100)
    first.live.advance(200)
    first.close()
    for _ in range(20):
        history.begin(1000, 1000).close()
    assert history.record_claim(150) == Claim(150, 151, exact=False)
    assert history.position_claim(151) is None


# -- the stateful model ---------------------------------------------------------------------
class OnePartition(RuleBasedStateMachine):
    """One partition, its two commit logs, and a consumer process that may be assigned the
    partition many times, crash, and restart. Markers are offsets holding no record
    (transaction markers): nothing to process there, nothing to hand out."""

    @initialize(
        threshold=st.sampled_from([0, 3, 10, 30, 200]),
        max_bytes=st.sampled_from([4000, 4000, 80]),
        log_end=st.integers(0, 150),
        committed=st.integers(0, 150),
    )
    def setup(self, threshold: int, max_bytes: int, log_end: int, committed: int) -> None:
        """A previous owner crashed with ``committed`` committed; the log ends at
        ``log_end``; this process is assigned the partition."""
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.log_end = log_end
        self.markers: set[int] = set()
        self.processed: set[int] = set(range(min(committed, log_end)))
        self.dismissed: set[int] = set()
        self.group: tuple[int, str] | None = None
        if committed:
            self.group = (min(committed, log_end), "")
        self.child_log: tuple[int, str] | None = None
        self.new_process()
        self.assign(None)

    # -- the process -----------------------------------------------------------------------
    def new_process(self) -> None:
        self.history = History()
        #: (offset, stream, assignment number) in delivery order, this process
        self.deliveries: list[tuple[int, str, int]] = []
        self.done: list[bool] = []
        self.assigned = False
        self.epochs = 0

    # -- the logs ----------------------------------------------------------------------------
    def restored(self) -> Restored:
        if self.group is None:
            return restore(-1, None)
        c = self.child_log or (-1, None)
        return restore(self.group[0], self.group[1], c[0], c[1])

    def write(self, ledger: Ledger, change: Change) -> None:
        """What Consumer._write does for one partition."""
        cp = apply_change(ledger, change)
        if cp is not None:
            self.child_log = (cp.offset, encode_child_checkpoint(cp))
        gw = group_write(ledger, change.metadata, self.max_bytes, change.rewind)
        if gw is None:
            return
        if gw.coalesced is not None:
            ledger.pend(gw.coalesced)
            self.refresh_child()
        self.group = (gw.offset, gw.metadata)

    def ledger_for_commit(self) -> Ledger:
        if not self.assigned:
            return self.restored().ledger()
        if self.ledger is None:  # unplanned: the first commit reads the logs, and keeps them
            self.ledger = self.restored().ledger()
        return self.ledger

    # -- rules -------------------------------------------------------------------------------
    @rule(n=st.integers(1, 40), marker=st.booleans())
    def produce(self, n: int, marker: bool) -> None:
        self.log_end += n
        if marker:
            self.markers.add(self.log_end)
            self.log_end += 1

    @precondition(lambda self: not self.assigned)
    @rule(explicit=st.one_of(st.none(), st.integers(-1, 300)), unplanned=st.booleans())
    def assign(self, explicit: int | None, unplanned: bool = False) -> None:
        """``explicit``: the application's own start (-1: OFFSET_END). ``unplanned``: the
        logs could not be read (a hung broker): no ledger until the first commit reads
        one, no child, and the primary starts where librdkafka puts it."""
        r = self.restored()
        if unplanned:
            if explicit is None:  # the committed offset, else auto.offset.reset=earliest
                self.p_next = r.position if r.position is not None else 0
            else:
                self.p_next = self.log_end if explicit < 0 else min(explicit, self.log_end)
            start = self.p_next if explicit is not None and explicit >= 0 else UNKNOWN_START
            self.ledger = None
            self.epoch = self.history.begin(start, start)
            self.epochs += 1
            self.cursor = None
            self.assigned = True
            return
        if explicit is not None and explicit < 0:
            explicit = self.log_end
        requested = -1001 if explicit is None else min(explicit, self.log_end)
        plan = plan_assignment(r, 0, self.log_end, self.threshold, requested)
        self.ledger = plan.ledger
        self.epoch = self.history.begin(plan.floor, plan.run_start)
        self.epochs += 1
        self.p_next = plan.start if plan.start is not None and plan.start >= 0 else 0
        if explicit is not None and plan.start is not None:
            self.p_next = plan.run_start
        if explicit is not None and plan.start is not None and plan.run_start > plan.floor:
            # the application's own start: what it skips is skipped, as a plain consumer's
            self.dismissed |= set(range(plan.floor, plan.run_start))
        self.cursor: list[int] | None = None  # [pos, end] of the child's piece
        first = self.ledger.ranges.first()
        if first is not None and plan.run_start > first:
            self.start_child(0)
        self.assigned = True

    def start_child(self, at: int) -> None:
        piece = self.ledger.ranges.next_from(at)
        if piece is None:
            self.cursor = None
            return
        self.cursor = [piece[0], piece[1]]
        self.run = self.epoch.child_run(piece[0])

    def refresh_child(self) -> None:
        if self.assigned and self.cursor is not None:
            piece = self.ledger.ranges.next_from(self.cursor[0])
            if piece is None:
                self.cursor = None
            elif piece[0] != self.cursor[0]:
                self.start_child(self.cursor[0])
            else:
                self.cursor[1] = piece[1]

    @precondition(lambda self: self.assigned)
    @rule(fresh=st.integers(0, 30), backlog=st.integers(0, 30))
    def deliver(self, fresh: int, backlog: int) -> None:
        """poll()/consume(): the primary's records, then the child's."""
        self.primary_delivers(fresh)
        self.child_delivers(backlog)

    def primary_delivers(self, n: int) -> None:
        for _ in range(n):
            while self.p_next in self.markers:
                self.p_next += 1
            if self.p_next >= self.log_end:
                return
            self.epoch.resolve(self.p_next)  # an unplanned run starts at its first record
            self.deliveries.append((self.p_next, "p", self.epochs))
            self.done.append(False)
            self.p_next += 1

    def child_delivers(self, n: int) -> None:
        for _ in range(n):
            if self.cursor is None:
                return
            pos, end = self.cursor
            o = pos
            while o in self.markers:
                o += 1
            if o >= end or o >= self.log_end:
                # a record past the piece, or the end of the log (EOF) past it
                self.run.advance(end)
                piece = self.ledger.ranges.next_from(end)
                if piece is None:
                    self.cursor = None
                    return
                self.run.advance(piece[0])
                self.cursor = [piece[0], piece[1]]
                continue
            self.deliveries.append((o, "c", self.epochs))
            self.done.append(False)
            self.run.handed(o)
            self.cursor[0] = o + 1

    @precondition(lambda self: not all(self.done))
    @rule(in_order=st.booleans(), pick=st.integers(0, 10**6), many=st.integers(1, 40))
    def process(self, in_order: bool, pick: int, many: int) -> None:
        """The application processes held records: the oldest first, or out of order."""
        pending = [i for i, d in enumerate(self.done) if not d]
        if not pending:
            return
        if not in_order:
            pending = pending[pick % len(pending) :] + pending[: pick % len(pending)]
        for i in pending[:many]:
            self.done[i] = True
            self.processed.add(self.deliveries[i][0])

    def eligible(self, pick: int, same_stream: bool) -> int | None:
        """A delivery the application may commit under Kafka's contract: every record
        handed out before it (by its own stream in its own assignment, for a message;
        by anyone, for an offset) is processed, whichever copy was processed."""
        ok = []
        for i, (offset, stream, epoch) in enumerate(self.deliveries):
            if offset not in self.processed:
                if not same_stream:
                    break
                continue
            if same_stream and any(
                o not in self.processed
                for o, s, e in self.deliveries[:i]
                if (s, e) == (stream, epoch)
            ):
                continue
            ok.append(i)
        return ok[-1 - pick % len(ok)] if ok else None

    @precondition(lambda self: self.deliveries)
    @rule(
        kind=st.sampled_from(["message", "message", "offset", "bare", "rewind"]),
        pick=st.integers(0, 10**6),
        metadata=st.sampled_from(["", "app", "~fr-app"]),
        catch_up=st.booleans(),
    )
    def commit(self, kind: str, pick: int, metadata: str, catch_up: bool) -> None:
        if catch_up:  # a synchronous application: everything it holds is processed first
            self.process(True, 0, len(self.done))
        if kind == "rewind":
            # an offset whose record nobody of this process handed out (a rewind) claims
            # nothing: the application may commit any (after a child's record it claims
            # what committing that record would: the "offset" kind's)
            offset = pick % 400
            handed = {o for o, _, _ in self.deliveries}
            if offset - 1 not in handed and offset - 1 not in self.markers:
                self.commit_position(offset, metadata)
            return
        if kind == "bare":
            if self.assigned and all(self.done):
                self.observe()
                claims = self.epoch.handed_claims()
                if claims:
                    self.write(self.ledger_for_commit(), Change(claims))
            return
        i = self.eligible(pick, same_stream=kind == "message")
        if i is None:
            return
        offset = self.deliveries[i][0]
        if kind == "message":
            self.observe()
            claim = self.history.record_claim(offset)
            self.write(self.ledger_for_commit(), Change([claim]))
        else:
            self.commit_position(offset + 1, metadata)

    def commit_position(self, offset: int, metadata: str) -> None:
        """As the facade's commit(offsets=) (``_committing._offset_changes``)."""
        self.observe()
        claim = self.history.child_offset_claim(offset)
        change = Change([claim] if claim is not None else [])
        if claim is None:
            claim = self.history.position_claim(offset)
            change = Change([claim] if claim is not None else [])
            change.rewind = offset
        change.metadata = metadata
        ledger = self.ledger_for_commit()
        if ledger.position is None:
            # nothing was ever committed: the first commit says where the group starts,
            # as a plain consumer's does (the application skips what lies below)
            self.dismissed |= set(range(offset))
        self.write(ledger, change)

    @precondition(lambda self: self.assigned)
    @rule(to=st.integers(0, 400))
    def seek(self, to: int) -> None:
        if to > self.p_next:
            # a plain consumer's skip: committing past it is the application's choice
            self.dismissed |= set(range(max(self.epoch.floor, self.p_next), to))
        self.observe()
        self.epoch.seek(to)
        self.p_next = to

    def observe(self) -> None:
        """The facade reads librdkafka's position into the primary's live run."""
        if self.assigned:
            self.epoch.live.advance(self.p_next)

    def leave(self, how: str, collected: int) -> None:
        """The partition leaves the assignment. ``how``: the position is known (a poll());
        only an upper bound is (a revoke inside consume(): librdkafka also counted the
        ``collected`` records of the batch, which the application never gets); nothing is
        (the partition is assigned again while still assigned)."""
        if how == "known":
            self.observe()
            self.epoch.close()
        elif how == "bounded":
            self.epoch.live.widen(self.p_next + collected)
            self.epoch.close()
        self.assigned = False
        self.cursor = None

    @precondition(lambda self: self.assigned)
    @rule(now=st.integers(0, 3), how=st.sampled_from(["known", "bounded"]), n=st.integers(0, 9))
    def revoke(self, now: int, how: str, n: int) -> None:
        if now:  # (rules without arguments would be drawn far more often than the rest)
            return
        self.leave(how, n)

    @precondition(lambda self: self.assigned)
    @rule(
        produced=st.integers(0, 60),
        how=st.sampled_from(["known", "bounded", "unknown"]),
        n=st.integers(0, 9),
    )
    def rebalance(self, produced: int, how: str, n: int) -> None:
        """Revoked and regained at once (or assigned again while still assigned), with
        records produced meanwhile: held records are now from an earlier assignment."""
        self.leave(how, n)
        self.log_end += produced
        self.assign(None)

    @precondition(lambda self: self.deliveries)
    @rule(now=st.integers(0, 5))
    def crash(self, now: int) -> None:
        if not now:
            self.new_process()

    # -- the promise -------------------------------------------------------------------------
    def assert_true(self, claim: set[int], what: str) -> None:
        wrong = claim - self.processed - self.dismissed - self.markers
        wrong = {o for o in wrong if o < self.log_end}
        assert not wrong, f"{what} claims unprocessed offsets {sorted(wrong)[:10]}"

    @invariant()
    def every_log_claims_only_what_was_processed(self) -> None:
        if not hasattr(self, "group"):
            return
        if self.group is not None:
            offset, metadata = self.group
            self.assert_true(set(range(offset)), "the group's offset")
            try:
                token = decode_group_token(metadata)
            except TokenError:
                token = None
            if token is not None and token.safe_offset == offset:
                pending = {o for s, e in token.ranges for o in range(s, e)}
                self.assert_true(set(range(token.position)) - pending, "the group's token")
        if self.child_log is not None:
            offset, metadata = self.child_log
            cp = decode_child_checkpoint(metadata, offset)
            assert cp is not None
            self.assert_true(set(range(cp.start, cp.offset)), "the child's checkpoint")
        r = self.restored()
        if r.position is not None:
            self.assert_true(claimed(r.ledger()), "a restart")
        if self.assigned and self.ledger is not None and self.ledger.position is not None:
            self.assert_true(claimed(self.ledger), "the ledger in memory")

    @invariant()
    def the_token_round_trips_user_metadata(self) -> None:
        if getattr(self, "group", None) is None:
            return
        assert self.restored().user_metadata in (None, "", "app", "~fr-app")


TestOnePartition = OnePartition.TestCase
TestOnePartition.settings = settings(
    max_examples=int(os.environ.get("FASTREBALANCE_MODEL_EXAMPLES", 120)),
    stateful_step_count=50,
    deadline=None,
)


def test_range_set_last_overlapping() -> None:
    r = RangeSet([(0, 10), (20, 30)])
    assert r.last_overlapping(5, 25) == (20, 30)
    assert r.last_overlapping(10, 20) is None
    assert r.last_overlapping(0, 1) == (0, 10)
