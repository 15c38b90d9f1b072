"""``fastrebalance bench --scenario group``'s report: the targets of issue 45, met or not,
from the runs' numbers (no cluster)."""

from __future__ import annotations

import argparse

import pytest

from fastrebalance.tools.groupbench import GroupRun, format_table, layouts, small_partitions

LAYOUT = (40_000, 20_000, 500, 1_500)


def _run(kind: str, members: int, drain: float, small: float, rep: int = 0) -> GroupRun:
    return GroupRun(kind=kind, members=members, drain_s=drain, start_s=1.0, fresh_p50_ms=1.0,
                    fresh_p99_ms=2.0, fresh=10, shares=[62_000 // members] * members, rep=rep,
                    backlogs=LAYOUT, done_s=[drain, drain, small, small])  # fmt: skip


def test_the_small_partitions_are_those_beside_a_big_one() -> None:
    assert small_partitions(LAYOUT) == [2, 3]
    assert small_partitions((60_000,)) == []  # alone, no partition is small


def test_the_targets_are_marked_from_each_repetitions_ratios() -> None:
    runs = [
        _run("plain", 3, 20.0, 19.0), _run("catchup", 3, 20.0, 19.0), _run("group", 3, 7.0, 1.0),
        _run("plain", 1, 25.0, 25.0), _run("catchup", 1, 25.0, 25.0), _run("group", 1, 26.0, 2.0),
    ]  # fmt: skip
    table = format_table(runs, "cmd")
    assert "| 3 | group | 7.00 | 0.35x | 0.35x | 1.00 | 0.05x |" in table
    assert "| group drain <= per-member's | 3 | 0.35x | **met** |" in table
    assert "| group drain <= 0.40x plain's | 3 | 0.35x | **met** |" in table
    assert "| group drain <= per-member's | 1 | 1.04x | **not met** |" in table
    assert "| small partitions done no later than per-member | 1 | 0.08x | **met** |" in table
    slower = format_table([*runs[:2], _run("group", 3, 9.0, 1.0)], "cmd")
    assert "| group drain <= 0.40x plain's | 3 | 0.45x | **not met** |" in slower


def test_layouts_parse_as_the_command_line_spells_them() -> None:
    assert layouts("40000,20000,500,1500/60000") == (LAYOUT, (60_000,))
    with pytest.raises(argparse.ArgumentTypeError):
        layouts("0,0")
