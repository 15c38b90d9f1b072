"""The demo's promise, on a small backlog: fresh records sooner, nothing lost.

The demo crashes a consumer that committed 0 on every partition, lets a 20k backlog
pile up, and restarts the group twice: plain, then fastrebalance. Both runs must
deliver every record; fastrebalance must reach the first fresh record first.

``--same-group`` kills a member of each restarted group first and times from the kill:
plain, fastrebalance with the dead-member removal off, and with it on (a real broker only).
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest

from fastrebalance.testing import KafkaCluster
from fastrebalance.tools import demo
from fastrebalance.tools.cli import EXIT_OK, EXIT_USAGE, main
from fastrebalance.tools.demo import (
    EMBEDDED_NO_REMOVAL,
    DemoResult,
    DemoSettings,
    format_results,
    run_demo,
)
from fastrebalance.tools.workload import SESSION_TIMEOUT_MS

pytestmark = pytest.mark.integration

# 200 us/record makes the plain replay of 20k records take ~4 s, far more than the ~0.1-0.5 s
# fastrebalance needs to its first fresh record, so the order cannot flip on a noisy machine
# (at 50 us, ~1 s, a loaded Kafka 3.9 pass saw plain first: 391 ms against 430 ms, stop 40);
# a short tail keeps each demo at a few seconds.
SMALL = DemoSettings(backlog=20_000, partitions=4, rate=100, work_us=200, tail_s=0.5)


def test_demo_fresh_records_first_and_nothing_lost(kafka_cluster: KafkaCluster) -> None:
    lines: list[str] = []
    result = run_demo(SMALL, cluster=kafka_cluster, out=lines.append)
    report = format_results(result)

    assert result.lost == 0, report
    for run in (result.plain, result.fast):
        assert not run.timed_out, report
        # the log held the whole backlog: nothing was trimmed under the demo
        assert run.backlog >= SMALL.backlog, report
        assert run.expected >= run.backlog, report
        assert run.first_fresh_s is not None, report
        assert run.backlog_done_s is not None, report
    assert result.log_backlog == SMALL.backlog, report
    assert result.fast.first_fresh_s < result.plain.first_fresh_s, report  # type: ignore[operator]
    # the plain consumer replays in offset order: no fresh record behind a newer one
    assert result.plain.fresh_out_of_order == 0, report
    assert result.fast.child_alive is True, report
    assert any(line.startswith("[7/7]") for line in lines)
    assert "lost: 0" in report


def test_cli_demo_exits_zero(kafka_cluster: KafkaCluster, capsys: pytest.CaptureFixture) -> None:
    argv = ["demo", "--backlog", "20000", "--work-us", "50", "--tail", "0.5"]
    if kafka_cluster.kind != "embedded":
        # honour FASTREBALANCE_TEST_BOOTSTRAP / Docker: the CLI would start its own mock
        argv += ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    assert main(argv) == EXIT_OK
    printed = capsys.readouterr().out
    assert "time to first fresh record" in printed
    assert "lost: 0" in printed


@dataclass(frozen=True)
class SameGroupRun:
    result: DemoResult
    printed: str


@pytest.fixture(scope="module")
def same_group(kafka_cluster: KafkaCluster) -> SameGroupRun:
    """One ``demo --same-group`` run through the CLI, shared by the tests of its table (it
    takes 30-40 s: three kills, each followed by a restart)."""
    captured: list[DemoResult] = []

    def run(settings: DemoSettings, **kwargs: Any) -> DemoResult:
        captured.append(run_demo(settings, **kwargs))
        return captured[-1]

    argv = ["demo", "--same-group", "--backlog", "8000", "--work-us", "50", "--tail", "0.5"]
    if kafka_cluster.kind != "embedded":
        argv += ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    out = io.StringIO()
    with mock.patch.object(demo, "run_demo", run), contextlib.redirect_stdout(out):
        code = main(argv)
    printed = out.getvalue()
    assert code == EXIT_OK, printed
    assert len(captured) == 1, printed
    return SameGroupRun(captured[0], printed)


def _seconds(cell: str) -> float:
    value, unit = cell.split()
    return float(value) / (1000 if unit == "ms" else 1)


def test_demo_same_group_without_the_removal_waits_for_the_session_timeout(
    same_group: SameGroupRun,
) -> None:
    # a SIGKILLed member never leaves its group: a restart that does not remove it gets its
    # partitions only after the dead member's session timeout (6 s in the demo)
    result, printed = same_group.result, same_group.printed
    waited = r"waited ([0-9.]+ m?s) from the kill for its assignment; ([0-9,]+) records produced"
    waits = re.findall(waited, printed)
    assert len(waits) == (2 if result.fast_removal is None else 3), printed
    for wait, meanwhile in waits[:2]:  # plain, then fastrebalance with the removal off
        assert _seconds(wait) >= SESSION_TIMEOUT_MS / 1000 - 1.5, printed
        # 100 fresh records/s kept coming during the wait: the backlog grew by them
        assert int(meanwhile.replace(",", "")) >= 100, printed
    for run in (result.plain, result.fast):
        assert run.joined_s is not None and run.joined_s >= SESSION_TIMEOUT_MS / 1000 - 1.5
        assert run.first_fresh_s is not None and run.first_fresh_s >= run.joined_s
        assert not run.timed_out, printed
    assert "SIGKILLed" in printed and "session.timeout.ms=6000" in printed
    assert "kill -> partitions assigned" in printed and "removal off" in printed
    assert "lost: 0" in printed and result.lost == 0


def test_demo_same_group_on_the_embedded_cluster_says_why_no_removal(
    same_group: SameGroupRun, kafka_cluster: KafkaCluster
) -> None:
    if kafka_cluster.kind != "embedded":
        pytest.skip("the embedded cluster's case: a real broker shows the removal")
    result, printed = same_group.result, same_group.printed
    assert result.fast_removal is None
    assert result.removal_skipped == EMBEDDED_NO_REMOVAL
    row = next(line for line in printed.splitlines() if line.startswith("kill -> partitions"))
    assert row.split()[-1] == "n/a", printed
    assert "--bootstrap-servers" in printed and "cannot bootstrap" in printed


@pytest.mark.kafka4
def test_demo_same_group_with_the_removal_gets_the_partitions_at_once(
    same_group: SameGroupRun, kafka_cluster: KafkaCluster
) -> None:
    if kafka_cluster.kind == "embedded":
        pytest.skip(
            "librdkafka's mock cluster cannot carry the admin LeaveGroup (the demo says why)"
        )
    result, printed = same_group.result, same_group.printed
    on, off = result.fast_removal, result.fast
    assert on is not None, printed
    assert result.removal_skipped == ""
    # removed, not waited out: well under the 6 s session the others waited (~0.5 s measured)
    assert on.joined_s is not None and on.joined_s < SESSION_TIMEOUT_MS / 1000 / 2, printed
    assert on.first_fresh_s is not None and off.first_fresh_s is not None, printed
    assert on.first_fresh_s < off.first_fresh_s, printed
    assert on.backlog_done_s is not None and not on.timed_out, printed
    assert on.lost == 0 and result.lost == 0, printed
    row = next(line for line in printed.splitlines() if line.startswith("kill -> partitions"))
    assert _seconds(" ".join(row.split()[-2:])) == pytest.approx(on.joined_s, abs=0.01), printed


@pytest.mark.parametrize(
    "argv",
    [[], ["demo", "--backlog", "-1"], ["demo", "--partitions", "0"], ["demo", "--rate", "x"]],
)
def test_cli_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err
