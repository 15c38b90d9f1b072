"""A member's part in group-wide catch-up (owner and helper), with the claims log and the
child replaced by in-memory stand-ins: offers, claims, done only after the commit, the
owner absorbing done chunks, a slow member losing its chunk."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fastrebalance._claims import ClaimRecord
from fastrebalance._config import ParallelConfig
from fastrebalance._groupcatchup import GroupCatchup
from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._routing import Epoch

KEY = ("t", 0)
SETTINGS = ParallelConfig(
    enabled=True,
    group_catchup=True,
    claim_timeout_ms=1000,
    chunk_records=10,
    claims_topic="g.catchup.claims",
)


@pytest.fixture(autouse=True)
def _two_chunks_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 10 records here: members hold 2 ahead, as with the default chunk size."""
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 20)


class Log:
    """One shared log; each member reads it at its own pace."""

    def __init__(self, shared: list[tuple[ClaimRecord, int]], clock: list[int]) -> None:
        self.shared, self.clock, self.pos = shared, clock, 0
        self.topic, self.started, self.caught_up, self.send_failures = "g", True, True, 0
        self.missing = False

    def send(self, rec: ClaimRecord) -> None:
        self.shared.append((rec, self.clock[0]))

    def read(self, num: int = 1000, wait_s: float = 0.0) -> list[tuple[ClaimRecord, int]]:
        out, self.pos = self.shared[self.pos :], len(self.shared)
        return out

    @property
    def position(self) -> int:
        return self.pos

    def end(self, timeout_s: float) -> int:
        return len(self.shared)

    def flush(self, timeout: float) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass


class Child:
    """Reads a chunk when told; hands its records out when the test says so."""

    def __init__(self) -> None:
        self.cursors: dict[Any, Any] = {}
        self.stopped: list[Any] = []
        self.paused: set[Any] = set()
        self.favoured: set[Any] = set()

    def favour(self, keys: Any) -> None:
        self.favoured = set(keys)

    def is_paused(self, key: Any) -> bool:
        return key in self.paused

    def start(self, key: Any, ledger: Ledger, epoch: Epoch, at: int = 0) -> None:
        piece = ledger.ranges.next_from(at)
        assert piece is not None
        self.cursors[key] = (ledger, epoch.child_run(piece[0]))

    def refresh(self, key: Any) -> None:
        pass  # hand_all reads the ledger as it is then

    def stop(self, keys: Any) -> None:
        for k in keys:
            self.cursors.pop(k, None)
            self.stopped.append(k)

    def position(self, key: Any) -> int | None:
        c = self.cursors.get(key)
        return c[1].next if c else None

    def hand_all(self, key: Any) -> tuple[int, int]:
        """Every record of the ledger, as the child reads on through it: a chunk that
        joined it while it read (the chain) included."""
        ledger, run = self.cursors.pop(key)
        s, e = run.next, ledger.ranges.last_end()
        for o in range(s, e):
            run.handed(o)
        return s, e


class Member:
    def __init__(self, name: str, shared: list[Any], clock: list[int]) -> None:
        self.child = Child()
        self.g = GroupCatchup(SETTINGS, {}, self.child, member=name)  # type: ignore[arg-type]
        self.g._log = Log(shared, clock)  # type: ignore[assignment]
        self.g.subscribed([KEY[0], "^other-.*"])
        self.writes: list[list[Any]] = []
        self.g.write_group = self._write_group
        self.now = time.monotonic()

    def _write_group(self, keys: list[Any]) -> None:
        """The group's commit, taken by the broker at once (its on_commit)."""
        self.writes.append(keys)
        self.g.group_committed(keys)

    def tick(self) -> None:
        self.now += 1.0  # past the tick's throttle and the heartbeat interval
        self.g.tick(self.now)


def _team() -> tuple[Member, Member, list[Any], list[int]]:
    shared: list[Any] = []
    clock = [1_000]
    return Member("a", shared, clock), Member("b", shared, clock), shared, clock


def _kinds(shared: list[Any], member: str, kind: str) -> list[tuple[int, int]]:
    return [rec.chunks[0] for rec, _ in shared if rec.member == member and rec.kind == kind]


def test_done_only_after_the_commit_and_the_owner_absorbs_it() -> None:
    a, b, shared, _ = _team()
    ledger = Ledger(100, RangeSet([(0, 30)]))
    a.g.own([(KEY, ledger)])
    a.tick()  # offers 3 chunks, claims one
    offers = [rec for rec, _ in shared if rec.kind == "offer"]
    assert [o.chunks for o in offers] == [((0, 10), (10, 20), (20, 30))]
    for _ in range(3):
        b.tick()
        a.tick()
    won_b = [ck for ck in b.g._held]
    assert won_b and KEY in b.child.cursors  # b reads a chunk it won
    s, e = b.child.hand_all(KEY)
    b.tick()
    assert _kinds(shared, "b", "done") == []  # handed out is not processed
    b.g.commit(b.g.handed({}), sync=False, timeout_s=1)
    assert (s, e) in _kinds(shared, "b", "done")
    before = ledger.ranges.count()
    a.tick()
    assert ledger.ranges.count() == before - (e - s)
    assert all(not (s <= o < e) for o in range(0, 30) if o in ledger.ranges)
    assert a.writes and a.writes[-1] == [KEY]


def test_a_commit_of_part_of_a_chunk_declares_nothing() -> None:
    a, b, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 10)])))])
    a.tick()
    b.tick()
    for m in (a, b):
        m.tick()
    holder = a if KEY in a.child.cursors else b
    s, e = holder.child.hand_all(KEY)
    run = holder.g._helped[KEY].runs[(KEY[0], KEY[1], s, e)]
    # a commit of a record in the middle claims its run up to it, not the chunk
    holder.g.commit({KEY: [holder.g._helped[KEY].history.record_claim(s + 4)]}, False, 1)
    holder.tick()
    assert _kinds(shared, holder.g.member, "done") == []
    assert run.last == e - 1
    holder.g.commit({KEY: [holder.g._helped[KEY].history.record_claim(e - 1)]}, False, 1)
    assert _kinds(shared, holder.g.member, "done") == [(s, e)]


