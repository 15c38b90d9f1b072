"""The Spark source's offset planning, without Spark: codec, budgets, and a whole-life model.

The model runs a query through random produce / batch / restart / crash-and-replan /
topic-recreated steps and checks what the issue promises: every record is delivered (of a
recreated topic, every record of its new log), none twice within a batch plan (nor at all
without a crash), the first batch after a restart carries no backlog, backlog chunks and
budgets are respected, and re-planning a logged batch gives the same slices.
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance.spark._options import parse_options
from fastrebalance.spark._plan import (
    Marks,
    PartitionPosition,
    Slice,
    allocate,
    balance,
    decode_offset,
    detect_restart,
    encode_offset,
    next_catchup_budget,
    offset_json,
    pack_tasks,
    pending_count,
    plan_end,
    plan_slices,
)

T = "orders"


def pos(next_offset: int, *pending: tuple[int, int]) -> PartitionPosition:
    return PartitionPosition(next_offset, tuple(pending))


# -- the JSON form ---------------------------------------------------------------------------
def test_encoding_looks_like_spark_kafka_offsets_until_there_is_backlog() -> None:
    offset = {(T, 1): pos(120, (70, 100), (110, 120)), (T, 0): pos(42), ("a", 10): pos(1)}
    assert offset_json(offset) == (
        '{"a": {"10": 1}, "orders": {"0": 42, "1": [120, [70, 100], [110, 120]]}}'
    )
    assert decode_offset(json.loads(offset_json(offset))) == offset


def test_partition_keys_sort_numerically_so_the_string_is_stable() -> None:
    offset = {(T, p): pos(p) for p in (10, 2, 1)}
    assert list(encode_offset(offset)[T]) == ["1", "2", "10"]


def _position(extra: int, cuts: list[int]) -> PartitionPosition:
    ranges = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]
    return PartitionPosition.of(max(cuts, default=0) + extra, ranges)


positions = st.builds(
    _position, st.integers(0, 1000), st.lists(st.integers(0, 10_000), max_size=8).map(sorted)
)
offsets = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b.c", "t-1"]), st.integers(0, 20)), positions, max_size=6
)


@given(offsets)
def test_codec_round_trips_to_the_identical_string(offset: dict) -> None:
    text = offset_json(offset)
    again = decode_offset(json.loads(text))
    assert again == offset
    assert offset_json(again) == text


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {T: 5},
        {T: {"x": 1}},
        {T: {"0": -1}},
        {T: {"0": True}},
        {T: {"0": "5"}},
        {T: {"0": [10, [5, 3]]}},
        {T: {"0": [10, [0, 5], [3, 8]]}},
        {T: {"0": [10, [0, 20]]}},
        {T: {"0": [10, [0]]}},
        {T: {"0": []}},
    ],
)
def test_decode_rejects_malformed_offsets(bad: object) -> None:
    with pytest.raises(ValueError):
        decode_offset(bad)  # type: ignore[arg-type]


# -- budgets ---------------------------------------------------------------------------------
@given(
    st.dictionaries(st.tuples(st.just(T), st.integers(0, 9)), st.integers(-5, 1000)),
    st.one_of(st.none(), st.integers(0, 3000)),
)
def test_allocate_is_exact_and_never_over_a_partitions_lag(lags: dict, limit: int | None) -> None:
    got = allocate(lags, limit)
    total = sum(max(v, 0) for v in lags.values())
    assert set(got) == set(lags)
    assert sum(got.values()) == (total if limit is None else min(limit, total))
    assert all(0 <= got[tp] <= max(lags[tp], 0) for tp in lags)


def test_backlog_is_drained_in_chunks_round_robin_under_the_budget() -> None:
    start = {(T, 0): pos(1000, (0, 1000)), (T, 1): pos(1000, (0, 300))}
    marks = {(T, 0): Marks(0, 1000), (T, 1): Marks(0, 1000)}
    plan = plan_end(start, marks, catchup_budget=700, chunk_size=200)
    assert plan.end == {(T, 0): pos(1000, (400, 1000)), (T, 1): pos(1000)}
    slices = plan_slices(start, plan.end, chunk_size=200)
    assert slices == [
        Slice(T, 0, 0, 200, True),
        Slice(T, 0, 200, 400, True),
        Slice(T, 1, 0, 150, True),  # 300 records in two chunks of at most 200: alike
        Slice(T, 1, 150, 300, True),
    ]


def test_a_backlog_just_over_a_chunk_multiple_leaves_no_crumb_task() -> None:
    # A restart backlog ends where the live records began, so it is rarely a round number:
    # 100,030 records in chunks of 25,000 must be 5 tasks of ~20,006, not 4 full ones and a
    # fifth task of 30 records that costs as much as a full one.
    start = {(T, 0): pos(100_030, (0, 100_030))}
    end = {(T, 0): pos(100_030)}
    sizes = [s.size for s in plan_slices(start, end, chunk_size=25_000)]
    assert sizes == [20_006] * 5
    slices = plan_slices(start, end, chunk_size=25_000)
    assert slices[0].start == 0 and slices[-1].end == 100_030
    assert all(a.end == b.start for a, b in itertools.pairwise(slices))
    assert [s.size for s in plan_slices(start, end, chunk_size=200_000)] == [100_030]


def test_live_spans_are_packed_in_order_and_share_equal_tasks_with_backlog() -> None:
    live = [Slice(T, p, 0, n, False) for p, n in enumerate([5, 7, 990, 3, 1500])]
    assert pack_tasks(live, 1000) == [
        (live[0], live[1]),
        (live[2], live[3]),
        (live[4],),  # a live span larger than a task's budget: alone, never split here
    ]
    chunks = [Slice(T, 0, 0, 600, True), Slice(T, 1, 0, 400, True), Slice(T, 2, 0, 1500, True)]
    # with backlog: 2,505 live and 2,500 backlog records in 6 tasks of 834 or 835 (5 would
    # leave one alone on 2 cores), live spans first, each piece keeping what it is
    assert pack_tasks(chunks[:1] + live + chunks[1:], 1000) == [
        (live[0], live[1], Slice(T, 2, 0, 823, False)),
        (Slice(T, 2, 823, 990, False), live[3], Slice(T, 4, 0, 664, False)),
        (Slice(T, 4, 664, 1498, False),),
        (Slice(T, 4, 1498, 1500, False), chunks[0], Slice(T, 1, 0, 232, True)),
        (Slice(T, 1, 232, 400, True), Slice(T, 2, 0, 666, True)),
        (Slice(T, 2, 666, 1500, True),),
    ]
    assert pack_tasks([], 10) == []


def test_a_backlog_batch_gives_its_live_records_no_task_of_their_own() -> None:
    # Issue 33: stage metrics of a 2,000,000-record drain over 8 partitions: a backlog batch
    # of six 116,250-record backlog tasks and one task of 26,630 live records: 7 tasks on 2
    # cores, and one core idled the last 1.3 s of the 15.4 s batch.
    live = [Slice(T, p, 250_000, 253_329, False) for p in range(8)]
    backlog = [Slice(T, p, 0, 87_188, True) for p in range(8)]
    tasks = pack_tasks(live + backlog, 150_000)
    # 724,136 records: 6 tasks (5 would do, but one would be alone on a core at the end)
    assert [sum(s.size for s in t) for t in tasks] == [120_690] * 2 + [120_689] * 4
    assert tasks[0][:8] == tuple(live) and tasks[0][8].catchup  # live first, topped up
    assert _offsets(tasks) == _offsets([live + backlog])


def test_a_backlog_over_many_partitions_takes_no_more_tasks_than_reading_it_in_order() -> None:
    # Issue 33: 2,000,000 records over 64 partitions, tasks of up to 150,000. Read in order,
    # the 64 spans of 31,250 share 16 tasks; read as backlog, each chunk was a task of its
    # own (64), and the drain took 3.4 times as long.
    end = {(T, p): pos(31_250) for p in range(64)}
    in_order = plan_slices({(T, p): pos(0) for p in range(64)}, end, 150_000)
    backlog = plan_slices({(T, p): pos(31_250, (0, 31_250)) for p in range(64)}, end, 150_000)
    assert all(s.catchup for s in backlog) and len(backlog) == 64
    tasks = pack_tasks(backlog, 150_000)
    assert len(tasks) == 14 <= len(pack_tasks(in_order, 150_000)) == 16
    assert {sum(s.size for s in t) for t in tasks} == {142_857, 142_858}
    assert _offsets(tasks) == _offsets([backlog])


def test_a_backlog_batch_over_8_partitions_keeps_both_cores_busy_to_its_end() -> None:
    # Issue 33: the first backlog batch of a 2,000,000-record restart over 8 partitions
    # drains 500,000 records, one chunk of 150,000 per partition per round: packed whole,
    # 150k, 150k, 150k and 50k, so one of 2 cores read 300,000 and the batch (4 of them in
    # the drain) took a third longer than its records needed.
    start = {(T, p): pos(250_000, (0, 250_000)) for p in range(8)}
    marks = {(T, p): Marks(0, 250_000) for p in range(8)}
    end = plan_end(start, marks, catchup_budget=500_000, chunk_size=150_000).end
    slices = plan_slices(start, end, 150_000)
    assert sorted(s.size for s in slices) == [50_000, 150_000, 150_000, 150_000]
    tasks = pack_tasks(slices, 150_000)
    assert [sum(s.size for s in t) for t in tasks] == [125_000] * 4
    assert _offsets(tasks) == _offsets([slices])


def _offsets(tasks: list[tuple[Slice, ...]] | list[list[Slice]]) -> list[tuple[str, int, int]]:
    return sorted(
        (s.topic, s.partition, o) for t in tasks for s in t for o in range(s.start, s.end)
    )


@given(
    st.lists(st.integers(1, 400), min_size=1, max_size=12),
    st.integers(1, 500),
)
def test_batch_tasks_are_even_in_number_equal_in_size_and_cover_each_offset_once(
    sizes: list[int], max_records: int
) -> None:
    backlog = [Slice(T, p, 1000, 1000 + n, p % 3 > 0) for p, n in enumerate(sizes)]
    tasks = balance(backlog, max_records)
    loads = [sum(s.size for s in t) for t in tasks]
    total = sum(sizes)
    assert max(loads) <= max_records and max(loads) - min(loads) <= 1
    assert len(tasks) == -(-total // max_records) or len(tasks) % 2 == 0
    assert len(tasks) <= -(-total // max_records) + 1
    assert len(tasks) % 2 == 0 or total <= max_records // 2 or len(tasks) == total
    assert _offsets(tasks) == _offsets([backlog])
    # in order: each task reads on from where the one before stopped
    flat = [s for t in tasks for s in t]
    assert all(s.size > 0 for s in flat)
    assert all(s.catchup == (s.partition % 3 > 0) for s in flat)  # each piece what it was
    assert [(s.partition, s.start) for s in flat] == sorted((s.partition, s.start) for s in flat)


def test_a_budget_below_one_chunk_per_partition_still_reaches_every_partition() -> None:
    offset = {(T, p): pos(1000, (0, 1000)) for p in range(4)}
    marks = {(T, p): Marks(0, 1000) for p in range(4)}
    for _ in range(4):  # 4 batches of 2 chunks: every partition got 2 of its 5
        offset = plan_end(offset, marks, catchup_budget=400, chunk_size=200).end
    assert [pending_count({tp: offset[tp]}) for tp in sorted(offset)] == [600] * 4


def test_adaptive_budget_scales_with_the_last_batchs_duration() -> None:
    # 500 records in 5 s, aiming at 10 s: twice as many next time
    assert next_catchup_budget(500, 500, 5.0, 10.0, floor=100) == 1000
    # a slow batch shrinks the next one, but never below one chunk
    assert next_catchup_budget(500, 500, 20.0, 10.0, floor=100) == 250
    assert next_catchup_budget(500, 500, 600.0, 10.0, floor=100) == 100
    # growth is capped per batch: one oddly short measurement cannot blow up the next batch
    assert next_catchup_budget(500, 500, 0.1, 10.0, floor=100) == 2000
    # the tail of a backlog, or no measurable time, says nothing about the rate
    assert next_catchup_budget(500, 30, 1.0, 10.0, floor=100) == 500
    assert next_catchup_budget(500, 500, 0.0, 10.0, floor=100) == 500


def test_restart_skips_the_backlog_and_the_first_batch_is_live_only() -> None:
    start = {(T, 0): pos(70), (T, 1): pos(500)}
    marks = {(T, 0): Marks(0, 5000), (T, 1): Marks(0, 520)}
    ends = detect_restart(start, marks, threshold=100)
    assert ends == {(T, 0): 5000, (T, 1): 520}  # the lag of both counts, both are skipped
    first = plan_end(start, marks, restart_ends=ends)
    assert first.restarted == {(T, 0): (70, 5000), (T, 1): (500, 520)}
    assert first.end == {(T, 0): pos(5000, (70, 5000)), (T, 1): pos(520, (500, 520))}
    assert not [s for s in plan_slices(start, first.end, 1000) if s.catchup]

    marks = {(T, 0): Marks(0, 5100), (T, 1): Marks(0, 530)}
    second = plan_end(first.end, marks, restart_ends=ends, catchup_budget=2000, chunk_size=1000)
    slices = plan_slices(first.end, second.end, 1000)
    assert slices[:2] == [Slice(T, 0, 5000, 5100, False), Slice(T, 1, 520, 530, False)]
    assert sorted((s.partition, s.start, s.end) for s in slices if s.catchup) == [
        (0, 70, 1060), (0, 1060, 2050), (1, 500, 520)  # 1,980 of 0 in two alike chunks
    ]
    assert pending_count(second.end) == 4950 - 2000


def test_the_threshold_is_the_lag_of_the_whole_query() -> None:
    """256 partitions lagging 7,812 each: no partition passes 10,000, the query's 2,000,000
    records do, and the first fresh record would wait behind all of them."""
    start = {(T, p): pos(0) for p in range(256)}
    marks = {(T, p): Marks(0, 7812) for p in range(256)}
    assert detect_restart(start, marks, threshold=10_000) == {tp: 7812 for tp in start}
    # at or below the threshold in total: read in order, as Spark's Kafka source does
    small = {(T, p): Marks(0, 39) for p in range(256)}  # 9,984 in all
    assert detect_restart(start, small, threshold=10_000) == {}
    # a partition with no lag (or retention past its position, counted from the log start)
    marks[(T, 7)] = Marks(0, 0)
    marks[(T, 8)] = Marks(9000, 9500)
    ends = detect_restart(start, marks, threshold=10_000)
    assert (T, 7) not in ends and ends[(T, 8)] == 9500


def test_replanning_from_the_same_logged_start_skips_to_the_same_point() -> None:
    start = {(T, 0): pos(0)}
    ends = detect_restart(start, {(T, 0): Marks(0, 1000)}, threshold=10)
    later = {(T, 0): Marks(0, 1500)}  # Spark asked again, after more records arrived
    assert plan_end(start, later, restart_ends=ends).end == {(T, 0): pos(1500, (0, 1000))}


def test_fresh_limit_caps_live_records_not_backlog() -> None:
    start = {(T, 0): pos(100, (0, 100)), (T, 1): pos(100)}
    marks = {(T, 0): Marks(0, 400), (T, 1): Marks(0, 200)}
    plan = plan_end(start, marks, fresh_limit=120, catchup_budget=50, chunk_size=50)
    # lags 300 and 100 share the 120 in proportion; the backlog has its own budget of 50
    assert plan.end == {(T, 0): pos(190, (50, 100)), (T, 1): pos(130)}


def test_available_now_target_caps_the_live_span_but_drains_all_backlog() -> None:
    start = {(T, 0): pos(100, (0, 100))}
    marks = {(T, 0): Marks(0, 900)}
    plan = plan_end(start, marks, target={(T, 0): 300}, catchup_budget=100, chunk_size=100)
    assert plan.end == {(T, 0): pos(300)}
    assert plan_end(plan.end, marks, target={(T, 0): 300}).end == plan.end


def test_new_partition_is_added_at_its_first_offset_and_read_from_the_next_batch() -> None:
    start = {(T, 0): pos(10)}
    marks = {(T, 0): Marks(0, 10), (T, 1): Marks(5, 50)}
    end = plan_end(start, marks).end
    assert end[(T, 1)] == pos(5)
    assert plan_slices(start, end, 100) == []
    assert plan_slices(end, plan_end(end, marks).end, 100) == [Slice(T, 1, 5, 50, False)]


def test_retention_and_truncation_are_reported_as_losses() -> None:
    start = {(T, 0): pos(500, (100, 300)), (T, 1): pos(800)}
    marks = {(T, 0): Marks(200, 600), (T, 1): Marks(0, 50)}
    plan = plan_end(start, marks)
    assert len(plan.losses) == 2
    assert "[100, 200)" in plan.losses[0] and "log end 50" in plan.losses[1]
    assert plan.end[(T, 0)] == pos(600)  # [200, 300) drained in this batch
    # the log that ends below the next offset (a recreated topic): what it holds is backlog
    assert plan.end[(T, 1)] == pos(50, (0, 50))


def test_a_recreated_topic_s_new_log_is_read_in_full_not_skipped() -> None:
    """failOnDataLoss=false and a topic recreated while the query was down: the new log's
    records are read (as backlog, from the next batch on), never skipped; the live stream
    goes on from the new log end. Reading them in the same batch would lose them: a batch's
    slices are derived from its start and end, and the start never had them."""
    start = {(T, 0): pos(250)}
    marks = {(T, 0): Marks(0, 50)}
    plan = plan_end(start, marks, catchup_budget=1_000)
    assert plan.end[(T, 0)] == pos(50, (0, 50))
    assert "[0, 50)" in plan.losses[0]
    assert plan_slices(start, plan.end, 100) == []
    marks = {(T, 0): Marks(0, 70)}
    nxt = plan_end(plan.end, marks, catchup_budget=1_000)
    assert nxt.end[(T, 0)] == pos(70) and not nxt.losses
    assert plan_slices(plan.end, nxt.end, 100) == [
        Slice(T, 0, 50, 70, False),
        Slice(T, 0, 0, 50, True),
    ]


def test_nothing_new_gives_back_an_equal_offset() -> None:
    start = {(T, 0): pos(10), (T, 1): pos(7)}
    marks = {(T, 0): Marks(0, 10), (T, 1): Marks(0, 7)}
    assert offset_json(plan_end(start, marks).end) == offset_json(start)


# -- the whole life of a query, as a model ------------------------------------------------------
steps = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, 2), st.integers(1, 400)),
        # a batch, with a read limit or none; True: a restart batch with no live record to
        # hold back carries backlog (drain_on_restart)
        st.tuples(
            st.just("batch"), st.one_of(st.none(), st.integers(1, 300)), st.booleans()
        ),
        st.tuples(st.just("restart"), st.integers(0, 200)),
        st.tuples(st.just("crash_mid_batch"), st.just(0)),
        st.tuples(st.just("budget"), st.integers(1, 400)),  # the adaptive budget moved
        # the topic deleted and recreated with fewer records than the query has read, then
        # a batch planned over it (failOnDataLoss=false)
        st.tuples(st.just("recreate"), st.integers(0, 2), st.integers(0, 400)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    steps,
    st.integers(1, 150),
    st.integers(1, 400),
    st.booleans(),
)
def test_model_every_record_once_and_backlog_never_in_the_restart_batch(
    script: list, chunk: int, budget: int, catchup: bool
) -> None:
    parts = [(T, 0), (T, 1), (T, 2)]
    high = dict.fromkeys(parts, 0)
    generation = dict.fromkeys(parts, 0)  # a recreated topic's records are new records
    offset = {tp: pos(0) for tp in parts}  # committed: the last logged end
    delivered: dict[tuple[str, int], list[tuple[int, int]]] = {tp: [] for tp in parts}
    restart_ends: dict = {}

    def run_batch(fresh_limit: int | None, *, deliver: bool, drain: bool = False) -> None:
        nonlocal offset
        assert budget >= 1
        marks = {tp: Marks(0, high[tp]) for tp in parts}
        plan = plan_end(
            offset,
            marks,
            restart_ends=restart_ends,
            fresh_limit=fresh_limit,
            catchup_budget=budget,
            chunk_size=chunk,
            drain_on_restart=drain,
        )
        assert (
            plan_end(
                offset,
                marks,
                restart_ends=restart_ends,
                fresh_limit=fresh_limit,
                catchup_budget=budget,
                chunk_size=chunk,
                drain_on_restart=drain,
            ).end
            == plan.end
        )
        slices = plan_slices(offset, plan.end, chunk)
        assert slices == plan_slices(offset, plan.end, chunk)  # pure: Spark may re-plan
        # A pending range that is gone (the log recreated shorter under it) leaves pending, so
        # it looks drained: its slice lies beyond the log, which only a plan that reported a
        # loss may produce; the executor reports it and, failOnDataLoss=false, skips it.
        gone = [s for s in slices if s.end > high[(s.topic, s.partition)]]
        assert not gone or plan.losses, f"{gone} beyond the log, no loss reported"
        slices = [s for s in slices if s not in gone]
        seen: set[tuple[tuple[str, int], int]] = set()
        for s in slices:
            assert 0 <= s.start < s.end <= high[(s.topic, s.partition)]
            for o in range(s.start, s.end):
                assert ((s.topic, s.partition), o) not in seen, "read twice in one batch"
                seen.add(((s.topic, s.partition), o))
        backlog = [s for s in slices if s.catchup]
        assert all(s.size <= chunk for s in backlog)
        assert sum(s.size for s in backlog) <= budget
        if plan.restarted and not drain:
            assert not backlog, "the first batch after a restart carries backlog"
        if fresh_limit is not None:
            # a restart batch that drains reads the first part of the skipped backlog in order
            # (it holds no live record to put first): that part counts under the budget
            extra = budget if plan.restarted and drain else 0
            assert sum(s.size for s in slices if not s.catchup) <= fresh_limit + extra
        if deliver:
            for s in slices:
                tp = (s.topic, s.partition)
                delivered[tp].extend((generation[tp], o) for o in range(s.start, s.end))
            offset = decode_offset(json.loads(offset_json(plan.end)))

    for step in script:
        if step[0] == "produce":
            high[parts[step[1]]] += step[2]
        elif step[0] == "batch":
            run_batch(step[1], deliver=True, drain=step[2])
        elif step[0] == "restart":
            marks = {tp: Marks(0, high[tp]) for tp in parts}
            restart_ends = detect_restart(offset, marks, step[1]) if catchup else {}
        elif step[0] == "budget":
            budget = step[1]
        elif step[0] == "recreate":
            tp = parts[step[1]]
            if offset[tp].next == 0:
                continue
            generation[tp] += 1
            high[tp] = step[2] % offset[tp].next
            run_batch(None, deliver=True)
        else:  # planned, logged, crashed before delivery: Spark re-plans the same batch later
            run_batch(None, deliver=False)

    for _ in range(2000):
        before = offset
        run_batch(None, deliver=True)
        if offset == before:
            break
    for tp in parts:
        now = [o for g, o in delivered[tp] if g == generation[tp]]
        assert sorted(now) == list(range(high[tp])), "lost or duplicated records"
        # an older generation's records that were not yet read when it went are gone; none
        # of the others came twice
        assert len(set(delivered[tp])) == len(delivered[tp]), "a record read twice"
    assert pending_count(offset) == 0


# -- options -----------------------------------------------------------------------------------
def test_options_follow_spark_names_case_insensitively() -> None:
    opts = parse_options(
        {
            "kafka.bootstrap.servers": "h:9092",
            "subscribe": "a, b",
            "maxoffsetspertrigger": "500",
            "catchup.chunksize": "7",
            "kafka.fetch.wait.max.ms": "10",
            "startingOffsets": '{"a": {"0": -2}, "b": {"0": 5}}',
        }
    )
    assert opts.subscription.topics == ("a", "b")
    assert opts.max_offsets_per_trigger == 500
    assert opts.chunk_size == 7
    assert opts.starting.specific == {("a", 0): -2, ("b", 0): 5}
    conf = opts.consumer_config("executor")
    assert conf["fetch.wait.max.ms"] == "10" and conf["enable.auto.commit"] is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.auto.offset.reset": "latest"}, "startingOffsets"),
        ({"catchup.threshold": "-1"}, "catchup.threshold"),
        ({"maxOffsetsPerTrigger": "lots"}, "maxOffsetsPerTrigger"),
        ({"catchup.enabled": "yes"}, "catchup.enabled"),
        ({"startingOffsets": "soon"}, "startingOffsets"),
        ({"startingOffsets": '{"zzz": {"0": 1}}'}, "zzz"),
        ({"subscribePattern": "o.*"}, "subscribe"),
    ],
)
def test_bad_options_name_the_option(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options({"kafka.bootstrap.servers": "h:1", "subscribe": "orders", **extra})


def test_required_options() -> None:
    with pytest.raises(ValueError, match=r"kafka\.bootstrap\.servers"):
        parse_options({"subscribe": "x"})
    with pytest.raises(ValueError, match="subscribe"):
        parse_options({"kafka.bootstrap.servers": "h:1"})


# -- the reader's per-run logic, with a fake Kafka (needs pyspark only to import) --------------
class FakeFetcher:
    """Log ends as the test sets them; ``live`` records arrive per fresh fetch after ``after``."""

    def __init__(self, highs: dict[int, int]) -> None:
        self.highs = highs
        self.lows: dict[int, int] = {}  # first offsets still stored (DeleteRecords), default 0
        self.live, self.after, self.fetches = 0, 1, 0

    def marks(self, refresh: bool = False, lows: bool = False) -> dict:
        if refresh:
            self.fetches += 1
            if self.fetches > self.after:
                for p in self.highs:
                    self.highs[p] += self.live
        return {(T, p): Marks(self.lows.get(p, 0), h) for p, h in self.highs.items()}

    def topics(self) -> dict:
        return {T: sorted(self.highs)}

    def partitions(self) -> list:
        return [(T, p) for p in sorted(self.highs)]

    def offsets_for_times(self, stamps: dict) -> dict:
        return {tp: ts if ts < self.highs[tp[1]] else -1 for tp, ts in stamps.items()}

    def close(self) -> None:
        pass


def make_reader(highs: dict[int, int], **extra: str):
    pytest.importorskip("pyspark", minversion="4.2")
    from fastrebalance.spark._stream import FastRebalanceStreamReader

    options = {"kafka.bootstrap.servers": "h:1", "subscribe": T, "catchup.threshold": "100"}
    reader = FastRebalanceStreamReader(parse_options({**options, **extra}))
    fetcher = FakeFetcher(highs)
    reader._fetcher = fetcher  # type: ignore[assignment]
    return reader, fetcher


def all_rows():
    """The limit Spark passes to every trigger but Once when maxOffsetsPerTrigger is unset."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from fastrebalance.spark._stream import NO_LIMIT

    return ReadMaxRows(NO_LIMIT)


