"""The Spark crash harness's checker on hand-made sink histories: each kind of problem it must
report, and the crash duplicates it must count without failing (no Spark, no Kafka)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrebalance.testing._sparkchaos import Attempt, Life, check_attempts, read_sink


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
    (tmp_path / "b00000003-l0002-c0001.txt").write_text(
        json.dumps(head) + "\nt 0 7 0\nt 1 9 1\n"
    )
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