def test_a_member_silent_past_the_timeout_loses_its_chunk_and_stops_reading_it() -> None:
    a, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    owner.g.own([(KEY, Ledger(100, RangeSet([(0, 10)])))])
    owner.tick()
    b.tick()  # claims the only chunk
    b.tick()  # sees it won: reads it
    assert KEY in b.child.cursors and b.g._held == {("t", 0, 0, 10)}
    a.tick()
    assert a.g._held == set()  # held by a live member: not claimable
    clock[0] += 5_000  # b says nothing for 5 s of log time; the owner heartbeats
    owner.tick()
    a.tick()  # b's claim expired: a claims the chunk
    a.tick()
    assert a.g._held == {("t", 0, 0, 10)}
    b.tick()
    assert b.g._held == set() and KEY in b.child.stopped and KEY not in b.child.cursors
    assert b.g.chunks_lost == 1
    # b's late commit of what it had read declares nothing
    b.g.commit(b.g.handed({}), sync=False, timeout_s=1)
    assert _kinds(shared, "b", "done") == []


def _read_every_chunk(m: Member, ticks: int) -> list[tuple[int, int]]:
    """One member alone: tick and hand out every chunk its child starts, in the order it
    reads them (nothing committed)."""
    order = []
    for _ in range(ticks):
        m.tick()
        if KEY in m.child.cursors:
            pending = m.child.cursors[KEY][0].ranges.copy()
            s, e = m.child.hand_all(KEY)  # a chain of chunks read in one go: each of them
            # (the pending offsets of each chunk: a chain can join a chunk whose first
            # offsets were done already, handed back by another member)
            step = SETTINGS.chunk_records
            for rs, re_ in pending:
                rs, re_ = max(rs, s), min(re_, e)
                while rs < re_:
                    cut = min(re_, (rs // step + 1) * step)
                    order.append((rs, cut))
                    rs = cut
    return order


def test_committing_a_record_claims_the_chunks_its_stream_handed_out_before_it() -> None:
    # adversary of issue 22 (repro/r02): a poll loop committing every N-th record by
    # message never finished a chunk whose last records came before a commit point in the
    # next chunk: the commit claimed only its own chunk's run (4 of 5 chunks held for ever)
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    order = _read_every_chunk(a, 12)
    assert sorted(order) == [(0, 10), (10, 20), (20, 30)]
    h = a.g._helped[KEY]
    first, second, third = order
    # the application processed everything up to a record in the middle of the second chunk
    a.g.commit({KEY: [c for m in [first[0] + 5, second[0] + 4] for c in _claims(a, m)]}, False, 1)
    assert _kinds(shared, "a", "done") == [first]
    # ... and up to the last record of the third: all of it was handed out before
    a.g.commit({KEY: _claims(a, third[1] - 1)}, False, 1)
    assert sorted(_kinds(shared, "a", "done")) == sorted(order)
    assert not h.ledger.ranges


def test_a_commit_claims_nothing_its_stream_handed_out_after_the_record() -> None:
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    order = _read_every_chunk(a, 12)
    first = order[0]
    # a record of the first chunk: the later chunks were handed out after it
    a.g.commit({KEY: _claims(a, first[1] - 1)}, False, 1)
    assert _kinds(shared, "a", "done") == [first]
    assert a.g._helped[KEY].ledger.ranges.count() == 20


def _claims(m: Member, offset: int) -> list[Any]:
    from confluent_kafka import Message

    mine, rest = m.g.split([Message(topic=KEY[0], partition=KEY[1], offset=offset)])
    assert rest == []
    return mine[KEY]


def test_a_bare_commit_after_more_chunks_than_a_history_keeps_finishes_every_chunk() -> None:
    # adversary of issue 22 (repro/r01): with small chunks and the 5 s auto-commit, a
    # member read more than MAX_RUNS chunks between two commits; the runs of the oldest were
    # dropped from the history and no bare commit claimed them: 128 of 200 chunks held
    # for ever, the group's offset stayed at 0
    from fastrebalance._routing import MAX_RUNS

    a, _, shared, _ = _team()
    n = MAX_RUNS + 6
    a.g.own([(KEY, Ledger(10 * n + 10, RangeSet([(0, 10 * n)])))])
    order = _read_every_chunk(a, 3 * n)
    assert len(order) == n
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)
    assert len(_kinds(shared, "a", "done")) == n


def test_a_claim_read_back_after_the_member_gave_up_on_it_is_still_its_own(
    monkeypatch: Any,
) -> None:
    # adversary of issue 22 (repro/r09): the broker paused 14 s with a claim in flight; the
    # member gave the claim up after 10 s and claimed another chunk; the first claim was
    # then written and won, but the member ignored it: a chunk held for ever by a live
    # member that did not know it (the group's offset stayed below it, 1,000 records never
    # read, 120 s)
    import itertools

    from fastrebalance import _groupcatchup
    from fastrebalance._groupcatchup import _CLAIM_GIVE_UP_S

    # each claim picks the next free chunk: never the same twice (the first, claimed as it
    # is offered, is the first chunk)
    picks = itertools.count(1)
    monkeypatch.setattr(_groupcatchup.random, "choice", lambda seq: seq[next(picks) % len(seq)])
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    late: list[Any] = []
    log = a.g._log
    send = log.send
    log.send = late.append  # type: ignore[method-assign]  # the broker does not answer
    a.tick()
    shared.extend((rec, 1_000) for rec in late if rec.kind == "offer")
    a.tick()
    first = dict(a.g._claims_out)
    assert first
    for _ in range(int(_CLAIM_GIVE_UP_S) + 2):
        a.tick()
    # gave up, claimed again (alone, it claims the first free chunks: the same ones)
    assert a.g._claims_out and a.g._claims_out != first
    assert len([rec for rec in late if rec.kind == "claim"]) > len(first)
    log.send = send  # type: ignore[method-assign]  # the broker answers: both claims land
    shared.extend((rec, 1_000) for rec in late if rec.kind == "claim")
    order = _read_every_chunk(a, 12)
    assert sorted(order) == [(0, 10), (10, 20), (20, 30)]
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)
    assert sorted(_kinds(shared, "a", "done")) == sorted(order)


