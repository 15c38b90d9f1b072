"""SIGKILL chaos on a KIP-848 group (``group.protocol=consumer``): no produced record is lost.

The SIGKILL-only slice of the chaos harness (``fastrebalance.testing._chaos``, also behind
``fastrebalance chaos``), on the new consumer group protocol, whose incremental assignment
moves a dead member's partitions without stopping the others: workers (in-order ones and
asynchronous pipelines that commit late) die at random moments, while their child reads a
backlog range, while a commit is in flight, and while they join. The harness checks
at-least-once delivery and that the group's committed offset, sampled every 0.5 s with a
plain consumer, never ran ahead of what the workers had durably processed (for the bare
offset and for the claim the range token plus the child checkpoint make). Each kind at
least once, while two busy processes (``cpu_hog``) load the machine, as in ``test_chaos.py``
(the cooperative-protocol slice with every kind of fault).

The seed is printed; ``FASTREBALANCE_CRASH_SEED`` replays one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._chaos import KILL_FAULTS, ChaosSettings

from .test_chaos import CPU_HOG, current_test, run_and_check

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.kafka4, pytest.mark.alone]


def sigkill_settings(tmp_path: Path, **overrides: Any) -> ChaosSettings:
    """The slice: 2 KIP-848 members, 4 partitions, the four SIGKILL kinds, a loaded machine."""
    env = os.environ.get("FASTREBALANCE_CRASH_SEED")
    settings = ChaosSettings(
        duration_s=float(os.environ.get("FASTREBALANCE_CRASH_SECONDS", 25)),
        seed=int(env) if env else None,
        workers=2,
        min_workers=2,
        max_workers=2,
        partitions=4,
        rate=2000,
        protocol="consumer",
        faults=KILL_FAULTS,
        min_faults=6,
        fault_gap_s=(1.5, 4.0),
        every_fault=True,
        cpu_hog=CPU_HOG,
        workdir=tmp_path,
    )
    for name, value in overrides.items():
        setattr(settings, name, value)
    return settings


def test_sigkill_chaos_kip848_loses_nothing(kip848_cluster: Any, tmp_path: Path) -> None:
    settings = sigkill_settings(tmp_path)
    result = run_and_check(
        settings, kip848_cluster, "FASTREBALANCE_CRASH_SEED", f"{__file__}::{current_test()}"
    )
    assert set(result.faults) == set(KILL_FAULTS), result.faults
    if kip848_cluster.kind != "embedded":  # kafka-python cannot bootstrap from the mock
        # restarted workers removed their dead predecessors (on by default)
        assert removals_logged(tmp_path) > 0, "no restarted worker removed a dead member"


def removals_logged(workdir: Path) -> int:
    """Dead members the workers removed at their subscribe() (their INFO lines)."""
    return sum(
        p.read_text(errors="replace").count("removed dead member")
        for p in workdir.rglob("*.stderr")
    )


def test_sigkill_loop_with_dead_member_removal_loses_nothing(
    kafka_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeated SIGKILL/restart cycles of 2-3 workers on one host, classic protocol, at the
    session timeout Kafka's clients default to (45 s): each restarted worker removes its
    dead predecessors from the group (parallel.rebalance.remove.dead.members, on by
    default, their state files in one directory), and nothing is lost."""
    if kafka_cluster.kind == "embedded":
        pytest.skip("kafka-python's admin client cannot bootstrap from librdkafka's mock cluster")
    monkeypatch.setenv("FASTREBALANCE_STATE_DIR", str(tmp_path / "state"))  # the workers'
    settings = sigkill_settings(
        tmp_path,
        protocol="cooperative",
        workers=3,
        min_workers=2,
        max_workers=3,
        session_timeout_ms=45000,
        max_poll_interval_ms=45000,
        fault_gap_s=(2.0, 5.0),
    )
    run_and_check(
        settings, kafka_cluster, "FASTREBALANCE_CRASH_SEED", f"{__file__}::{current_test()}"
    )
    assert removals_logged(tmp_path) > 0, "no restarted worker removed a dead member"
