"""The chaos harness's checker, without Kafka: it must catch what it exists to catch.

A checker that never fails proves nothing, so each verdict is exercised on a hand-made
history: a committed offset that ran ahead of the logs, a token claim that did, records
deleted by retention (reported apart, never counted as delivered or as a violation).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._ledger import Ledger
from fastrebalance._ranges import RangeSet
from fastrebalance._token import ChildCheckpoint, encode_child_checkpoint, encode_group_token
from fastrebalance.testing._chaos import (
    ChaosSettings,
    LogRecord,
    Sample,
    _RangeMax,
    check_samples,
    claimed_intervals,
    format_line,
    parse_duration,
    parse_line,
    percentiles,
    read_logs,
)

LOG = Path("w0.0.log")


def _records(offsets: list[int], partition: int = 0, start_byte: int = 0) -> list[LogRecord]:
    """Records logged one after another, each line 10 bytes."""
    return [
        LogRecord(partition, o, o, LOG, start_byte + 10 * (i + 1), 1.0, "f")
        for i, o in enumerate(offsets)
    ]


def _sample(
    offset: int,
    log_bytes: int,
    metadata: str | None = None,
    child: tuple[int, str | None] = (-1, None),
) -> Sample:
    return Sample(0.0, {0: (offset, metadata)}, {0: child}, {LOG: log_bytes})


def test_offset_behind_the_logs_passes() -> None:
    records = _records(list(range(10)))
    samples = [_sample(5, 50), _sample(10, 100)]
    assert check_samples(samples, records, {0: 10}) == []


def test_offset_ahead_of_the_logs_is_caught() -> None:
    records = _records(list(range(10)))
    # offset 8 committed while only offsets 0..4 were in the log (50 bytes)
    problems = check_samples([_sample(8, 50)], records, {0: 10})
    # reported for the bare offset, and for the claim (no token: the same offset)
    assert len(problems) == 2
    assert "committed offset covers [0, 8)" in problems[0] and "[5, 6, 7]" in problems[0]


def test_a_record_in_no_log_is_caught_even_if_later_ones_are() -> None:
    records = _records([0, 1, 2, 4, 5])  # 3 was never processed
    problems = check_samples([_sample(6, 1000)], records, {0: 6})
    assert problems and "[3]" in problems[0]


def _token_sample(state: Ledger, log_bytes: int, child: tuple[int, str | None]) -> Sample:
    token = state.token()
    assert token is not None
    text, written = encode_group_token(token)
    return _sample(written.safe_offset, log_bytes, text, child)


def test_token_claim_ahead_of_the_logs_is_caught() -> None:
    # KIP example: committed 70, end 120: the primary reads from 120, the child [70, 120).
    # The primary processed 120..124: the token says position 125, [70, 120) pending.
    state = Ledger(125, RangeSet([(70, 120)]))
    history = _records([*range(70), *range(120, 125)])  # 0..69 by an earlier owner
    # the bare offset (70) claims 0..69; the token claims 0..69 and 120..124
    assert check_samples([_token_sample(state, 10_000, (-1, None))], history, {0: 125}) == []
    # the same token, sampled before 120..124 reached a log (700 bytes = 0..69): caught
    problems = check_samples([_token_sample(state, 700, (-1, None))], history, {0: 125})
    assert len(problems) == 1 and "token+checkpoint claim covers [120, 125)" in problems[0]


def test_child_checkpoint_claim_is_checked() -> None:
    state = Ledger(125, RangeSet([(70, 120)]))
    cp = ChildCheckpoint(70, 120, 90)  # "70..89 processed"
    child = (90, encode_child_checkpoint(cp))
    history = _records(list(range(70)) + list(range(120, 125)) + list(range(70, 85)))
    sample = _token_sample(state, 10_000, child)
    _, claimed = claimed_intervals(sample, 0)
    assert claimed == [(0, 90), (120, 125)]
    problems = check_samples([sample], history, {0: 125})
    assert problems and "[85, 86, 87, 88, 89]" in problems[0]


def test_retention_deleted_offsets_are_no_violation() -> None:
    records = _records(list(range(50, 60)))  # 0..49 deleted before anyone read them
    sample = _sample(60, 1000)
    assert check_samples([sample], records, {0: 60})  # without the low watermark: caught
    assert check_samples([sample], records, {0: 60}, deleted={0: 50}) == []
    # but a record above the low watermark in no log is still a violation
    records = _records([*range(50, 55), *range(56, 60)])
    assert check_samples([sample], records, {0: 60}, deleted={0: 50})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=300), st.data())
def test_range_max_matches_max(values: list[int], data: st.DataObject) -> None:
    rmax = _RangeMax(values)
    a = data.draw(st.integers(0, len(values) - 1))
    b = data.draw(st.integers(a + 1, len(values)))
    assert rmax(a, b) == max(values[a:b])


def test_log_lines_round_trip_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    line = format_line(3, 1234, "99", 12.345, "b")
    assert parse_line(line.encode()) == (3, 1234, 99, 12.3, "b")
    path = tmp_path / "w.log"
    path.write_text(format_line(0, 1, "1", 1.0, "f") + "0 2 2 1.0")  # SIGKILL mid-line
    records = read_logs([path, tmp_path / "never-written.log"])
    assert [(r.offset, r.stream, r.end) for r in records] == [
        (1, "f", len(format_line(0, 1, "1", 1.0, "f")))
    ]


def test_percentiles() -> None:
    values = list(range(1, 1001))
    random.Random(1).shuffle(values)
    p = percentiles([float(v) for v in values])
    assert (p["p50"], p["p99"], p["p99.9"], p["max"], p["n"]) == (500, 990, 999, 1000, 1000)
    assert percentiles([])["n"] == 0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("2.5m", 150)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "10x", "m10", "10m5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        ChaosSettings(faults=("kill", "meteor")).validate()
    with pytest.raises(ValueError):
        ChaosSettings(workers=3, max_workers=2).validate()
    with pytest.raises(ValueError, match="max_poll_interval_ms"):
        ChaosSettings(session_timeout_ms=9000, max_poll_interval_ms=7000).validate()