def test_a_member_closing_mid_chunk_hands_back_what_it_committed() -> None:
    # adversary of issue 22 (repro/r04): a member closed cleanly in the middle of a chunk
    # after committing the 700 records it processed; whoever took the chunk over read it
    # from its start: 700 duplicates with no crash (0 with per-member catch-up)
    a, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 10)]))
    owner.g.own([(KEY, ledger)])
    owner.tick()
    b.tick()  # claims the only chunk
    b.tick()  # reads it
    assert b.g._held == {("t", 0, 0, 10)}
    b.child.hand_all(KEY)
    b.g.commit({KEY: _claims(b, 5)}, sync=False, timeout_s=1)  # processed 0..5
    b.g.close(1)
    a.tick()  # the chunk is free (bye): a claims it
    a.tick()
    assert a.g._held == {("t", 0, 0, 10)}
    assert a.child.hand_all(KEY) == (6, 10)  # only what b did not commit
    a.tick()
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)
    assert _kinds(shared, "a", "done") == [(0, 10)]
    owner.tick()
    assert not ledger.ranges  # the group's offset may pass the whole chunk


def test_a_chunk_whose_every_offset_is_done_is_done_without_reading() -> None:
    a, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 10)]))
    owner.g.own([(KEY, ledger)])
    owner.tick()
    b.tick()
    b.tick()
    b.child.hand_all(KEY)
    b.tick()
    b.g.commit({KEY: _claims(b, 9)}, sync=False, timeout_s=1)
    assert _kinds(shared, "b", "done") == [(0, 10)]
    # an offer of a piece of a done chunk (in its lineage), claimed by a: done at once,
    # nothing read
    shared.append((ClaimRecord("offer", "o", "t", 0, ((2, 6),), ledger.lineage), clock[0]))
    a.tick()
    a.tick()
    a.tick()
    assert KEY not in a.child.cursors
    assert _kinds(shared, "a", "done") == [(2, 6)]


def test_a_member_that_unsubscribes_gives_its_chunks_back_and_claims_no_more() -> None:
    # adversary of issue 22 (repro/r13): after unsubscribe() a member went on claiming
    # chunks of the topic it left and poll() handed out 11,100 more of its records in 15 s
    # (a plain consumer returns nothing after unsubscribe())
    a, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    owner.g.own([(KEY, Ledger(100, RangeSet([(0, 20)])))])
    owner.tick()
    a.tick()
    a.tick()
    assert a.g._held and KEY in a.child.cursors
    s, _e = a.child.hand_all(KEY)
    a.g.commit({KEY: _claims(a, s + 3)}, sync=False, timeout_s=1)
    held = set(a.g._held) | set(a.g._claims_out)
    a.g.stop_helping()
    # the chunk was read to its end (the commit saw that): nothing for the child to stop
    assert a.g._held == set() and KEY not in a.child.cursors
    for _ in range(3):
        a.tick()
    assert KEY not in a.child.cursors and a.g._held == set()
    recs = [(rec.kind, rec.chunks) for rec, _ in shared if rec.member == "a"]
    assert ("done", ((s, s + 4),)) in recs  # what it committed, handed back
    assert {c for k, c in recs if k == "release"} == {(ck[2:],) for ck in held}
    assert [k for k, _ in recs].count("claim") == len(held) + 1  # none since, but the piece's
    # b takes everything over, without what a committed
    read = _read_every_chunk(b, 8)
    assert sorted(read) == sorted([(s + 4, s + 10), (10 - s, 20 - s)])
    a.g.helping = True  # subscribe() again
    a.tick()


def test_a_member_claims_chunks_only_of_the_topics_it_reads() -> None:
    """Kafka allows members of one group different subscriptions: a member never claims a
    chunk of a topic it did not subscribe to (by name or pattern) or was not assigned."""
    a, b, shared, _ = _team()
    b.g.subscribed(["y"])  # b reads y only
    a.g._maybe_claim = lambda now: None  # type: ignore[method-assign]  # a only offers
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    a.g.own([(("other-1", 0), Ledger(100, RangeSet([(0, 10)])))])
    a.tick()
    for _ in range(6):
        b.tick()
    assert _kinds(shared, "b", "claim") == []
    # a pattern: only topics librdkafka assigned it are known to match its regex dialect
    b.g.subscribed([r"^other-\d"])
    for _ in range(3):
        b.tick()
    assert _kinds(shared, "b", "claim") == []
    b.g.assigned_topics = lambda: {"other-1"}
    for _ in range(3):
        b.tick()
    claimed = [rec for rec, _ in shared if rec.member == "b" and rec.kind == "claim"]
    assert claimed and {rec.topic for rec in claimed} == {"other-1"}
    c = Member("c", shared, [1_000])
    c.g.stop_helping()  # not subscribed (assign()): the topics of its assignment
    c.g.helping = True
    c.g.assigned_topics = lambda: {"t"}
    for _ in range(3):
        c.tick()
    assert {rec.topic for rec, _ in shared if rec.member == "c" and rec.kind == "claim"} == {"t"}


def test_a_paused_partition_holds_no_claim_back() -> None:
    """pause() of one partition: its chunks are not claimed, and those held count for no
    work ahead, so another partition's chunks are claimed and read."""
    a, _, shared, _ = _team()
    other = ("t", 1)
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 40)])))])
    for _ in range(6):
        a.tick()
    assert len(a.g._held) == 2  # PREFETCH chunks of KEY: no more claims while they wait
    a.g.own([(other, Ledger(100, RangeSet([(0, 40)])))])
    for _ in range(4):
        a.tick()
    assert {ck[:2] for ck in a.g._held} == {KEY}
    a.child.paused.add(KEY)  # the application pauses KEY
    for _ in range(4):
        a.tick()
    assert {ck[:2] for ck in a.g._held} == {KEY, other}
    claimed = [(rec.topic, rec.partition) for rec, _ in shared if rec.kind == "claim"]
    assert claimed[-1] == other and claimed.count(KEY) == 2


def test_settle_absorbs_the_members_own_last_done_before_it_leaves() -> None:
    """A member that owns a partition and read its chunks itself commits the last records
    and closes: settle() publishes the last done (the chunk just read to its end) and
    absorbs it, with no tick in between (before: the group's offset stayed at the start)."""
    a, _, shared, _ = _team()
    ledger = Ledger(100, RangeSet([(0, 10)]))
    a.g.own([(KEY, ledger)])
    for _ in range(3):
        a.tick()  # offered, claimed, won: reading
    assert a.g._helped[KEY].chain == [(*KEY, 0, 10)]
    a.child.hand_all(KEY)  # read to its end: no tick saw it
    a.g.commit(a.g.handed({}), sync=True, timeout_s=1.0)
    a.g.settle(1.0)
    assert _kinds(shared, "a", "done") == [(0, 10)]
    # (the first write: the group's token carrying the backlog's new lineage)
    assert not ledger.ranges and a.writes == [[KEY], [KEY]]


