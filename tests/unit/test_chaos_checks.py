"""The chaos harness's checker, without Kafka: it must catch what it exists to catch.

A checker that never fails proves nothing, so each verdict is exercised on a hand-made
history: a committed offset that ran ahead of the logs, a token claim that did, records
deleted by retention (reported apart, never counted as delivered or as a violation), a
shutdown step over its documented bound (named, with the step a stuck worker is in). And
the async worker's own bookkeeping, which keeps its late commits true, is checked here
against every interleaving hypothesis finds.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._assigning import REVOKE_WAIT_S
from fastrebalance._ledger import Ledger
from fastrebalance._planner import PLAN_BUDGET_S
from fastrebalance._ranges import RangeSet
from fastrebalance._token import ChildCheckpoint, encode_child_checkpoint, encode_group_token
from fastrebalance.testing._chaos import ChaosResult, ChaosSettings, format_summary, parse_duration
from fastrebalance.testing._chaos_check import (
    LogRecord,
    Sample,
    _RangeMax,
    check_samples,
    claimed_intervals,
    format_line,
    parse_line,
    percentile,
    percentiles,
    read_logs,
)
from fastrebalance.testing._chaos_faults import start_cpu_hog, stop_cpu_hog
from fastrebalance.testing._chaos_workers import (
    BOUND_SLACK_S,
    close_limit,
    documented_bounds,
    shutdown_report,
)
from fastrebalance.testing._crashworker import Entry, HandedLog

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
    # the one definition every report uses: a measured value, never an interpolation
    assert (percentile([1.0, 2.0], 50), percentile([1.0, 2.0], 99), percentile([], 50)) == (
        1.0, 2.0, None,
    )  # fmt: skip


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


# ------------------------------------------------------------------ shutdown bounds
BOUNDS = documented_bounds(60.0, 0.1)
T0 = 1_000_000.0  # wall clock of the SIGTERM


def _ev(kind: str, t: float, **fields: object) -> dict:
    return {"ev": kind, "t": T0 + t, **fields}


def _phase(kind: str, t: float, phase: str, since: float, bound: float) -> dict:
    return _ev(kind, t, phase=phase, phase_t=T0 + since, bound=bound)


def _clean(final_s: float = 0.01, close_s: float = 0.5) -> list[dict]:
    """A shutdown: SIGTERM inside a consume(), the loop left 0.1 s later, then the final
    commit and close()."""
    return [
        _phase("sigterm", 0.0, "consume()", -0.05, BOUNDS["consume"]),
        _ev("stopping", 0.1),
        _ev("final_commit_begin", 0.2),
        _ev("final_commit_done", 0.2 + final_s, duration=final_s),
        _ev("close_begin", 0.3 + final_s),
        _ev("closed", 0.3 + final_s + close_s, duration=close_s),
    ]


def test_documented_bounds_and_the_close_limit_derive_from_the_library() -> None:
    assert BOUNDS["consume"] == pytest.approx(0.1 + PLAN_BUDGET_S)
    assert BOUNDS["commit"] == 60.0  # socket.timeout.ms
    assert BOUNDS["close"] == 2 * 60.0 + REVOKE_WAIT_S
    # the call under way at SIGTERM, the final commit, close(), slack
    assert close_limit(BOUNDS) == 60.0 + 60.0 + 130.0 + 30.0
    assert close_limit(documented_bounds(10.0)) < close_limit(BOUNDS)


def test_a_shutdown_within_its_bounds_is_not_reported() -> None:
    events = _clean()
    assert shutdown_report("w3.0", events, T0, T0 + 1.0, BOUNDS) == []


def test_a_final_commit_over_its_bound_is_named() -> None:
    events = _clean(final_s=75.0)
    assert shutdown_report("w3.0", events, T0, T0 + 80.0, BOUNDS) == [
        "w3.0: final commit took 75 s (bound 60 s)"
    ]
    # within the slack: not reported
    events = _clean(final_s=BOUNDS["commit"] + BOUND_SLACK_S - 1)
    assert shutdown_report("w3.0", events, T0, T0 + 80.0, BOUNDS) == []


def test_a_close_still_running_is_named_with_every_step() -> None:
    events = _clean()[:-1]  # no "closed"
    report = shutdown_report("w3.0", events, T0, T0 + 251.4, BOUNDS, exited=False)
    assert report[0] == "w3.0: close() still running after 251 s (bound 130 s)"
    assert report[-1].startswith("w3.0's steps since SIGTERM: consume() 0.2 s")
    assert "close() 251.1 s (still running)" in report[-1]


def test_a_consume_that_never_returns_is_named() -> None:
    events = [_phase("sigterm", 0.0, "consume()", -2.0, BOUNDS["consume"])]
    report = shutdown_report("w1.2", events, T0, T0 + 100.0, BOUNDS, exited=False)
    assert report[0] == "w1.2: consume() still running after 102 s (bound 30.1 s)"


def test_a_commit_in_the_loop_over_its_bound_is_named_after_the_fact() -> None:
    events = [
        _phase("sigterm", 0.0, "commit()", -1.0, BOUNDS["commit"]),
        _phase("phase", 70.0, "the worker's own code", 69.5, BOUNDS["own"]),
        *_clean()[1:],
    ]
    for e in events[2:]:
        e["t"] += 70.0
    assert shutdown_report("w0.1", events, T0, T0 + 80.0, BOUNDS) == [
        "w0.1: commit() took 70 s (bound 60 s)"
    ]


def test_time_spent_sigstopped_is_not_counted_against_a_step() -> None:
    # a consume() under way when the worker was SIGSTOPped 100 s ago, SIGCONT and SIGTERM now
    events = [_phase("sigterm", 0.0, "consume()", -100.0, BOUNDS["consume"]), *_clean()[1:]]
    assert shutdown_report("w0.0", events, T0, T0 + 2.0, BOUNDS) != []
    assert shutdown_report("w0.0", events, T0, T0 + 2.0, BOUNDS, resumed_t=T0 - 0.01) == []


def test_a_worker_silent_since_sigterm_or_stuck_after_close_is_reported() -> None:
    report = shutdown_report("w2.0", [], T0, T0 + 300.0, BOUNDS, exited=False)
    assert report[0].startswith("w2.0: no event since SIGTERM 300 s ago")
    report = shutdown_report("w2.0", _clean(), T0, T0 + 300.0, BOUNDS, exited=False)
    assert report[0].startswith(
        "w2.0: the interpreter's exit after close() returned still running after 299 s"
    )


def test_the_watchdog_and_the_main_thread_reporting_one_step_make_one_step() -> None:
    events = _clean(close_s=140.0)
    events.insert(-1, _phase("phase", events[-2]["t"] - T0 + 0.4, "close()", 0.31, 130.0))
    report = shutdown_report("w3.0", events, T0, T0 + 200.0, BOUNDS)
    assert report == ["w3.0: close() took 140 s (bound 130 s)"]


# --------------------------------------------------------- the async worker's commits
class _Msg:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_frontier_never_passes_a_record_handed_out_before_it_that_is_not_durable(
    data: st.DataObject,
) -> None:
    """The async pipeline commits a record (by message, or offset + 1) only once it is the
    frontier: it and every record handed out before it on its partition (any stream, any
    assignment: the same offset may come twice) durable."""
    handed = HandedLog()
    entries: list[Entry] = []
    frontier: dict[int, Entry] = {}
    for _ in range(data.draw(st.integers(1, 60))):
        if data.draw(st.booleans()) or not entries:
            m = _Msg(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 30)))
            entries.append(handed.hand(m, "f", 1))
        else:
            pending = [e for e in entries if not e.durable]
            chosen = data.draw(st.lists(st.sampled_from(pending), unique=True)) if pending else []
            moved = handed.make_durable(chosen)
            for p, e in moved.items():
                assert e.durable and e.partition == p
                before = [x for x in entries if x.partition == p and x.seq <= e.seq]
                assert all(x.durable for x in before), (e, before)
                assert p not in frontier or frontier[p].seq < e.seq  # it only moves on
                frontier[p] = e
            # and it moved as far as it could
            for p in {e.partition for e in chosen}:
                queue = [x for x in entries if x.partition == p]
                reach = next((i for i, x in enumerate(queue) if not x.durable), len(queue))
                if reach:
                    assert frontier[p] is queue[reach - 1]
    assert handed.all_durable() == all(e.durable for e in entries)


# ------------------------------------------------------------------- summary, hog
def test_summary_counts_worker_modes_late_commits_and_shutdowns() -> None:
    result = ChaosResult(1, ChaosSettings(cpu_hog=2), Path("/tmp/x"))
    result.modes.update({"inorder": 4, "async": 3})
    result.processes = 7
    result.async_commit_whens.update({"current": 10, "revoked": 5, "reassigned": 2})
    result.async_commit_kinds.update({"message_sync": 9, "offsets": 8})
    result.shutdown_seconds = [1.5, 12.25]
    text = format_summary(result)
    assert "| worker processes      | 7 (inorder 4, async 3)" in text
    assert "17 (5 after the partition left the member, 2 in a later assignment" in text
    assert "message_sync 9, offsets 8" in text
    assert "2, slowest 12.2 s from SIGTERM to exit; 0 documented bounds exceeded" in text
    assert "CPU hog of 2 busy processes" in text
    result.bounds_exceeded = ["w3.0: final commit took 75 s (bound 60 s)"]
    assert not result.ok and "w3.0: final commit took 75 s (bound 60 s)" in result.problems()


def test_settings_reject_unknown_modes() -> None:
    with pytest.raises(ValueError, match="worker modes"):
        ChaosSettings(modes=("inorder", "lazy")).validate()
    with pytest.raises(ValueError, match="worker modes"):
        ChaosSettings(modes=()).validate()
    with pytest.raises(ValueError, match="cpu_hog"):
        ChaosSettings(cpu_hog=-1).validate()


def test_the_cpu_hog_is_stopped_and_dies_with_its_parent() -> None:
    hogs = start_cpu_hog(2)
    assert all(h.poll() is None for h in hogs)
    stop_cpu_hog(hogs)
    assert all(h.poll() is not None for h in hogs)
    # a harness SIGKILLed mid-run leaves no hog behind
    code = (
        "import sys, time\n"
        "from fastrebalance.testing._chaos_faults import start_cpu_hog\n"
        "print(start_cpu_hog(1)[0].pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
