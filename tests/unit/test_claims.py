"""The claims state machine (group-wide catch-up): any interleaving of members' records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._claims import (
    ClaimRecord,
    ClaimsState,
    Scope,
    cut_chunks,
    decode_record,
    encode_record,
)
from fastrebalance._ranges import RangeSet

TIMEOUT = 100
MEMBERS = ("a", "b", "c")
CHUNKS = ((0, 10), (10, 20), (20, 25), (40, 50))
T = "t"
#: backlog lineages: mostly one, sometimes a second (a reset read the offsets again)
LINEAGES = ("L1", "L1", "L1", "L2")

Op = tuple[str, str, int, int, str]


def _rec(kind: str, member: str, chunk: int, lineage: str = "L1") -> ClaimRecord:
    if kind in ("hb", "bye"):
        return ClaimRecord(kind, member)
    if kind == "offer":
        chunks = (CHUNKS[chunk], CHUNKS[(chunk + 1) % 4])
        return ClaimRecord(kind, member, T, 0, chunks, lineage)
    return ClaimRecord(kind, member, T, 0, (CHUNKS[chunk],), lineage)


_ops = st.lists(
    st.tuples(
        st.sampled_from(("offer", "claim", "claim", "claim", "hb", "done", "release", "bye")),
        st.sampled_from(MEMBERS),
        st.integers(0, 3),
        st.integers(0, TIMEOUT * 3 // 2),  # log time step
        st.sampled_from(LINEAGES),
    ),
    max_size=60,
)


def _log(ops: list[Op]) -> list[tuple[ClaimRecord, int]]:
    out, now = [], 1000
    for kind, member, chunk, dt, lineage in ops:
        now += dt
        out.append((_rec(kind, member, chunk, lineage), now))
    return out


def _replay(log: list[tuple[ClaimRecord, int]]) -> ClaimsState:
    s = ClaimsState(TIMEOUT)
    for rec, ts in log:
        s.apply(rec, ts)
    return s


@settings(max_examples=400, deadline=None)
@given(_ops)
def test_the_claim_rules_hold_in_any_interleaving(ops: list[Op]) -> None:
    log = _log(ops)
    state = ClaimsState(TIMEOUT)
    last_record: dict[str, int] = {}  # member -> log time of its last record (the test's own)
    winner: dict[tuple[str, int, int, int], str | None] = {}  # the test's view of holders
    done_before: dict[str, tuple[tuple[int, int], ...]] = {}  # per lineage
    # per lineage, the chunks a done record of that lineage was accepted for
    accepted: dict[str, set[tuple[int, int]]] = {}
    for rec, ts in log:
        now = max(state.now_ms, ts)
        key = (T, 0, *rec.chunks[0]) if rec.chunks else None
        # a claim, done or release is about the chunk of its own lineage only: one of
        # another lineage (an older reading of the same offsets) is no chunk to it
        existed = key is not None and key in state and state.lineage(key) == rec.lineage
        was_done = key is not None and existed and state.is_done(key)
        if rec.kind == "offer":
            for c in rec.chunks:
                k = (T, 0, *c)
                if k in state and state.lineage(k) != rec.lineage:
                    winner[k] = None  # offered again in another lineage: afresh
        holder_before = state.last_holder(key) if key is not None else None
        holder_live_before = (
            holder_before is not None
            and holder_before in last_record
            and now - last_record[holder_before] <= TIMEOUT
        )
        state.apply(rec, ts)
        assert state.now_ms == now
        if rec.kind == "bye":
            last_record.pop(rec.member, None)
            for k, w in list(winner.items()):
                if w == rec.member:
                    winner[k] = None
        else:
            last_record[rec.member] = now
        if rec.kind == "claim" and existed and not was_done:
            # the first claim in log order of a chunk with no live holder wins; a held
            # chunk stays its live holder's
            may = holder_before in (None, rec.member) or not holder_live_before
            assert (state.last_holder(key) == rec.member) == may  # type: ignore[arg-type]
            if may:
                winner[key] = rec.member  # type: ignore[index]
        if rec.kind == "claim" and (not existed or was_done):
            assert state.last_holder(key) is None if key not in state else True  # type: ignore[arg-type]
            if key in state and not existed:  # another lineage's chunk: untouched
                assert state.last_holder(key) == winner.get(key)  # type: ignore[arg-type]
        if rec.kind == "done" and existed and not was_done:
            # a chunk is done only by its (last winning) holder
            assert state.is_done(key) == (winner.get(key) == rec.member)  # type: ignore[arg-type]
            if state.is_done(key):  # type: ignore[arg-type]
                assert state.done_by(key) == rec.member  # type: ignore[arg-type]
                winner[key] = None  # type: ignore[index]
                accepted.setdefault(rec.lineage, set()).add(rec.chunks[0])
        if rec.kind == "release" and existed and not was_done and winner.get(key) == rec.member:
            winner[key] = None  # type: ignore[index]
        for k in state:
            if state.is_done(k):
                # done stays done, never held again
                assert state.last_holder(k) is None and state.holder(k) is None
                continue
            h = state.last_holder(k)
            assert h == winner.get(k)
            # at most one live holder, and it is live by the log's own clock
            live = h is not None and h in last_record and now - last_record[h] <= TIMEOUT
            assert (state.holder(k) == h) if live else (state.holder(k) is None)
            # expiry frees: a chunk with no live holder is claimable, by anyone
            assert (k in state.free()) == (not live)
        for lineage in set(LINEAGES):
            # done offsets only grow, in each lineage
            done = state.done(T, 0, lineage).as_tuple()
            prev = done_before.get(lineage, ())
            for s, e in prev:
                assert all(any(a <= o < b for a, b in done) for o in range(s, e))
            done_before[lineage] = done
            # and a lineage's done offsets are those of its own accepted done records:
            # never another lineage's (an earlier reading of the same offsets)
            mine = RangeSet(accepted.get(lineage, ()))
            assert done == mine.as_tuple(), (lineage, done, mine)
        assert not state.done(T, 0, "")
    # replaying the same log gives the same state
    assert _replay(log).snapshot() == state.snapshot()


@settings(max_examples=200, deadline=None)
@given(_ops, st.lists(st.integers(0, 60), min_size=3, max_size=3))
def test_readers_at_any_pace_agree(ops: list[Op], cuts: list[int]) -> None:
    """Three members read the log at their own pace: whatever prefix each has read, it
    holds the state of that prefix, so two that read equally far agree on every holder."""
    log = _log(ops)
    readers = [ClaimsState(TIMEOUT) for _ in cuts]
    for reader, cut in zip(readers, cuts, strict=True):
        for rec, ts in log[: min(cut, len(log))]:
            reader.apply(rec, ts)
    for reader, cut in zip(readers, cuts, strict=True):
        assert reader.snapshot() == _replay(log[: min(cut, len(log))]).snapshot()
        for rec, ts in log[min(cut, len(log)) :]:
            reader.apply(rec, ts)
    snaps = {r.snapshot() for r in readers}
    assert len(snaps) == 1


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_no_two_members_hold_a_chunk_at_once(ops: list[Op]) -> None:
    """Members act on the log: each claims a free chunk it sees, processes what it holds,
    sends done only for chunks it holds. However their records interleave, a chunk done
    was processed whole by the member that was its live or last holder, and at no log time
    do two members hold one chunk live."""
    log = _log(ops)
    state = ClaimsState(TIMEOUT)
    processed: dict[tuple[str, int, int, int], set[str]] = {}
    for rec, ts in log:
        if rec.kind == "done":
            key = (T, 0, *rec.chunks[0])
            # a member sends done only for a chunk it believes it holds, in its lineage
            if state.last_holder(key) != rec.member or state.lineage(key) != rec.lineage:
                continue
            processed.setdefault(key, set()).add(rec.member)
        state.apply(rec, ts)
        for k in state:
            holders = [m for m in MEMBERS if state.holder(k) == m]
            assert len(holders) <= 1
            if state.is_done(k):
                assert state.done_by(k) in processed.get(k, set())


def test_expiry_is_by_log_time_and_a_later_claim_takes_the_chunk() -> None:
    s = ClaimsState(1000)
    s.apply(ClaimRecord("offer", "owner", T, 0, ((0, 10),)), 0)
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 10),)), 10)
    s.apply(ClaimRecord("claim", "b", T, 0, ((0, 10),)), 20)
    assert s.holder((T, 0, 0, 10)) == "a"
    s.apply(ClaimRecord("hb", "b"), 1010)  # a's last record at 10: live until 1010
    assert s.holder((T, 0, 0, 10)) == "a"
    s.apply(ClaimRecord("hb", "b"), 1011)
    assert s.holder((T, 0, 0, 10)) is None and s.free() == [(T, 0, 0, 10)]
    s.apply(ClaimRecord("claim", "b", T, 0, ((0, 10),)), 1012)
    assert s.holder((T, 0, 0, 10)) == "b"
    s.apply(ClaimRecord("done", "a", T, 0, ((0, 10),)), 1013)  # a lost it: ignored
    assert not s.is_done((T, 0, 0, 10))
    s.apply(ClaimRecord("done", "b", T, 0, ((0, 10),)), 1014)
    assert s.done_by((T, 0, 0, 10)) == "b" and s.done(T, 0, "").as_tuple() == ()
    # a timestamp going back (another producer's clock) does not move log time back
    s.apply(ClaimRecord("hb", "c"), 5)
    assert s.now_ms == 1014


def test_an_expired_holder_nobody_replaced_may_still_finish() -> None:
    s = ClaimsState(100)
    s.apply(ClaimRecord("offer", "o", T, 1, ((5, 9),)), 0)
    s.apply(ClaimRecord("claim", "a", T, 1, ((5, 9),)), 0)
    s.apply(ClaimRecord("hb", "o"), 500)
    assert s.holder((T, 1, 5, 9)) is None and s.last_holder((T, 1, 5, 9)) == "a"
    s.apply(ClaimRecord("done", "a", T, 1, ((5, 9),)), 501)
    assert s.is_done((T, 1, 5, 9))


def test_bye_and_release_free_chunks_at_once() -> None:
    s = ClaimsState(10_000)
    s.apply(ClaimRecord("offer", "o", T, 0, ((0, 5), (5, 10))), 0)
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 5),)), 1)
    s.apply(ClaimRecord("claim", "a", T, 0, ((5, 10),)), 2)
    s.apply(ClaimRecord("release", "a", T, 0, ((0, 5),)), 3)
    assert s.free() == [(T, 0, 0, 5)] and s.held_by("a") == [(T, 0, 5, 10)]
    s.apply(ClaimRecord("bye", "a"), 4)
    assert s.free() == [(T, 0, 0, 5), (T, 0, 5, 10)] and s.members() == ["o"]


def test_an_offer_never_replaces_a_known_chunk_of_its_lineage() -> None:
    s = ClaimsState(100)
    s.apply(ClaimRecord("offer", "o1", T, 0, ((0, 5),), "L"), 0)
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 5),), "L"), 1)
    s.apply(ClaimRecord("offer", "o2", T, 0, ((0, 5), (5, 8)), "L"), 2)
    assert s.holder((T, 0, 0, 5)) == "a"
    assert s.known(T, 0, "L").as_tuple() == ((0, 8),)


def test_an_offer_in_another_lineage_starts_a_done_chunk_afresh() -> None:
    """Issue 48: after a reset to the earliest offset, the grid cut the group's second
    reading of [0, 6000) into the chunks done in the first; their old done records were
    absorbed, and 6,000 records never delivered."""
    s = ClaimsState(10_000)
    ck = (T, 0, 0, 5)
    s.apply(ClaimRecord("offer", "o", T, 0, ((0, 5), (5, 10)), "L"), 0)
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 5),), "L"), 1)
    s.apply(ClaimRecord("claim", "b", T, 0, ((5, 10),), "L"), 1)
    s.apply(ClaimRecord("done", "a", T, 0, ((0, 5),), "L"), 2)
    assert s.done(T, 0, "L").as_tuple() == ((0, 5),)
    s.apply(ClaimRecord("offer", "o", T, 0, ((0, 5), (5, 10)), "M"), 3)
    assert not s.is_done(ck) and s.lineage(ck) == "M" and s.free() == [ck, (T, 0, 5, 10)]
    assert s.done(T, 0, "M").as_tuple() == () and s.known(T, 0, "M").as_tuple() == ((0, 10),)
    assert s.done(T, 0, "L").as_tuple() == ((0, 5),)  # a fact of L, still
    # b held [5, 10) in L: that chunk is gone, its done changes nothing
    s.apply(ClaimRecord("done", "b", T, 0, ((5, 10),), "L"), 4)
    assert not s.is_done((T, 0, 5, 10)) and s.last_holder((T, 0, 5, 10)) is None
    # records of L name no chunk of M; those of M do
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 5),), "L"), 5)
    assert s.last_holder(ck) is None
    s.apply(ClaimRecord("claim", "a", T, 0, ((0, 5),), "M"), 6)
    s.apply(ClaimRecord("done", "a", T, 0, ((0, 5),), "M"), 7)
    assert s.done(T, 0, "M").as_tuple() == ((0, 5),)
    assert s.done_lineages(T, 0) == {"L": s.done(T, 0, "L"), "M": s.done(T, 0, "M")}


def test_records_round_trip_and_garbage_is_skipped() -> None:
    scope = Scope("g1", "cluster-a")
    for rec in (
        ClaimRecord("offer", "m1", "topic", 3, ((0, 10), (10, 20)), "0a1b"),
        ClaimRecord("claim", "m1", "topic", 3, ((0, 10),), "0a1b"),
        ClaimRecord("hb", "m2"),
        ClaimRecord("bye", "m2"),
    ):
        assert decode_record(encode_record(rec, scope), scope) == rec
    for junk in (
        None,
        b"",
        b"{",
        b"[]",
        b'{"v":2,"g":"g1","x":"cluster-a","k":"nope","m":"x"}',
        b'{"v":2,"g":"g1","x":"cluster-a","k":"claim","m":"x","t":"t","p":0,"c":[]}',
        b'{"v":2,"g":"g1","x":"cluster-a","k":"claim","m":"x","t":"t","p":0,"c":[[5,5]]}',
        b'{"v":2,"g":"g1","x":"cluster-a","k":"claim","m":"x","t":"t","p":0,"c":[[true,5]]}',
        b'{"v":2,"g":"g1","x":"cluster-a","k":"hb","m":""}',
        b'{"v":2,"g":"g1","x":"cluster-a","k":"claim","m":"x","t":"t","p":0,"c":[[0,5]],"l":7}',
    ):
        assert decode_record(junk, scope) is None
    s = ClaimsState(10)
    s.apply(None, 7)  # a record nobody understands still moves the log's time
    assert s.now_ms == 7 and s.records == 1


def test_a_record_of_another_group_cluster_or_format_is_skipped() -> None:
    """Issue 48: two groups sharing a claims topic took each other's ``done`` records, and
    each group's offset passed the chunks only the other had read."""
    done = ClaimRecord("done", "m1", "topic", 0, ((0, 5000),))
    ours = Scope("G1", "cluster-a")
    for other in (Scope("G2", "cluster-a"), Scope("G1", "cluster-b"), Scope("G1")):
        assert decode_record(encode_record(done, other), ours) is None
    # a record of the format before 0.1.0 (no group): another version's, skipped
    v1 = b'{"v":1,"k":"done","m":"m1","t":"topic","p":0,"c":[[0,5000]]}'
    assert decode_record(v1, ours) is None
    assert decode_record(encode_record(done, ours), ours) == done


def test_chunks_are_cut_on_a_grid() -> None:
    assert cut_chunks([(5, 25), (30, 31)], 10) == [(5, 10), (10, 20), (20, 25), (30, 31)]
    assert cut_chunks([(0, 10)], 10) == [(0, 10)]


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_a_done_of_one_lineage_is_never_anothers(ops: list[Op]) -> None:
    """Only L1's records say done here (L2 offers the same chunks, claims and releases
    them): whatever the interleaving, no offset is done in L2."""
    log = [
        (rec, ts)
        for rec, ts in _log(ops)
        if not (rec.kind == "done" and rec.lineage != "L1")
    ]
    state = _replay(log)
    assert not state.done(T, 0, "L2")
    for k in state:
        if state.is_done(k):
            assert state.lineage(k) == "L1"


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_left_counts_the_chunks_not_done_of_each_partition_asked(ops: list[Op]) -> None:
    """``left`` (what ``Child.favour`` is decided on) agrees with ``holdings`` for any
    log, and names every partition asked, 0 for one with no chunk."""
    state = _replay(_log(ops))
    other = (T, 1)
    got = state.left([(T, 0), other])
    assert got == {(T, 0): len(state.holdings()), other: 0}