def _last_free(monkeypatch: Any) -> None:
    """random.choice picks the last free chunk: a claim that follows the chunk being read
    is then the preference's doing, not chance's."""
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup.random, "choice", lambda seq: seq[-1])


def test_the_next_chunk_joins_the_one_being_read_with_no_restart(monkeypatch: Any) -> None:
    # one member alone drained 300,000 records in 18.3 s against 16.2 s without group
    # catch-up on Apache Kafka 3.9: each chunk was started afresh (unassign, assign, a new
    # fetch: 60-140 ms each); the chunk after the one being read joins it instead
    _last_free(monkeypatch)
    starts: list[Any] = []
    a, _, shared, _ = _team()
    real_start = a.child.start
    a.child.start = lambda *args, **kw: (starts.append(args[0]), real_start(*args, **kw))  # type: ignore[method-assign]
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 40)])))])
    for _ in range(4):
        a.tick()
    h = a.g._helped[KEY]
    # the owner claimed the first chunk as it offered it, then the one after it
    assert h.chain == [(*KEY, 0, 10), (*KEY, 10, 20)]
    assert len(starts) == 1 and h.cursor is not None
    assert h.cursor.ranges.as_tuple() == ((0, 20),)
    assert a.child.hand_all(KEY) == (0, 20)  # read on from one chunk into the next
    a.g.commit({KEY: _claims(a, 19)}, sync=False, timeout_s=1)
    assert sorted(_kinds(shared, "a", "done")) == [(0, 10), (10, 20)]


@pytest.mark.parametrize("lost", ["current", "next"])
def test_a_chunk_lost_from_the_chain_cuts_it_there(monkeypatch: Any, lost: str) -> None:
    # the child's run must never reach past a chunk this member no longer holds: a commit
    # after it would claim that chunk's offsets, which the member may win and hold again
    _last_free(monkeypatch)
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 40)])))])
    for _ in range(4):
        a.tick()
    h = a.g._helped[KEY]
    first, second = h.chain
    a.g._drop(first if lost == "current" else second, "lost (test)")
    if lost == "next":
        assert h.chain == [first] and h.cursor is not None
        assert h.cursor.ranges.as_tuple() == ((0, 10),)
        assert a.child.hand_all(KEY) == (0, 10)
        a.g.commit({KEY: _claims(a, 9)}, sync=False, timeout_s=1)
        assert _kinds(shared, "a", "done") == [(0, 10)]
    else:
        assert h.chain == [] and KEY in a.child.stopped and h.queue == [second]
        a.tick()
        assert h.chain == [second] and a.child.hand_all(KEY)[0] == 10  # a new run
        a.g.commit({KEY: _claims(a, 19)}, sync=False, timeout_s=1)
        assert _kinds(shared, "a", "done") == [(10, 20)]


def test_small_chunks_are_claimed_ahead_by_records_not_by_two(monkeypatch: Any) -> None:
    # chunks of 1,000 records (50 ms of work each) were read before the claim of the next
    # came back: the child ran dry and started each chunk afresh (5.97 s against 2.68 s)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    a, _, _, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 100)])))])
    for _ in range(12):
        a.tick()
    assert len(a.g._held) == 5  # 50 records ahead in chunks of 10


def test_a_partition_nobody_reads_gets_a_reader_before_another_gets_two(
    monkeypatch: Any,
) -> None:
    # adversary of issue 32 (s_starve): 2 members, 2 partitions of 30,000; free chunks come
    # in offer order (partition 0's, then 1's), both members read partition 0's chunks and
    # partition 1's backlog got none (0 of 30,000 in 7 s, 5 of 5 runs)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup.random, "choice", lambda seq: seq[0])
    a, b, _, _ = _team()
    other = (KEY[0], 1)
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 40)]))), (other, Ledger(100, RangeSet([(0, 40)])))])
    a.tick()  # offers both partitions' chunks, claims the first of each
    for _ in range(3):
        b.tick()
    a.tick()  # its claims read back: won
    # every partition is read, and b, come second, is not left idle or doubling a's reads
    assert {ck[:2] for ck in a.g._held} | {ck[:2] for ck in b.g._held} == {KEY, other}
    assert b.g._held and not b.g._held & a.g._held, (a.g._held, b.g._held)


class _Unstartable:
    """A claims log whose every start fails with ``error`` (a KafkaError code)."""

    def __init__(self, code: int) -> None:
        self.code, self.tries = code, 0
        self.topic, self.started, self.caught_up, self.send_failures = "g", False, False, 0
        self.missing, self.position = False, 0

    def start(self) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self.tries += 1
        raise KafkaException(KafkaError(self.code, "no"))

    def close(self, timeout: float) -> None:
        pass


def _unstartable_owner(code: int) -> tuple[GroupCatchup, list[list[Any]], Ledger]:
    g = GroupCatchup(SETTINGS, {}, Child(), member="a")  # type: ignore[arg-type]
    g._log = _Unstartable(code)  # type: ignore[assignment]
    alone: list[list[Any]] = []
    g.read_alone = alone.append
    ledger = Ledger(100, RangeSet([(0, 30)]))
    g.own([(KEY, ledger)])
    return g, alone, ledger


def test_a_claims_topic_kafka_refuses_falls_back_to_the_members_own_catchup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # issue 48: app.1's claims topic collided with app_1's (TOPIC_EXCEPTION at every start):
    # 0 of 20,000 backlog records in 20 s, a WARNING every 2 s for ever
    from confluent_kafka import KafkaError

    g, alone, ledger = _unstartable_owner(KafkaError.TOPIC_EXCEPTION)
    with caplog.at_level("ERROR", logger="fastrebalance.group"):
        g.tick(time.monotonic())
    assert alone == [[KEY]]  # the owner's child reads the backlog, at the first failure
    assert g.unusable is not None and "cannot be started" in g.unusable
    assert g.status()["unusable"] == g.unusable
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "parallel.rebalance.group.claims.topic" in errors[0].getMessage()
    assert ledger.ranges.count() == 30  # nothing taken out: the child reads it all
    # later assignments go to the child at once; the log is never tried again
    tries = g._log.tries  # type: ignore[attr-defined]
    g.own([(("t", 1), Ledger(50, RangeSet([(0, 5)])))])
    g.tick(time.monotonic() + 100)
    assert alone[-1] == [("t", 1)] and g._log.tries == tries  # type: ignore[attr-defined]
    assert not g.pending


