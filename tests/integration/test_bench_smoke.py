"""A bounded run of the benchmark, so that it cannot rot: seconds, a small backlog.

Numbers are not checked (a shared CI machine makes them noise); what is checked is
that every scenario runs for every consumer, the real backlog was measured from the
watermarks, no record was lost, and the report comes out.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fastrebalance.testing import KafkaCluster
from fastrebalance.tools import _runner
from fastrebalance.tools._runner import Worker
from fastrebalance.tools.bench import (
    FAST,
    LOOPS,
    PLAIN,
    TUNED,
    VARIANTS,
    BenchSettings,
    format_markdown,
    run_bench,
    write_plot,
)
from fastrebalance.tools.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from fastrebalance.tools.groupbench import main as group_main

pytestmark = pytest.mark.integration

# 2,000 records per partition: above the default lag threshold (1,000), so the
# fastrebalance restart really catches up with a child consumer.
SMOKE = BenchSettings(
    backlogs=(8_000,),
    work_us=(0.0,),
    reps=1,
    steady_reps=1,
    duration_s=1.0,
    throughput_records=20_000,
    tail_s=0.2,
    run_timeout_s=60.0,
)


def test_bench_smoke(kafka_cluster: KafkaCluster, capfd: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    result = run_bench(SMOKE, cluster=kafka_cluster, out=lines.append)
    report = format_markdown(result, "fastrebalance bench (smoke)")
    # librdkafka writes its own lines to fd 2 ("%6|<time>|BGQUEUE|rdkafka#producer-6|..."),
    # among the report on a terminal: the admin clients the benchmark makes must not
    _out, err = capfd.readouterr()
    # fd 2 is the test worker's: a client an earlier test left to the garbage collector,
    # whose own broker is gone, logs there too (a real-broker pass once caught
    # "Connect to ipv4#127.0.0.1:24316 failed" of such a catch-up child while the bench
    # used another cluster): a line naming another address is not the benchmark's; nor
    # one naming a topic not of the benchmark's (theirs are fastrebalance-...: a Kafka 3.9
    # pass caught "Topic t-3ef4a4cb8a ... partition count changed from 1 to 0" of a
    # producer of an earlier test whose topic was deleted)
    ours = {b.strip() for b in kafka_cluster.bootstrap_servers.split(",")}
    noise = [
        line
        for line in re.findall(r"^%\d\|.*$", err, re.MULTILINE)
        if not (set(re.findall(r"\d+\.\d+\.\d+\.\d+:\d+", line)) - ours)
        and all(t.startswith("fastrebalance-") for t in re.findall(r"Topic (\S+)", line))
    ]
    assert not noise, err

    assert result.ok, report
    kinds = {(r.asked, r.consumer) for r in result.recovery}
    assert kinds == {(0, FAST), (8_000, PLAIN), (8_000, TUNED), (8_000, FAST)}, report
    for run in result.recovery:
        r = run.result
        assert r.lost == 0 and not r.timed_out, report
        assert r.backlog_done_s is not None and r.first_fresh_s is not None, report
        assert r.fresh_records > 0 and r.fresh_p99_s is not None, report
        assert run.rss_peak_kib >= run.rss_base_kib > 0, report
        if run.asked:
            # the log held the whole backlog asked for, and the restart saw at least that
            assert run.prepared == run.asked, report
            assert r.backlog >= run.asked, report
    fast = next(r for r in result.recovery if r.asked and r.consumer == FAST)
    assert fast.result.child_alive is True, report  # the catch-up really ran

    assert {(t.loop, t.variant) for t in result.throughput} == {
        (loop, v) for loop in LOOPS for v in VARIANTS
    }, report
    assert all(t.records == SMOKE.throughput_records - 1 for t in result.throughput), report
    assert all(t.per_s > 0 for t in result.throughput), report

    assert "### Recovery" in report and "### Steady state" in report, report
    assert "Loss check: 0 records lost" in report, report
    assert "drain fastrebalance ÷ plain tuned" in report, report

    # the check fails loudly over runs that could not show a loss (issue 20: "0 lost" was
    # printed over a table of empty runs when the producer failed)
    for broken, why in (
        (replace(result, produce_failures=3), "3 records failed to produce"),
        (
            replace(result, recovery=tuple(replace(r, prepared=0) for r in result.recovery)),
            "asked for a backlog and found none",
        ),
    ):
        assert not broken.ok and why in format_markdown(broken, "broken"), why


def test_bench_plot_draws_the_recovery_runs(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    settings = replace(SMOKE, scenarios=("recovery",), keep_samples=True)
    result = run_bench(settings, cluster=kafka_cluster, out=None)
    report = format_markdown(result, "fastrebalance bench --plot (smoke)")
    assert result.ok, report
    for run in result.recovery:
        r = run.result
        # one (produced at, latency) per fresh record counted, inside the window
        assert len(r.samples) == r.fresh_records > 0, report
        assert all(0 <= at < settings.duration_s and lat > 0 for at, lat in r.samples), report
        assert max(lat for _, lat in r.samples) == pytest.approx(r.fresh_max_s), report

    png = tmp_path / "recovery.png"
    assert write_plot(result, str(png)) == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 400 and height >= 300, (width, height)
    assert len(data) > 20_000  # axes, three series of points and their legend, not a blank

    # without samples (a run not asked to keep them) there is nothing to draw
    bare = replace(result, recovery=tuple(
        replace(r, result=replace(r.result, samples=())) for r in result.recovery))  # fmt: skip
    with pytest.raises(ValueError, match="no samples"):
        write_plot(bare, str(tmp_path / "bare.png"))


def test_cli_bench_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    png = tmp_path / "x.png"
    # refused before any cluster or run: a bootstrap that answers nothing proves it
    argv = ["bench", "--scenario", "recovery", "--bootstrap-servers", "127.0.0.1:1",
            "--plot", str(png)]  # fmt: skip
    assert main(argv) == EXIT_ERROR
    assert "pip install 'fastrebalance[plot]'" in capsys.readouterr().err
    assert not png.exists()


def test_cli_bench_plot_needs_the_recovery_scenario(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--scenario", "steady", "--plot", "x.png"]) == EXIT_USAGE
    assert "--plot draws the recovery scenario" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--backlogs", "x"],
        ["bench", "--backlogs", "0"],
        ["bench", "--work-us", "-1"],
        ["bench", "--reps", "0"],
        ["bench", "--scenario", "nope"],
    ],
)
def test_cli_bench_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_benchmarks_script_is_the_cli_command() -> None:
    script = Path(__file__).parents[2] / "benchmarks" / "run.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "--backlogs" in proc.stdout and "fastrebalance bench" in proc.stdout


def test_a_worker_module_run_by_hand_says_what_it_is() -> None:
    # it exited 0 having done nothing, and `groupbench run` (its command) looked the same
    for module in ("fastrebalance.tools.bench", "fastrebalance.tools.scale"):
        proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == EXIT_USAGE and "worker" in proc.stderr, (module, proc)
    assert group_main([]) == EXIT_USAGE  # groupbench's own command line: `run` is required


def test_an_orphaned_worker_exits_soon_after_its_parent() -> None:
    # A recovery or throughput run reads no command: orphaned by a SIGKILLed parent, it ran
    # on to its run timeout (300 s). Here: a throughput run waiting for a cluster that does
    # not answer, with a 600 s timeout, whose parent goes away (its stdin ends).
    spec = {"kind": "throughput", "bootstrap": "127.0.0.1:1", "topic": "t",
            "groups": {"raw": "g"}, "variants": ["raw"], "loop": "poll", "records": 10,
            "run_timeout_s": 600.0}  # fmt: skip
    worker = Worker("fastrebalance.tools.bench", spec)
    try:
        assert worker.next_event(2.0) is None  # running, waiting for its first record
        assert worker.proc.stdin is not None
        worker.proc.stdin.close()
        assert worker.proc.wait(timeout=60) == 3
    finally:
        worker.close()


def test_the_session_cleans_up_a_named_cluster_after_ctrl_c(
    kafka_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it cleaned up only after a run without an exception: Ctrl-C left the topics and groups
    calls: list[tuple[list[str], list[str]]] = []
    monkeypatch.setattr(_runner, "cleanup", lambda _b, t, g: calls.append((list(t), list(g))))
    with pytest.raises(KeyboardInterrupt), _runner.Session(
        "smoke", kafka_cluster.bootstrap_servers, out=None
    ) as session:
        session.topics.append("a-topic")  # as session.topic() registers what it makes
        group = session.group("g")
        raise KeyboardInterrupt
    assert calls == [(["a-topic"], [group, f"{group}.catchup"])]
