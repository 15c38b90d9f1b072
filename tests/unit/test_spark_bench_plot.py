"""``fastrebalance bench-spark --plot``: the sink's records over time, from the batches a run
saw, and the PNG drawn from them (no Spark needed: the batches are made here)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from fastrebalance.tools.cli import EXIT_ERROR, EXIT_USAGE, main
from fastrebalance.tools.spark_bench import Batch, Result, sink_over_time, sink_panels


def _batch(id_: int, at: float, backlog: int = 0, fresh: int = 0, fresh_star: int = 0) -> Batch:
    kinds = {}
    if backlog:
        kinds["backlog*"] = (backlog, 0)
    if fresh:
        kinds["fresh"] = (fresh, 0)
    if fresh_star:  # live records sent before the source looked at the log end: backlog rows
        kinds["fresh*"] = (fresh_star, 0)
    return Batch(id_, at, kinds)


def test_the_curve_cumulates_backlog_and_live_records_in_the_order_the_sink_had_them() -> None:
    batches = [
        _batch(3, 1012.0, backlog=400, fresh=10),
        _batch(1, 1003.0, fresh=5, fresh_star=2),  # the restart batch: live only
        _batch(2, 1008.0, backlog=600, fresh=20),
    ]
    assert sink_over_time(batches, since=1000.0) == [
        (3.0, 0, 7),
        (8.0, 600, 27),
        (12.0, 1000, 37),
    ]
    assert sink_over_time([], since=0.0) == []


def _result(points: list[tuple[float, int, int]]) -> Result:
    return Result(1.0, points[-1][0], 0.5, 1.0, [2.0], points)


def test_the_plot_draws_each_modes_first_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fastrebalance.tools._plot import draw_curves

    runs = {
        "catchup": [_result([(1.0, 0, 5), (4.0, 500_000, 40), (9.0, 2_000_000, 90)]),
                    _result([(1.0, 0, 1)])],
        "plain": [_result([(12.0, 2_000_000, 120)])],
    }  # fmt: skip
    panels = sink_panels(runs)
    assert [p.title for p in panels] == ["backlog records in the sink", "live records in the sink"]
    backlog = {c.label: list(c.points) for c in panels[0].curves}
    assert backlog == {
        "catchup": [(1.0, 0), (4.0, 500_000), (9.0, 2_000_000)],
        "plain": [(12.0, 2_000_000)],
    }
    png = tmp_path / "sink.png"
    assert draw_curves(panels, str(png), "a restart", "seconds") == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 300, (width, height)
    with pytest.raises(ValueError, match="nothing to plot"):
        draw_curves([], str(png), "", "")


def test_plot_without_matplotlib_names_the_extra_before_any_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    png = tmp_path / "x.png"
    # refused before Spark or a cluster: a bootstrap that answers nothing proves it
    argv = ["bench-spark", "--bootstrap-servers", "127.0.0.1:1", "--plot", str(png)]
    assert main(argv) == EXIT_ERROR
    assert "pip install 'fastrebalance[plot]'" in capsys.readouterr().err
    assert not png.exists()


def test_plot_is_refused_with_scale(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    argv = ["bench-spark", "--scale", "4", "--plot", str(tmp_path / "x.png")]
    assert main(argv) == EXIT_USAGE
    assert "--plot draws the restart runs" in capsys.readouterr().err