def test_a_claims_log_down_past_the_bound_falls_back_and_not_before() -> None:
    from confluent_kafka import KafkaError

    from fastrebalance._groupcatchup import START_GIVE_UP_S

    g, alone, _ = _unstartable_owner(KafkaError._TRANSPORT)
    t0 = time.monotonic()
    g.tick(t0)
    t = t0
    while t < t0 + START_GIVE_UP_S - 3:
        t += 2.5
        g.tick(t)
    assert alone == [] and g.unusable is None  # a broker restart may take this long
    g.tick(t0 + START_GIVE_UP_S + 1)
    assert alone == [[KEY]] and g.unusable is not None


def test_a_claims_topic_the_member_subscribes_to_is_never_used() -> None:
    g = GroupCatchup(SETTINGS, {}, Child(), member="a")  # type: ignore[arg-type]
    g.subscribed(["orders", SETTINGS.claims_topic])
    assert g.unusable is not None and "subscribes to" in g.unusable
    assert not g.helping


@pytest.mark.parametrize(
    ("code", "final"),
    [("TOPIC_EXCEPTION", True), ("TOPIC_AUTHORIZATION_FAILED", True),
     ("GROUP_AUTHORIZATION_FAILED", True), ("POLICY_VIOLATION", True),
     ("_TRANSPORT", False), ("_TIMED_OUT", False), ("NOT_LEADER_FOR_PARTITION", False),
     ("LEADER_NOT_AVAILABLE", False)],
)  # fmt: skip
def test_which_claims_log_failures_are_final(code: str, final: bool) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from fastrebalance._claimslog import permanent

    assert permanent(KafkaException(KafkaError(getattr(KafkaError, code)))) is final
    assert not permanent(RuntimeError("closed"))


def _helper_with_chunks() -> tuple[Member, Member, list[Any]]:
    a, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    owner.g.own([(KEY, Ledger(100, RangeSet([(0, 20)])))])
    owner.tick()
    a.tick()
    a.tick()
    assert a.g._held and KEY in a.child.cursors
    return a, b, shared


def test_a_changed_subscription_gives_back_the_chunks_of_a_topic_left() -> None:
    # issue 45: after commit() and subscribe([Y]) a helper went on handing out chunks of X
    # (8,000 records within 0.6 s: its new code would have processed them)
    a, b, shared = _helper_with_chunks()
    s, _e = a.child.hand_all(KEY)
    a.g.commit({KEY: _claims(a, s + 3)}, sync=False, timeout_s=1)
    held = set(a.g._held) | set(a.g._claims_out)
    a.g.subscribed(["y"])
    assert a.g._held == set() and KEY not in a.child.cursors
    for _ in range(3):
        a.tick()  # a claim in flight before the change, won after it: released too
    assert a.g._held == set() and KEY not in a.child.cursors
    recs = [(rec.kind, rec.chunks) for rec, _ in shared if rec.member == "a"]
    assert ("done", ((s, s + 4),)) in recs  # what it committed, handed back
    assert {c for k, c in recs if k == "release"} == {(ck[2:],) for ck in held}
    assert _kinds(shared, "a", "claim").count((s, s + 4)) == 1  # no claim of t since
    assert sorted(_read_every_chunk(b, 8)) == sorted([(s + 4, s + 10), (10 - s, 20 - s)])
    # a subscription that still names t keeps its chunks
    c, _, _ = _helper_with_chunks()
    held = set(c.g._held)
    c.g.subscribed([KEY[0], "y"])
    assert c.g._held == held


def test_seeking_back_into_a_held_chunk_gives_it_back_from_there() -> None:
    # issue 45: api.md's recipe (commit the last good record, seek() back to the bad one) on
    # a chunk record raised _UNKNOWN_PARTITION and ended an ordinary poll loop
    a, b, _ = _helper_with_chunks()
    s, _e = a.child.hand_all(KEY)
    a.g.commit({KEY: _claims(a, s + 4)}, sync=False, timeout_s=1)  # good up to s + 4
    assert a.g.seek_back(KEY, s + 5)
    # every chunk from the bad record on went back (a chunk below it, never handed out, may
    # still wait in a's queue: it claims several at once)
    assert not [ck for ck in a.g._held if ck[3] > s + 5] and KEY not in a.child.cursors
    # the bad record and everything after it is read again (here by b), nothing before it
    read = _read_every_chunk(b, 8)
    assert (s + 5, s + 10) in read and all(e <= s or st >= s + 5 for st, e in read)
    assert not a.g.seek_back(KEY, s + 5)  # nothing held any more: not a chunk of its
    assert not a.g.seek_back(("other", 0), 3)


# -- lineages: a done is true of the backlog it was written for -------------------------------
def _offers(shared: list[Any]) -> list[tuple[tuple[int, int], str]]:
    return [(c, rec.lineage) for rec, _ in shared if rec.kind == "offer" for c in rec.chunks]