def once():
    """The limit Spark passes under Trigger.Once, whatever the source's default."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


def test_reader_restart_waits_in_place_for_a_live_record_then_plans_live_only() -> None:
    """Issue 19, item 5: the restart batch used to answer "no new data" until a live record
    came, and under a processingTime trigger Spark asks again only an interval later (the
    first fresh record reached the sink 20.7 s after a restart with a 20-second trigger)."""
    reader, kafka = make_reader({0: 1000})
    kafka.live, kafka.after = 10, 3  # the first live records land during the third poll
    start = {T: {"0": 0}}  # restored from a checkpoint: this reader never served it
    end = reader.latestOffset(start, all_rows())
    assert end == {T: {"0": [1010, [0, 1000]]}}
    task, warm = reader.partitions(start, end)
    assert task.slices == (Slice(T, 0, 1000, 1010, False),)
    assert warm.slices == ()  # starts a worker for the backlog task of the next batch
    # the next batch drains backlog, in chunks, under the budget
    kafka.live = 0
    nxt = reader.latestOffset(end, all_rows())
    chunks = [s for t in reader.partitions(end, nxt) for s in t.slices if s.catchup]
    assert [(s.start, s.end) for s in chunks] == [(0, 1000)]


def test_reader_restart_after_deleted_backlog_still_waits_for_a_live_record() -> None:
    """Records deleted below the backlog (DeleteRecords, retention) while the query was down,
    failOnDataLoss=false: the restart batch still waits for live records and holds them
    first. The deleted span [start, log start) used to count as live records, so the restart
    batch was planned at once and read nothing (2 of 2 restarts in an adversary's run), and
    the first fresh records waited for the backlog batch."""
    reader, kafka = make_reader({0: 1000}, failOnDataLoss="false")
    kafka.lows[0] = 300
    kafka.live, kafka.after = 10, 3
    start = {T: {"0": 0}}
    end = reader.latestOffset(start, all_rows())
    assert end == {T: {"0": [1010, [300, 1000]]}}
    fresh = [s for t in reader.partitions(start, end) for s in t.slices if s.start >= 1000]
    assert fresh == [Slice(T, 0, 1000, 1010, False)]
    kafka.live = 0
    nxt = reader.latestOffset(end, all_rows())
    chunks = [s for t in reader.partitions(end, nxt) for s in t.slices if s.catchup]
    assert [(s.start, s.end) for s in chunks] == [(300, 1000)]


def test_reader_restart_without_live_records_carries_backlog_after_the_wait() -> None:
    """Nothing fresh to hold back: the restart batch starts the backlog rather than cost a
    batch (and, under a processingTime trigger, an interval) for nothing."""
    reader, _ = make_reader({0: 1000}, **{"catchup.firstBatchWaitMs": "50"})
    start = {T: {"0": 0}}
    began = time.monotonic()
    end = reader.latestOffset(start, all_rows())
    assert time.monotonic() - began >= 0.05
    assert end == {T: {"0": 1000}}
    (task,) = reader.partitions(start, end)  # all of it, in order: like catch-up off
    assert task.slices == (Slice(T, 0, 0, 1000, False),)
    # a backlog over the budget (catchup.splitBacklog=true): the rest stays pending, the
    # first part is read in chunks
    split = {"catchup.firstBatchWaitMs": "0", "catchup.splitBacklog": "true"}
    reader, _ = make_reader({0: 4_000_000}, **split)
    end = reader.latestOffset(start, all_rows())
    assert end == {T: {"0": [4_000_000, [2_000_000, 4_000_000]]}}  # the first budget, 2M
    # read from the checkpoint's offset on, in order, as a read with catch-up off would
    sizes = [s.size for t in reader.partitions(start, end) for s in t.slices]
    assert sum(sizes) == 2_000_000 and max(sizes) - min(sizes) <= 1, sizes
    # by default, all of it: a watermark set by this batch would drop what a later one reads
    reader, _ = make_reader({0: 4_000_000}, **{"catchup.firstBatchWaitMs": "0"})
    assert reader.latestOffset(start, all_rows()) == {T: {"0": 4_000_000}}


def test_reader_reads_a_restart_backlog_whole_in_the_batch_after_the_restart_batch() -> None:
    """Issue 46: the restart batch's live records move an event-time watermark past the
    backlog, and Spark drops late rows from the second batch after it on. By default the
    whole backlog comes in the one batch after the restart batch, whatever the budget."""
    reader, kafka = make_reader({0: 30_000, 1: 30_000}, **{"catchup.maxOffsetsPerTrigger": "1000"})
    kafka.live = 10
    start = {T: {"0": 100, "1": 100}}
    restart = reader.latestOffset(start, all_rows())
    assert all(not s.catchup for t in reader.partitions(start, restart) for s in t.slices)
    assert pending_count(decode_offset(restart)) == 2 * 29_900
    kafka.highs = {tp: h + 5 for tp, h in kafka.highs.items()}  # live records keep coming
    drain = reader.latestOffset(restart, all_rows())
    assert pending_count(decode_offset(drain)) == 0  # all of it, not 1,000
    backlog = [s for t in reader.partitions(restart, drain) for s in t.slices if s.catchup]
    assert sum(s.size for s in backlog) == 2 * 29_900
    # with catchup.splitBacklog=true the budget spreads it over batches, as before
    reader, kafka = make_reader(
        {0: 30_000, 1: 30_000},
        **{"catchup.maxOffsetsPerTrigger": "1000", "catchup.splitBacklog": "true"},
    )
    kafka.live = 10
    restart = reader.latestOffset(start, all_rows())
    drain = reader.latestOffset(restart, all_rows())
    assert pending_count(decode_offset(drain)) == 2 * 29_900 - 1000


def test_reader_restart_during_a_catchup_reads_the_pending_backlog_at_once() -> None:
    """The driver died after the restart batch, before the backlog batch was logged: the
    checkpoint's watermark is the live records' already, and the batch after the next one
    filters late rows with it. So the next run does not skip again: it reads the pending
    ranges, and everything since, in its first batch. splitBacklog=true skips again."""
    start = {T: {"0": [50_000, [100, 30_000]]}}
    reader, kafka = make_reader({0: 90_000})
    kafka.live = 10
    end = reader.latestOffset(start, all_rows())
    assert decode_offset(end) == {(T, 0): pos(kafka.highs[0])}
    read = sorted((s.start, s.end) for t in reader.partitions(start, end) for s in t.slices)
    assert sum(e - b for b, e in read) == 29_900 + kafka.highs[0] - 50_000
    reader, kafka = make_reader({0: 90_000}, **{"catchup.splitBacklog": "true"})
    kafka.live = 10
    end = reader.latestOffset(start, all_rows())
    assert decode_offset(end)[(T, 0)].pending == ((100, 30_000), (50_000, 90_000))


def test_reader_new_query_reads_in_order_from_its_starting_offsets() -> None:
    reader, _ = make_reader({0: 1000}, startingOffsets="earliest")
    start = reader.initialOffset()
    end = reader.latestOffset(start, all_rows())
    assert decode_offset(end) == {(T, 0): pos(1000)}
    (task,) = reader.partitions(start, end)
    assert task.slices == (Slice(T, 0, 0, 1000, False),)


def _batch_zero(reader, initial: dict, end: dict) -> list[Slice]:
    return [s for t in reader.partitions(initial, end) for s in t.slices]


@pytest.mark.parametrize("starting", ["latest", "earliest", '{"orders": {"0": 40, "1": -1}}'])
def test_initial_offset_is_one_answer_for_every_call_and_every_driver(starting: str) -> None:
    """Spark asks for the initial offset to plan batch 0, again to run it, and again on a new
    driver that replays batch 0 after a crash; the log ends move meanwhile (issue 19, items 1
    and 7: records that arrived between the calls were never read)."""
    reader, kafka = make_reader({0: 100, 1: 100}, startingOffsets=starting)
    initial = reader.initialOffset()
    end = reader.latestOffset(initial, all_rows())  # batch 0 planned and logged
    first_run = _batch_zero(reader, initial, end)
    kafka.highs.update({0: 150, 1: 160})  # records keep arriving
    again = reader.initialOffset()  # Spark runs batch 0: asks again
    assert again == initial
    assert _batch_zero(reader, again, end) == first_run
    # the driver dies before batch 0 commits; a new one replays batch 0 from the logged end
    replay, _ = make_reader({0: 190, 1: 200}, startingOffsets=starting)
    assert replay.initialOffset() == initial
    assert _batch_zero(replay, replay.initialOffset(), end) == first_run
    # and batch 1 continues where batch 0 ended: every record from the start on, once
    nxt = replay.latestOffset(end, all_rows())
    later = [s for t in replay.partitions(end, nxt) for s in t.slices]
    read = {p: [] for p in (0, 1)}
    for s in first_run + later:
        read[s.partition].extend(range(s.start, s.end))
    begin = {"latest": {0: 100, 1: 100}, "earliest": {0: 0, 1: 0}}.get(starting, {0: 40, 1: 100})
    assert read == {p: list(range(begin[p], {0: 190, 1: 200}[p])) for p in (0, 1)}


def test_a_batch_zero_logged_by_an_older_version_is_still_replayed() -> None:
    """Its end offset has no @from: the start is resolved again when it is replayed, as the
    older version did, rather than reading nothing."""
    reader, _ = make_reader({0: 150}, startingOffsets="earliest")
    initial = reader.initialOffset()
    legacy = _batch_zero(reader, initial, {T: {"0": 100}})
    assert legacy == [Slice(T, 0, 0, 100, False)]
    assert _batch_zero(reader, initial, {T: {"0": 100}, "@from": {}}) == []


def test_available_now_new_query_from_latest_reports_no_false_loss() -> None:
    """The target is fetched before the initial offset is resolved; a busy topic's log end has
    moved on by then (issue 19, item 7: "log end 359 is below the next offset 361")."""
    reader, kafka = make_reader({0: 359}, startingOffsets="latest")
    reader.prepareForTriggerAvailableNow()
    kafka.highs[0] = 361
    initial = reader.initialOffset()
    end = reader.latestOffset(initial, all_rows())
    assert decode_offset(end) == {(T, 0): pos(359)}
    assert reader.latestOffset(end, all_rows()) == end  # nothing past the target: the run ends


def test_reader_available_now_stops_at_the_target_after_draining() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    reader, kafka = make_reader({0: 500}, **{"catchup.maxOffsetsPerTrigger": "200"})
    reader.prepareForTriggerAvailableNow()
    kafka.highs[0] = 900  # arrives after the target: not part of this run
    offset: dict = {T: {"0": [500, [0, 300]]}}
    seen = []
    for _ in range(10):
        end = reader.latestOffset(offset, ReadMaxRows(50))
        if end == offset:
            break
        seen += [s for t in reader.partitions(offset, end) for s in t.slices]
        offset = end
    assert offset == {T: {"0": 500}}
    assert sum(s.size for s in seen) == 300 and max(s.end for s in seen) == 300


def test_trigger_once_after_a_restart_reads_the_backlog_too() -> None:
    """Issue 19, item 2: each Trigger.Once run is a restart; it skipped the backlog and, with
    no live record to wait for, planned no batch at all, so a periodic job never caught up."""
    reader, _ = make_reader({0: 30_000, 1: 200}, **{"catchup.maxOffsetsPerTrigger": "1000"})
    start = {T: {"0": [100, [0, 50]], "1": 100}}  # a pending range from an earlier run
    end = reader.latestOffset(start, once())
    assert end == {T: {"0": 30_000, "1": 200}}
    slices = [s for t in reader.partitions(start, end) for s in t.slices]
    read = sorted((s.partition, s.start, s.end) for s in slices)
    assert read == [(0, 0, 50), (0, 100, 30_000), (1, 100, 200)]


def test_available_now_ignores_partitions_that_appear_during_the_run() -> None:
    """Issue 19, item 3: a partition (or a subscribed topic) that appeared after the target
    was fixed was read to its live end in every batch, and the run never ended."""
    reader, kafka = make_reader({0: 500}, **{"catchup.maxOffsetsPerTrigger": "100"})
    reader.prepareForTriggerAvailableNow()
    offset: dict = {T: {"0": [500, [0, 300]]}}
    for batch in range(20):
        kafka.highs[1] = 100 * (batch + 1)  # a new partition, busy, keeps growing
        end = reader.latestOffset(offset, all_rows())
        if end == offset:
            break
        slices = [s for t in reader.partitions(offset, end) for s in t.slices]
        assert all(s.partition == 0 for s in slices), slices
        offset = end
    else:
        raise AssertionError("Trigger.AvailableNow never ended")
    assert decode_offset(offset) == {(T, 0): pos(500)}
    # the next run's target includes it: read from its first offset on
    nxt, kafka = make_reader(dict(kafka.highs))
    nxt.prepareForTriggerAvailableNow()
    end = nxt.latestOffset(offset, all_rows())
    assert decode_offset(end)[(T, 1)] == pos(0)


def test_plan_under_a_target_leaves_unnamed_partitions_alone() -> None:
    start = {(T, 0): pos(10), (T, 1): pos(5)}
    marks = {(T, 0): Marks(0, 50), (T, 1): Marks(0, 50), (T, 2): Marks(0, 50)}
    plan = plan_end(start, marks, target={(T, 0): 40})
    assert plan.end == {(T, 0): pos(40), (T, 1): pos(5)}


#: The wall clock of the fake-clock tests: 2026-11-28, 0.437 s past a whole second, so that
#: no planning call looks like a processingTime tick unless the test moves it onto one.
WALL_START = 1_795_870_000.437


def _timed_reader(
    monkeypatch, highs: dict[int, int], wall_start: float = WALL_START, **options: str
):
    """A reader on a fake clock; each planning call says how long the previous batch took."""
    from fastrebalance.spark import _stream

    clock = [1000.0]
    monkeypatch.setattr(_stream.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_stream, "_wall_clock", lambda: wall_start + clock[0] - 1000.0)
    # the numbers of the tests below aim at 10 s a batch (the default is 20 s), and start
    # from a first backlog budget of 500,000 (the default is 2,000,000)
    base = {
        "catchup.chunkSize": "100000",
        "catchup.targetBatchDurationMs": "10000",
        "catchup.splitBacklog": "true",  # budgets apply only then
    }
    monkeypatch.setattr(_stream, "FIRST_CATCHUP_BUDGET", 500_000)
    reader, kafka = make_reader(highs, **{**base, **options})
    kafka.live = 10  # a live record comes while the restart batch waits: it is live only

    def drained(start: dict, seconds: float) -> tuple[dict, int]:
        clock[0] += seconds  # since the previous planning call
        end = reader.latestOffset(start, all_rows())
        return end, pending_count(decode_offset(start)) - pending_count(decode_offset(end))

    return drained


def test_reader_sizes_backlog_batches_by_their_duration(monkeypatch) -> None:
    drained = _timed_reader(monkeypatch, {0: 2_000_000})
    offset, n = drained({T: {"0": 0}}, 0)  # the restart batch: live only
    assert n == -2_000_000
    offset, n = drained(offset, 1.0)
    assert n == 500_000  # the first backlog batch: nothing measured yet
    offset, n = drained(offset, 5.0)
    assert n == 1_000_000  # 500,000 took 5 s, the target is 10 s
    offset, n = drained(offset, 40.0)
    assert n == 250_000  # 1,000,000 took 40 s
    # a backlog just over the budget is read in one batch, not with a tail batch of crumbs
    drained = _timed_reader(monkeypatch, {0: 600_000})
    offset, _ = drained({T: {"0": 0}}, 0)
    assert drained(offset, 1.0)[1] == 600_000
    # a budget the user set is a fixed cap, however fast the batches go
    fixed = {"catchup.maxOffsetsPerTrigger": "300000"}
    drained = _timed_reader(monkeypatch, {0: 2_000_000}, **fixed)
    offset, _ = drained({T: {"0": 0}}, 0)
    for _ in range(3):
        offset, n = drained(offset, 0.5)
        assert n == 300_000


def test_reader_budget_is_not_shrunk_by_a_processing_time_interval(monkeypatch) -> None:
    """Issue 19, item 6: under processingTime="20 seconds" the time from planning a batch to
    the next planning call is the interval, however fast the batch ran; scaling by it cut the
    budget from 500,000 to 250,009, then 149,999, down to one chunk per trigger."""
    drained = _timed_reader(monkeypatch, {0: 10_000_000})
    offset, n = drained({T: {"0": 0}}, 0)  # the restart batch, at a tick
    offset, n = drained(offset, 20.0)  # the next tick: the first backlog batch
    assert n == 500_000
    for _ in range(3):  # each ran a few seconds, then Spark waited for the next tick
        offset, n = drained(offset, 20.0)
        assert n == 500_000
    offset, n = drained(offset, 50.0)  # this one overran the interval: it ran 50 s
    offset, n = drained(offset, 20.0)
    assert n == 100_000  # 500,000 in 50 s, aiming at 10 s


def test_reader_budget_never_shrinks_after_a_fast_batch_under_a_20s_trigger(monkeypatch) -> None:
    """Issue 33, item 1: trigger(processingTime="20 seconds"), restarted with a 900,000-record
    backlog: a batch drained 500,000 in 2.1 s, and the budget still fell to 250,010. The query
    restarts at any moment, so its first gap (restart to the first tick) is part of an
    interval, and a full interval then looked like a slow batch. Spark starts the batches of
    a 20 s trigger at whole multiples of 20 s since the epoch (here a few ms late)."""
    grid = 1_795_870_000.0  # a multiple of 20 s
    drained = _timed_reader(monkeypatch, {0: 10_000_000}, wall_start=grid + 7.3)
    calls = iter([7.3, 20.004, 40.002, 60.011, 80.0, 130.317, 140.005, 160.003])
    last = next(calls)

    def batch_at(t: float) -> int:
        nonlocal offset, last
        offset, n = drained(offset, t - last)
        last = t
        return n

    offset, _ = drained({T: {"0": 0}}, 0)  # the restart batch: live only
    assert batch_at(next(calls)) == 500_000  # the first tick: the first backlog batch
    for t in itertools.islice(calls, 3):  # each ran about 2 s, then Spark waited for a tick
        assert batch_at(t) == 500_000
    # one ran 50 s, past two ticks: Spark planned the next one at once, off the ticks' grid
    assert batch_at(next(calls)) == 100_000  # 500,000 in 50 s, aiming at 10 s
    # that one ran a second or so, then waited for the tick: 9.7 s is all that is known
    grown = batch_at(next(calls))
    assert 103_000 < grown < 103_500  # 100,000 in at most 9.7 s: a little more
    assert batch_at(next(calls)) == grown  # a whole interval again: not a slow batch


def test_reader_default_read_limit_and_pickling() -> None:
    import pickle

    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    reader, _ = make_reader({0: 1}, maxOffsetsPerTrigger="70")
    assert reader.getDefaultReadLimit() == ReadMaxRows(70)
    # never ReadAllAvailable: that is how Trigger.Once is told apart
    assert make_reader({0: 1})[0].getDefaultReadLimit() == all_rows() != ReadAllAvailable()
    clone = pickle.loads(pickle.dumps(reader))  # what Spark ships to executors
    assert clone.options == reader.options and clone._restart_ends is None


def test_every_option_is_documented_with_its_default() -> None:
    import re
    from pathlib import Path

    from fastrebalance.spark._options import OPTIONS

    text = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    rows = {
        m.group(1): m.group(2).strip().strip("`")
        for m in re.finditer(r"^\| `([^`]+)` \|([^|]*)\|", text, re.MULTILINE)
    }
    for key, (default, _meaning) in OPTIONS.items():
        assert key in rows, f"option {key} missing from docs/spark.md"
        assert rows[key] == default, f"{key}: documented {rows[key]!r}, code {default!r}"


def test_every_row_of_the_trigger_table_names_tests_that_exist() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).parents[2]
    text = (root / "docs" / "spark.md").read_text()
    table = text[text.index("### Triggers") : text.index("### Crashes and replays")]
    rows = [line for line in table.splitlines() if line.startswith(("| `", "| default"))]
    assert len(rows) >= 9
    defined = {
        m.group(1)
        for f in (root / "tests").rglob("test_spark_*.py")
        for m in re.finditer(r"^def (test_\w+)", f.read_text(), re.MULTILINE)
    }
    for row in rows:
        named = re.findall(r"`(test_\w+)`", row)
        assert named, f"no test for: {row[:60]}"
        assert set(named) <= defined, set(named) - defined


def test_arrow_batches_match_the_declared_spark_schema() -> None:
    pytest.importorskip("pyspark", minversion="4.2")
    from pyspark.sql.pandas.types import to_arrow_schema

    from fastrebalance.spark._kafka import ARROW_SCHEMA
    from fastrebalance.spark._source import SCHEMA

    # Spark rejects a batch whose schema differs, in the executor, at the first record
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
