"""The Spark crash harness's checker on hand-made sink histories: each kind of problem it must
report, and the crash duplicates it must count without failing; and the event-time mode's
count per window, which must fail on a window short of records (no Spark, no Kafka)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance.testing._sparkchaos import Attempt, Life, check_attempts, read_sink
from fastrebalance.testing._sparkevtime import (
    bucket,
    check_windows,
    merge_live,
    short_summary,
    window_of,
)


def att(batch: int, life: int, call: int, *offsets: int) -> Attempt:
    return Attempt(batch, life, call, frozenset(offsets), 0)


def lives(*killed: int, count: int = 4) -> dict[int, Life]:
    return {
        n: Life(n, "x", 0.0, rc=-9 if n in killed else 0, killed="k" if n in killed else "")
        for n in range(1, count + 1)
    }


def test_a_replay_after_a_kill_that_holds_the_same_records_is_only_counted() -> None:
    found = check_attempts([att(0, 1, 1, 1, 2), att(0, 2, 1, 1, 2), att(1, 2, 2, 3)], lives(1))
    assert found["crash_duplicates"] == ["batch 0: 2 records again in life 2"]
    assert not any(v for k, v in found.items() if k != "crash_duplicates")


def test_a_replay_with_other_records_is_a_mismatch() -> None:
    found = check_attempts([att(0, 1, 1, 1, 2), att(0, 2, 1, 1, 2, 3)], lives(1))
    assert len(found["replay_mismatch"]) == 1
    assert "only in the replay 1" in found["replay_mismatch"][0]


def test_a_replay_after_a_life_that_was_not_killed_fails() -> None:
    found = check_attempts([att(0, 1, 1, 1), att(0, 2, 1, 1)], lives())
    assert found["replay_without_crash"]
    found = check_attempts([att(0, 1, 1, 1), att(0, 3, 1, 1)], lives(1))
    assert not found["replay_without_crash"]  # life 2 died before replaying: still life 1's


def test_a_record_in_two_batch_ids_and_a_batch_written_twice_by_one_life_fail() -> None:
    found = check_attempts([att(0, 1, 1, 5), att(1, 1, 2, 5)], lives())
    assert found["in_two_batches"] == ["record (0, 5) in batches 0 and 1"]
    found = check_attempts([att(0, 1, 1, 5), att(0, 1, 2, 5)], lives(1))
    assert found["written_twice"]


def test_read_sink_ignores_unfinished_writes_and_rejects_a_short_file(tmp_path: Path) -> None:
    head = {"batch": 3, "life": 2, "call": 1, "rows": 2}
    (tmp_path / "b00000003-l0002-c0001.txt").write_text(json.dumps(head) + "\nt 0 7 0\nt 1 9 1\n")
    (tmp_path / ".b00000004-l0002-c0002.txt").write_text("torn")  # killed before the rename
    (a,) = read_sink(tmp_path, "t")
    assert (a.batch, a.life, a.call, a.backlog) == (3, 2, 1, 1)
    assert a.keys == {7, (1 << 40) | 9}
    (tmp_path / "b00000005-l0002-c0003.txt").write_text(json.dumps(head) + "\nt 0 8 0\n")
    with pytest.raises(ValueError, match="1 rows"):
        read_sink(tmp_path, "t")


def test_a_latest_query_starts_where_batch_0_began(tmp_path: Path) -> None:
    """The source answers initialOffset() with {"@initial": ...} and keeps the start it
    resolved in batch 0's end offset, under "@from": that is where a latest query starts
    (a partition batch 0 did not read starts at batch 0's end)."""
    from fastrebalance.testing._sparkchaos import _query_start

    answers = [{"life": 1, "offsets0": False, "offset": {"@initial": "latest"}},
               {"life": 1, "offsets0": True, "offset": {"@initial": "latest"}}]  # fmt: skip
    (tmp_path / "initial.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    assert _query_start(tmp_path, "t") is None  # no batch 0 yet
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    end = {"t": {"0": 120, "1": [80, [40, 60]]}, "@from": {"t": {"0": 100}}}
    (tmp_path / "checkpoint" / "offsets" / "0").write_text(f"v1\n{{}}\n{json.dumps(end)}\n")
    assert _query_start(tmp_path, "t") == {0: 100, 1: 40}


# ------------------------------------------------------------------ event time (issue 33)
W = 2_000  # window width, ms


def win(
    batch: int, life: int, call: int, *windows: tuple[int, int], rows: dict[int, int] | None = None
) -> Attempt:
    """An event-time attempt: the windows the count emitted, and backlog rows key -> ms."""
    rows = rows or {}
    return Attempt(batch, life, call, frozenset(rows), len(rows), tuple(windows), rows)


@given(st.integers(0, 2**45), st.sampled_from([1, 7, 1_000, 2_000, 60_000]))
def test_window_of_is_sparks_tumbling_window(ts: int, width: int) -> None:
    start = window_of(ts, width)
    assert start % width == 0 and start <= ts < start + width


def test_complete_windows_pass_and_open_ones_are_not_checked() -> None:
    expected = {0: 5, 2_000: 4, 4_000: 3, 6_000: 2}
    live = {0: 3, 2_000: 4, 4_000: 1}  # 4000 emitted: closed, although the watermark is not past it
    backlog = {0: 2, 4_000: 2, 6_000: 1}
    r = check_windows(expected, live, backlog, W, watermark_ms=5_000)
    assert r.ok and (r.checked, r.open) == (3, 1)
    assert (r.records, r.live, r.backlog) == (12, 8, 4)


def test_a_short_window_fails_with_its_shortfall() -> None:
    expected = {0: 5, 2_000: 4, 4_000: 3}
    r = check_windows(expected, {0: 5, 2_000: 1}, {2_000: 1}, W, watermark_ms=7_000)
    assert not r.ok
    assert r.short == [(2_000, 4, 2), (4_000, 3, 0)]  # 4000 closed by the watermark, never emitted
    assert short_summary(r).startswith("2 short by 5 records: 2000 (2 of 4)")


def test_a_window_counted_over_the_topic_fails() -> None:
    r = check_windows({0: 5}, {0: 5, 2_000: 1}, {0: 1}, W, watermark_ms=9_000)
    assert not r.ok and r.over == [(0, 5, 6), (2_000, 0, 1)] and not r.short


def test_a_window_emitted_by_two_batches_or_replayed_differently_is_reported() -> None:
    ok = merge_live([win(0, 1, 1, (0, 3)), win(0, 2, 1, (0, 3)), win(1, 2, 2, (2_000, 4))])
    assert ok.counts == {0: 3, 2_000: 4} and not ok.replay_mismatch and not ok.emitted_twice
    twice = merge_live([win(0, 1, 1, (0, 3)), win(1, 1, 2, (0, 2))])
    assert twice.counts == {0: 5} and len(twice.emitted_twice) == 1
    other = merge_live([win(0, 1, 1, (0, 3)), win(0, 2, 1, (0, 4))])
    assert other.counts == {0: 3}
    assert other.replay_mismatch == [
        "batch 0: life 2 emitted other windows than life 1: 0: 3 then 4"
    ]


@settings(deadline=None, max_examples=60)
@given(
    stamps=st.lists(st.integers(0, 40_000), min_size=1, max_size=200),
    split=st.randoms(use_true_random=False),
    lose=st.booleans(),
)
def test_the_check_holds_exactly_when_every_record_is_counted(stamps, split, lose) -> None:
    """Records split at random between the live count and backlog rows, over batches with
    replays of identical attempts: complete iff no record was dropped."""
    expected = bucket(stamps, W)
    final = max(stamps) + W + 1  # every window closed
    keys = dict(enumerate(stamps))
    backlog = {k: ts for k, ts in keys.items() if split.random() < 0.5}
    live = bucket((ts for k, ts in keys.items() if k not in backlog), W)
    dropped = None
    if lose:
        dropped = split.choice(sorted(keys))
        if dropped in backlog:
            del backlog[dropped]
        else:
            live[window_of(keys[dropped], W)] -= 1
    windows = sorted((s, n) for s, n in live.items() if n)
    attempts = [
        win(b, 1, b + 1, *windows[b::3], rows={k: v for k, v in backlog.items() if k % 3 == b})
        for b in range(3)
    ]
    attempts.insert(
        1, win(0, 2, 1, *attempts[0].windows, rows=dict(attempts[0].stamps))
    )  # a replay
    attempts.sort(key=lambda a: (a.batch, a.life, a.call))
    merged = merge_live(attempts)
    assert not merged.replay_mismatch and not merged.emitted_twice
    rows = {k: v for a in attempts for k, v in a.stamps.items()}
    r = check_windows(expected, merged.counts, bucket(rows.values(), W), W, final)
    assert r.checked == len(expected)
    if dropped is None:
        assert r.ok and r.records == len(stamps)
    else:
        assert r.short == [(window_of(keys[dropped], W), expected[window_of(keys[dropped], W)],
                            expected[window_of(keys[dropped], W)] - 1)]  # fmt: skip


def test_read_sink_reads_windows_and_timestamped_rows(tmp_path: Path) -> None:
    head = {"batch": 2, "life": 1, "call": 3, "rows": 3}
    (tmp_path / "b00000002-l0001-c0003.txt").write_text(
        json.dumps(head) + "\nW 1700000000000 412\nt 0 7 1 1699999990123\nt 1 9 1 1699999991000\n"
    )
    (a,) = read_sink(tmp_path, "t")
    assert a.windows == ((1700000000000, 412),) and a.backlog == 2
    assert a.stamps == {7: 1699999990123, (1 << 40) | 9: 1699999991000}


def test_batch_watermarks_come_from_the_offset_log(tmp_path: Path) -> None:
    from fastrebalance.testing._sparkchaos import _batch_watermarks

    (tmp_path / "offsets").mkdir()
    for n, wm in ((0, 0), (1, 1700000000500)):
        meta = {"batchWatermarkMs": wm, "batchTimestampMs": 1, "conf": {}}
        (tmp_path / "offsets" / str(n)).write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")
    (tmp_path / "offsets" / ".1.crc").write_text("x")
    assert _batch_watermarks(tmp_path) == {0: 0, 1: 1700000000500}


def test_a_shortfall_of_records_the_query_never_read_is_told_apart() -> None:
    """A drain that stopped with backlog pending leaves windows short without a drop: still
    a failure, but the report says how much of it was never read."""
    r = check_windows({0: 10, 2_000: 10}, {0: 6, 2_000: 9}, {}, W, 9_000, unread={0: 3})
    assert not r.ok and r.short == [(0, 10, 6), (2_000, 10, 9)] and r.unread == 3
    assert "3 of them never read" in short_summary(r)


def test_unread_records_are_those_pending_or_ahead_of_the_offset() -> None:
    from fastrebalance.testing._sparkchaos import _pending, _unread

    offset = {"t": {"0": [100, [10, 20], [30, 35]], "1": 50}, "@from": {"t": {"0": 0}}}
    unread = _unread(offset, "t")
    assert [o for o in range(0, 40) if unread(o)] == [*range(10, 20), *range(30, 35)]
    assert unread(100) and not unread(99)
    assert not unread((1 << 40) | 49) and unread((1 << 40) | 50)
    assert unread((2 << 40) | 0)  # a partition the offset does not name: nothing read
    assert _pending(offset, "t") == 15 and _pending(offset, "u") == 0


def test_backlog_read_is_what_each_batch_took_out_of_pending(tmp_path: Path) -> None:
    """The event-time default shape counts backlog records behind their batch's watermark
    from the offset log alone (no backlog rows in its sink)."""
    from fastrebalance.testing._sparkchaos import _backlog_read, _key

    meta = '{"batchWatermarkMs":0}'
    (tmp_path / "offsets").mkdir()
    ends = [
        {"t": {"0": 10}},
        {"t": {"0": [50, [10, 40]]}},  # the restart batch: [10, 40) skipped, [40, 50) live
        {"t": {"0": [55, [30, 40]]}},  # [10, 30) read as backlog
        {"t": {"0": 60}, "u": {"0": 3}},  # [30, 40) read; another topic ignored
    ]
    for batch, end in enumerate(ends):
        (tmp_path / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(end)}")
    read = _backlog_read(tmp_path, "t")
    assert read[1] == [] and read[2] == [_key(0, o) for o in range(10, 30)]
    assert read[3] == [_key(0, o) for o in range(30, 40)]