def test_done_chunks_of_an_earlier_reading_are_not_absorbed_into_a_new_one() -> None:
    # issue 48: a member drained a backlog; an operator reset the group to 0 (our token
    # dropped) and a new member planned [0, end) again: the grid cut it into the chunks
    # the claims log said were done, and the owner absorbed them unread (6,000 of 8,000
    # records never delivered, the group's offset past them)
    a, b, shared, clock = _team()
    first = Ledger(100, RangeSet([(0, 20)]))
    a.g.own([(KEY, first)])
    assert first.lineage  # drawn before anything is offered
    assert sorted(_read_every_chunk(a, 8)) == [(0, 10), (10, 20)]
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)
    a.tick()
    assert not first.ranges  # drained: done and absorbed
    a.g.close(1)
    # the reset: the same offsets are pending again, in a ledger with no lineage
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    again = Ledger(100, RangeSet([(0, 20)]))
    owner.g.own([(KEY, again)])
    assert again.lineage and again.lineage != first.lineage
    for _ in range(3):
        owner.tick()
    assert again.ranges.as_tuple() == ((0, 20),)  # nothing absorbed unread
    assert owner.writes == [[KEY]]  # the new lineage, in the group's token
    assert [c for c, lin in _offers(shared) if lin == again.lineage] == [(0, 10), (10, 20)]
    # the chunks are free again, in the new lineage: read, committed, done, absorbed
    assert sorted(_read_every_chunk(b, 8)) == [(0, 10), (10, 20)]
    b.g.commit(b.g.handed({}), sync=False, timeout_s=1)
    done = [(rec.chunks[0], rec.lineage) for rec, _ in shared if rec.kind == "done"]
    assert sorted(done[-2:]) == [((0, 10), again.lineage), ((10, 20), again.lineage)]
    owner.tick()
    assert not again.ranges and owner.writes == [[KEY], [KEY]]


def test_the_next_owner_of_the_same_lineage_absorbs_what_was_done_before() -> None:
    """An owner that crashed mid-catch-up: the next one restores its token (the lineage
    with it), and the chunks done meanwhile leave its ledger without being read again."""
    _, b, shared, clock = _team()
    first = Ledger(100, RangeSet([(0, 20)]))
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    owner.g.own([(KEY, first)])
    owner.tick()
    assert sorted(_read_every_chunk(b, 8)) == [(0, 10), (10, 20)]
    b.g.commit(b.g.handed({}), sync=False, timeout_s=1)
    assert sorted(_kinds(shared, "b", "done")) == [(0, 10), (10, 20)]
    # the owner died before it read the done records; the next restores its last token
    token = first.token()
    assert token is not None and token.lineage == first.lineage
    nxt = Member("n", shared, clock)
    restored = Ledger(token.position, RangeSet(token.ranges), token.lineage)
    nxt.g.own([(KEY, restored)])
    nxt.tick()
    assert not restored.ranges and nxt.writes == [[KEY]]
    assert len(_offers(shared)) == 2  # nothing offered again


def test_a_helper_drops_a_chunk_offered_again_in_another_lineage() -> None:
    _, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 10)]))
    owner.g.own([(KEY, ledger)])
    owner.tick()
    b.tick()
    b.tick()
    assert b.g._held == {("t", 0, 0, 10)} and KEY in b.child.cursors
    # another owner offers the same offsets in a new lineage (the group reads them again)
    shared.append((ClaimRecord("offer", "n", "t", 0, ((0, 10),), "fresh"), clock[0]))
    b.tick()
    # the old lineage's chunk is gone: b stops reading it (and may claim the new one)
    assert KEY in b.child.stopped and b.g.chunks_lost == 1
    claims = [(rec.chunks[0], rec.lineage) for rec, _ in shared if rec.kind == "claim"]
    assert claims == [((0, 10), ledger.lineage), ((0, 10), "fresh")]
    b.tick()
    assert b.g._held == {("t", 0, 0, 10)} and b.g._held_lineage[("t", 0, 0, 10)] == "fresh"
    b.child.hand_all(KEY)
    b.g.commit(b.g.handed({}), sync=False, timeout_s=1)
    assert [rec.lineage for rec, _ in shared if rec.kind == "done"] == ["fresh"]
    owner.tick()
    assert ledger.ranges.as_tuple() == ((0, 10),)  # not its lineage: nothing absorbed


def test_a_rewound_ledger_offers_in_a_new_lineage() -> None:
    """A rewind (the primary's position went back: a topic recreated) makes processed
    offsets unprocessed again: the owner draws a new lineage before it offers them."""
    a, _, shared, _ = _team()
    a.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 10)]))
    a.g.own([(KEY, ledger)])
    a.tick()
    old = ledger.lineage
    ledger.rewind(0)
    ledger.split_at(30)  # (a plan would do this) [0, 30) is backlog again
    a.tick()  # draws a new lineage, for the next write to carry
    a.tick()
    assert ledger.lineage and ledger.lineage != old
    assert a.writes == [[KEY], [KEY]]
    assert [c for c, lin in _offers(shared) if lin == ledger.lineage] == [
        (0, 10),
        (10, 20),
        (20, 30),
    ]


def test_the_group_token_carries_a_new_lineage_before_any_chunk_is_offered() -> None:
    """So that the next owner (a rebalance moved the partition before any commit) inherits
    it, and with it the chunks offered and done meanwhile: without it, 3 members read
    44,000-52,000 records of a 30,000 backlog (each owner offered it all afresh)."""
    a, _, shared, _ = _team()
    a.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 20)]))
    written: list[Any] = []
    a.g.write_group = written.append
    a.g.own([(KEY, ledger)])
    a.tick()
    a.tick()
    assert written == [[KEY]] and _offers(shared) == []  # not confirmed: nothing offered
    a.now += 10  # no answer within _ANNOUNCE_RETRY_S (lost in a rebalance): written again
    a.tick()
    assert written == [[KEY], [KEY]] and _offers(shared) == []
    a.g.group_committed([KEY])  # the broker took it (on_commit)
    a.tick()
    assert len(_offers(shared)) == 2
    token = ledger.token()
    assert token is not None and token.lineage == ledger.lineage
    # a ledger restored with its lineage is not announced again
    b = Member("b", shared, [1_000])
    b.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    b.g.own([(KEY, Ledger(100, RangeSet([(0, 20)]), ledger.lineage))])
    b.tick()
    assert b.writes == [] and len(_offers(shared)) == 2
    # never confirmed (no commit callback): offered all the same, after a bound
    c = Member("c", shared, [1_000])
    c.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    c.g.write_group = written.append
    c.g.own([(("t", 1), Ledger(100, RangeSet([(0, 20)])))])
    for _ in range(20):
        c.tick()
    assert [ck for ck, _ in _offers(shared)][2:] == [(0, 10), (10, 20)]


