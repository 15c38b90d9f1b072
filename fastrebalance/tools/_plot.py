"""The pictures behind ``fastrebalance bench --plot`` (every fresh record's latency against
the moment it was produced after the restart, one panel per backlog size, each consumer of
the same run as its own series) and ``fastrebalance bench-spark --plot`` (records in the
sink over time after a restart, backlog and live, each mode as its own line).

Why a picture beside the tables: a p99 says how long the worst 1 % waited, not when. A
plain consumer's fresh records wait behind its replay, so their latency falls along a
diagonal (produced later, waited less) until the backlog is delivered, then stays flat;
fastrebalance's stay flat from the restart on. The tables cannot show that shape.

matplotlib is optional (the ``plot`` extra) and imported here only, with its Agg backend:
the benchmark runs on machines with no display, and an interactive backend would try to
open one. This module knows nothing of the benchmark: ``bench.recovery_panels`` chooses
what is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

INSTALL_HINT = "pip install 'fastrebalance[plot]'"
#: Each consumer keeps its colour in every panel, so that panels compare at a glance.
COLOURS = {"plain": "tab:orange", "plain tuned": "tab:red", "fastrebalance": "tab:blue"}
#: The floor of the log-scale axis: a latency at or below 0 (clock granularity) has no
#: place on it, and nothing measured here is faster than 0.1 ms.
_FLOOR_MS = 0.1


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed. A RuntimeError, so that the command line reports it
    as a run that could not happen (exit code 3), with the install command."""


@dataclass(frozen=True)
class Series:
    """One consumer's restart: its fresh records as (produced at, latency), seconds since
    the restart, and when it had delivered the backlog (None: never), for its legend."""

    label: str
    samples: Sequence[tuple[float, float]]
    backlog_done_s: float | None


@dataclass(frozen=True)
class Panel:
    """One backlog size: the restarts drawn together, and the steady-state p99 (seconds;
    None: not measured) as the line a recovered consumer should come back to."""

    title: str
    series: Sequence[Series]
    steady_p99_s: float | None = None


def require_matplotlib() -> Any:
    """matplotlib with the Agg backend selected. Called before a benchmark starts, so
    that a missing extra fails in a second rather than after ten minutes of runs.

    Raises:
        PlotUnavailable: matplotlib cannot be imported; the message names the extra.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from exc
    matplotlib.use("Agg")
    return matplotlib


def draw(panels: Sequence[Panel], path: str, title: str, columns: int = 3) -> str:
    """Write ``panels`` as a PNG to ``path`` (whatever its suffix) and return ``path``.

    Panels share both axes: the x axis is the fresh-latency window in every panel, and a
    shared log-scale y axis lets a glance compare one backlog's latencies with another's.
    """
    if not panels:
        raise ValueError("nothing to plot: no recovery run with a backlog")
    require_matplotlib()
    import matplotlib.pyplot as plt

    cols = min(columns, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, 3.9 * rows), sharex=True, sharey=True,
        squeeze=False, layout="constrained",
    )  # fmt: skip
    try:
        for ax, panel in zip(axes.flat, panels, strict=False):
            _draw_panel(ax, panel)
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        for ax in axes.flat:
            ax.set_xlabel("produced, seconds after the restart")
        for ax in axes[:, 0]:
            ax.set_ylabel("delivery latency, ms")
        fig.suptitle(title)
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def _draw_panel(ax: Any, panel: Panel) -> None:
    for s in panel.series:
        done = "never" if s.backlog_done_s is None else f"{s.backlog_done_s:.2f} s"
        x = [produced for produced, _ in s.samples]
        y = [max(latency * 1000, _FLOOR_MS) for _, latency in s.samples]
        ax.scatter(
            x, y, s=5, alpha=0.6, linewidths=0, color=COLOURS.get(s.label),
            label=f"{s.label}: backlog delivered {done}, {len(x):,} fresh records",
        )  # fmt: skip
    if panel.steady_p99_s is not None:
        ax.axhline(panel.steady_p99_s * 1000, color="grey", linestyle="--", linewidth=1,
                   label=f"steady-state p99 ({panel.steady_p99_s * 1000:.1f} ms)")  # fmt: skip
    ax.set_yscale("log")
    ax.set_title(panel.title, fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    # below the panel: inside, it hid the points of the first seconds, which matter most
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize="x-small",
              markerscale=2.5, frameon=False)  # fmt: skip


@dataclass(frozen=True)
class Curve:
    """A count over time: (seconds, count) points, drawn as steps (a sink grows by
    batches), and the label of its legend."""

    label: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class CurvePanel:
    title: str
    ylabel: str
    curves: Sequence[Curve]


def draw_curves(panels: Sequence[CurvePanel], path: str, title: str, xlabel: str) -> str:
    """Write ``panels`` side by side as a PNG at ``path`` and return ``path``. The panels
    share the x axis; a label keeps its colour in every panel."""
    if not panels or not any(c.points for p in panels for c in p.curves):
        raise ValueError("nothing to plot: no curve has a point")
    require_matplotlib()
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(c.label for p in panels for c in p.curves))
    colour = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.6 * len(panels), 4.2), sharex=True, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    try:
        for ax, panel in zip(axes.flat, panels, strict=True):
            for c in panel.curves:
                x = [0.0, *(t for t, _ in c.points)]
                y = [0.0, *(n for _, n in c.points)]
                ax.step(x, y, where="post", color=colour[c.label], label=c.label, alpha=0.8)
            ax.set_title(panel.title, fontsize="medium")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(panel.ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="lower right", fontsize="x-small")
        fig.suptitle(title)
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
