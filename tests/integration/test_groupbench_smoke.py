"""A smoke run of ``fastrebalance bench --scenario group`` (the full run is a CLI command:
docs/benchmarks.md, "Group-wide catch-up")."""

from __future__ import annotations

from fastrebalance.testing import KafkaCluster
from fastrebalance.tools.groupbench import format_table, run_group_bench


def test_group_bench_smoke(kafka_cluster: KafkaCluster) -> None:
    lines: list[str] = []
    runs = run_group_bench(
        kafka_cluster.bootstrap_servers,
        backlogs=((2500, 250),),
        work_us=20,
        member_counts=(2,),
        kinds=("catchup", "group"),
        rate=50,
        chunk=1000,
        timeout_s=60,
        out=lines.append,
        create=kafka_cluster.create_topic,
        reps=2,
    )
    assert [(r.kind, r.members, r.rep) for r in runs] == [
        ("catchup", 2, 0), ("group", 2, 0), ("catchup", 2, 1), ("group", 2, 1)
    ]  # fmt: skip
    for r in runs:
        assert r.drain_s is not None and r.drain_s > 0, r
        assert sum(r.shares) >= 2750, r  # every backlog record processed (twice only after a crash)
        assert len(r.done_s) == 2 and all(t is not None for t in r.done_s), r
    table = format_table(runs, "smoke")
    assert "| 2 | group |" in table and "x |" in table
    assert table.count("| 2 | group |") == 1  # one row per kind: the repetitions' medians
    assert "(small: partition 1)" in table  # the 250-record partition beside the big one
    # the targets, each marked
    assert "| group drain <= per-member's | 2 |" in table and "met** |" in table
    assert "| small partitions done no later than per-member | 2 |" in table
    assert len(lines) == 4