def test_a_helper_never_holds_two_chunks_of_the_same_offsets() -> None:
    """Chunks of two lineages may overlap ([0, 10) and [5, 15)): a member holding both
    would let its commits of one finish the other, unread."""
    _, b, shared, clock = _team()
    owner = Member("o", shared, clock)
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    owner.g.own([(KEY, Ledger(100, RangeSet([(0, 10)])))])
    owner.tick()
    b.tick()
    b.tick()
    assert b.g._held == {("t", 0, 0, 10)}
    shared.append((ClaimRecord("offer", "n", "t", 0, ((5, 15),), "other"), clock[0]))
    for _ in range(3):
        b.tick()
    assert (5, 15) not in _kinds(shared, "b", "claim") and b.g._held == {("t", 0, 0, 10)}
    # won all the same (a claim that overlapped nothing when sent): given back at once
    shared.append((ClaimRecord("claim", "b", "t", 0, ((5, 15),), "other"), clock[0]))
    b.tick()
    assert b.g._held == {("t", 0, 0, 10)}
    assert ((5, 15),) in [rec.chunks for rec, _ in shared if rec.kind == "release"]


def test_a_pattern_that_matches_the_claims_topic_is_never_used_with_it() -> None:
    # adversary of issue 48: a member subscribed with ^pta.* (its default claims topic is
    # pta.catchup.claims) was handed 45 claims records as data, and committed them
    g = GroupCatchup(SETTINGS, {}, Child(), member="a")  # type: ignore[arg-type]
    g.subscribed(["^g\\..*"])  # SETTINGS.claims_topic is g.catchup.claims
    assert g.unusable is not None and "subscribes to" in g.unusable
    h = GroupCatchup(SETTINGS, {}, Child(), member="b")  # type: ignore[arg-type]
    h.subscribed(["^orders-.*", "t"])
    assert h.unusable is None


def test_pausing_a_partition_a_helper_reads_gives_its_chunks_back() -> None:
    # adversary of issue 48: a helper that paused the partition kept 4,501 records of
    # chunks, and the group's offset waited 37.5 s, for as long as the helper lived
    a, b, shared = _helper_with_chunks()
    held = set(a.g._held)
    a.g.paused([KEY])
    assert a.g._held == set() and KEY not in a.child.cursors
    released = {rec.chunks[0] for rec, _ in shared if rec.member == "a" and rec.kind == "release"}
    assert released >= {ck[2:] for ck in held}
    assert _read_every_chunk(b, 8)  # another member reads them


def test_pausing_the_whole_assignment_holds_a_helper_off_until_a_resume() -> None:
    # adversary of issue 45: pause(assignment()) (back-pressure) on a member that helps
    # with a partition it does not own: 4,999-8,828 records of its chunks in 5 s of pause,
    # where a plain consumer so paused hands out nothing
    a, b, shared = _helper_with_chunks()
    held = set(a.g._held)
    a.g.assignment_paused = lambda: True  # its (empty) assignment, paused
    a.g.hold_off(True)
    assert a.g._held == set() and KEY not in a.child.cursors
    released = {rec.chunks[0] for rec, _ in shared if rec.member == "a" and rec.kind == "release"}
    assert released >= {ck[2:] for ck in held}
    claims = len(_kinds(shared, "a", "claim"))
    for _ in range(4):
        a.tick()
    assert a.g._held == set() and len(_kinds(shared, "a", "claim")) == claims  # none claimed
    assert _read_every_chunk(b, 8)  # another member reads them
    # resume(): it claims again (nothing is left here, b read it all: a claims no chunk)
    a.g.hold_off(False)
    assert not a.g._held_off
    # an assignment with a partition not paused lifts it too
    c, _, _ = _helper_with_chunks()
    c.g.assignment_paused = lambda: False
    c.g._held_off = True
    c.tick()
    assert not c.g._held_off


@pytest.mark.parametrize("pause", ["the partition", "the whole assignment"])
def test_pausing_keeps_the_chunks_of_a_partition_the_member_owns(pause: str) -> None:
    # a plain consumer's paused partition waits for its resume(): so does the owner's own
    # backlog, read as chunks; only the chunks of partitions it helps with go back
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    for _ in range(4):
        a.tick()
    held = set(a.g._held)
    assert held and {ck[:2] for ck in held} == {KEY}
    if pause == "the partition":
        a.g.paused([KEY])
    else:
        a.g.hold_off(True)
    assert a.g._held == held
    assert _kinds(shared, "a", "release") == []


def test_a_chunk_sought_back_to_and_won_again_is_claimed_only_as_it_is_read_again() -> None:
    # issue 45: on Apache Kafka a helper sought back to a chunk record and won the chunk
    # again itself; its next bare commit claimed the records its child had handed out
    # before the seek (the old run still covered them): the record sought back to was
    # declared done unread, and never delivered again
    a, _b, shared = _helper_with_chunks()
    s, _e = a.child.hand_all(KEY)
    a.g.commit({KEY: _claims(a, s + 4)}, sync=False, timeout_s=1)  # good up to s + 4
    assert a.g.seek_back(KEY, s + 5)
    for _ in range(4):
        a.tick()  # a alone: it wins the chunk again, and reads it from s + 5
    assert (KEY[0], KEY[1], s, s + 10) in a.g._held
    h = a.g._helped[KEY]
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)  # nothing handed out since the seek
    assert (s, s + 10) not in _kinds(shared, "a", "done")
    assert set(range(s + 5, s + 10)) <= {o for st, en in h.ledger.ranges for o in range(st, en)}
    # a late commit of a record handed out before the seek claims that record alone
    a.g.commit({KEY: _claims(a, s + 7)}, sync=False, timeout_s=1)
    assert s + 6 in h.ledger.ranges and s + 7 not in h.ledger.ranges
    # read again, then committed: done
    handed: set[int] = set()
    for _ in range(6):  # the child reads it (after the chunk it reads, if another)
        if KEY in a.child.cursors:
            first, end = a.child.hand_all(KEY)
            handed |= set(range(first, end))
        a.tick()
    assert s + 5 in handed
    a.g.commit(a.g.handed({}), sync=False, timeout_s=1)
    assert (s, s + 10) in _kinds(shared, "a", "done")


# -- how a member schedules its claims (issue 45: never slower than per-member catch-up) -----
def test_a_member_claims_as_many_chunks_as_it_reads_ahead_in_one_tick(monkeypatch: Any) -> None:
    # one claim in flight at a time: a member with 200 ms of work per poll won one
    # 500-record chunk per poll, and its chains ran dry (each chunk then started afresh)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    a, _, shared, _ = _team()
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 100)])))])
    a.tick()  # offers, and claims what it reads ahead at once
    assert _kinds(shared, "a", "claim") == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
    a.tick()  # read back: won, and read as one chain
    assert a.child.hand_all(KEY) == (0, 50)


