"""The demo's promise, on a small backlog: fresh records sooner, nothing lost.

The demo crashes a consumer that committed 0 on every partition, lets a 20k backlog
pile up, and restarts the group twice: plain, then fastrebalance. Both runs must
deliver every record; fastrebalance must reach the first fresh record first.
"""

from __future__ import annotations

import re

import pytest

from fastrebalance.testing import KafkaCluster
from fastrebalance.tools.cli import EXIT_OK, EXIT_USAGE, main
from fastrebalance.tools.demo import DemoSettings, format_results, run_demo
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


def test_demo_same_group_waits_for_the_session_timeout(
    kafka_cluster: KafkaCluster, capsys: pytest.CaptureFixture
) -> None:
    # a SIGKILLed member never leaves its group: the restart into that group gets its
    # partitions only after the dead member's session timeout (6 s in the demo)
    argv = ["demo", "--same-group", "--backlog", "8000", "--work-us", "50", "--tail", "0.5"]
    if kafka_cluster.kind != "embedded":
        argv += ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    assert main(argv) == EXIT_OK
    printed = capsys.readouterr().out
    waited = r"waited ([0-9.]+) s for its assignment; ([0-9,]+) records produced"
    waits = re.findall(waited, printed)
    assert len(waits) == 2, printed
    for wait, meanwhile in waits:
        assert float(wait) >= SESSION_TIMEOUT_MS / 1000 - 1, printed
        # 100 fresh records/s kept coming during the wait: the backlog grew by them
        assert int(meanwhile.replace(",", "")) >= 100, printed
    assert "SIGKILLed" in printed and "session.timeout.ms=6000" in printed
    assert "waited for its assignment" in printed  # the table's row
    assert "lost: 0" in printed


@pytest.mark.parametrize(
    "argv",
    [[], ["demo", "--backlog", "-1"], ["demo", "--partitions", "0"], ["demo", "--rate", "x"]],
)
def test_cli_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err