def test_a_member_alone_reads_a_partition_from_its_first_chunk(monkeypatch: Any) -> None:
    # a random first chunk (among the first 8) made one member's chain wrap around: the
    # chunks below it were read last, each started afresh, and a small partition's first
    # chunk came at the very end of a 60,000-record drain
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup.random, "choice", lambda seq: seq[-1])
    a, _, _, _ = _team()
    keys = [KEY, (KEY[0], 1)]
    a.g.own([(k, Ledger(100, RangeSet([(0, 80)]))) for k in keys])
    starts: dict[Any, list[int]] = {k: [] for k in keys}
    for _ in range(30):
        a.tick()
        for k in keys:
            if k in a.child.cursors:
                starts[k].append(a.child.hand_all(k)[0])
    # each partition read from offset 0, in one chain or in order: never a chunk below one
    # read before it
    assert all(st and st[0] == 0 and st == sorted(st) for st in starts.values()), starts


def test_a_small_partition_is_claimed_whole_before_the_big_ones(monkeypatch: Any) -> None:
    # one member, backlogs of 40,000 / 20,000 / 500 / 1,500 records in chunks of 500: the
    # 1,500-record partition was done last (27.3 s of a 27.5 s drain), its chunks claimed
    # one by one between the big partitions' and its records queued behind theirs
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    a, _, shared, _ = _team()
    small = (KEY[0], 3)
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 100)]))), (small, Ledger(100, RangeSet([(0, 30)])))])
    a.tick()
    claims = [(rec.partition, rec.chunks[0]) for rec, _ in shared if rec.kind == "claim"]
    assert claims[:3] == [(3, (0, 10)), (3, (10, 20)), (3, (20, 30))], claims
    assert len(claims) == 5  # and the big one's first chunks, up to the records ahead
    a.tick()
    assert a.child.hand_all(small) == (0, 30)  # one chain: one fetch, not three


def test_a_small_partition_s_records_go_before_the_big_ones_it_is_read_beside(
    monkeypatch: Any,
) -> None:
    # 2 members, 40,000 / 20,000 / 500 / 1,500 records in chunks of 500: the member that
    # won the 1,500-record partition's chunks at 0.9 s started them beside its big chains,
    # and the child handed them out from 13.0 s, behind the 20,000-record partition's
    # block librdkafka had fetched first (per-member catch-up: done at 2.0 s)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    a, _, _, _ = _team()
    small = (KEY[0], 3)
    a.g.own([(KEY, Ledger(200, RangeSet([(0, 200)]))), (small, Ledger(30, RangeSet([(0, 30)])))])
    a.tick()
    a.tick()  # won: both read, side by side
    assert set(a.child.cursors) == {KEY, small}
    assert a.child.favoured == {small}  # its records first: the big one waits meanwhile
    assert a.child.hand_all(small) == (0, 30)
    a.tick()
    assert a.child.favoured == set()  # nothing small read any more: the big one flows


def test_an_owner_claims_its_own_small_partition_from_its_first_chunk(monkeypatch: Any) -> None:
    # 2 members, backlogs of 40,000 / 20,000 / 500 / 1,500: the owner of the 1,500-record
    # partition took a random one of its own offered chunks first; the others went to the
    # member reading the big partitions, behind whose records they waited (done at 10.9 s
    # against 1.2 s with per-member catch-up)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup.random, "choice", lambda seq: seq[-1])
    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    a, _, shared, _ = _team()
    shared.append((ClaimRecord("hb", "b"), 1_000))  # another member is live
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    a.tick()
    assert a.g._state.live("b")  # so a is not alone: no first-chunk rule for a member alone
    assert _kinds(shared, "a", "claim") == [(0, 10), (10, 20), (20, 30)]


def test_an_owner_claims_nothing_else_until_its_own_chunks_are_offered(monkeypatch: Any) -> None:
    # 3 members, 40,000 / 20,000 / 500 / 1,500: while the group's commit carrying its new
    # lineage was on its way, the owner of the 1,500-record partition filled what it reads
    # ahead with others' chunks; its own went to members busy with big chains (done at
    # 3.9 s against 1.0 s with per-member catch-up)
    from fastrebalance import _groupcatchup

    monkeypatch.setattr(_groupcatchup, "PREFETCH_RECORDS", 50)
    o, a, shared, _ = _team()
    big = (KEY[0], 1)
    o.g._maybe_claim = lambda now: None  # type: ignore[method-assign]  # o only offers
    o.g.own([(big, Ledger(100, RangeSet([(0, 100)])))])
    o.tick()
    a.g.write_group = lambda keys: None  # type: ignore[method-assign]  # not confirmed yet
    a.g.own([(KEY, Ledger(100, RangeSet([(0, 30)])))])
    a.tick()
    a.tick()
    assert _kinds(shared, "b", "claim") == []  # none of o's chunks meanwhile
    a.g.group_committed([KEY])
    a.tick()
    claims = [(rec.partition, rec.chunks[0]) for rec, _ in shared if rec.member == "b"
              and rec.kind == "claim"]  # fmt: skip
    assert claims[:3] == [(0, (0, 10)), (0, (10, 20)), (0, (20, 30))], claims


def test_a_backlog_waiting_for_its_lineage_s_commit_keeps_the_poll_path_waits_short() -> None:
    """``pending`` (the poll path waits on the primary in short slices) while the group's
    commit carrying a new lineage is unconfirmed: its on_commit comes inside such a
    wait, and the offers follow it only at the next tick."""
    owner = Member("o", [], [1_000])
    owner.g.write_group = owner.writes.append  # the broker has not answered yet
    owner.g._maybe_claim = lambda now: None  # type: ignore[method-assign]
    ledger = Ledger(100, RangeSet([(0, 20)]))
    assert not owner.g.pending
    owner.g.own([(KEY, ledger)])
    owner.tick()
    assert owner.writes == [[KEY]] and owner.g.chunks_offered == 0
    assert owner.g.pending
    owner.g.group_committed([KEY])  # librdkafka's on_commit
    owner.tick()
    assert owner.g.chunks_offered == 2
    assert not owner.g.pending  # offered; nothing claimed, nothing won here
