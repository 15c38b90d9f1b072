"""Chaos in CI: every kind of fault, at random moments, on a loaded machine, and not one
record lost.

A bounded run of the harness behind ``fastrebalance chaos`` (``fastrebalance.testing._chaos``):
a producer writes uniquely numbered records while three consumer processes in one group
(cooperative-sticky) suffer at least 16 faults, every kind the harness knows at least once:
SIGKILL at random moments, while the child is mid-range, while a commit is in flight and
while joining; SIGSTOP/SIGCONT past ``session.timeout.ms`` and ``max.poll.interval.ms``;
clean restarts; members added and removed; the broker process itself paused and restarted
(where the test owns the broker). Each consumer process is either an in-order worker or an
asynchronous pipeline (out-of-order processing, commits made seconds late, after its
partitions moved). Two busy processes (``cpu_hog``: ``while True: pass``) compete for the
CPU with the broker, the producer and every worker for the whole run: heartbeats,
rebalances, commits and the child's catch-up come late and in other orders, and timeouts
fire that never fire on a quiet machine. Then it drains and checks at-least-once delivery,
that the group's stored offset never ran ahead of what the consumers had durably processed
(sampled every 0.5 s by a plain consumer), that every clean shutdown kept the library's
documented time bounds, and reports duplicates and latency percentiles.

The seed is printed; ``FASTREBALANCE_CHAOS_SEED`` replays one and
``FASTREBALANCE_CHAOS_SECONDS`` lengthens the run. Long soaks: ``fastrebalance chaos``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._chaos import (
    ALL_FAULTS,
    BROKER_FAULTS,
    ChaosResult,
    ChaosSettings,
    format_summary,
    run_chaos,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.alone]

#: Every kind (10) at least once, and more: the run goes on past its duration until both hold.
MIN_FAULTS = 16
#: Busy processes beside the whole run: 2, or what FASTREBALANCE_CHAOS_HOGS says (make test
#: runs this slice and test_crash_sigkill's side by side with one each: two on the machine).
CPU_HOG = int(os.environ.get("FASTREBALANCE_CHAOS_HOGS", "2"))


def _seed() -> int | None:
    env = os.environ.get("FASTREBALANCE_CHAOS_SEED")
    return int(env) if env else None


def current_test() -> str:
    """The running test's name, for the command that replays it."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]


def every_fault_settings(tmp_path: Path, **overrides: Any) -> ChaosSettings:
    """The slice: 3 cooperative members (2-4), 4 partitions, every kind of fault, a loaded
    machine."""
    settings = ChaosSettings(
        duration_s=float(os.environ.get("FASTREBALANCE_CHAOS_SECONDS", 45)),
        seed=_seed(),
        workers=3,
        min_workers=2,
        max_workers=4,
        partitions=4,
        rate=1000,
        protocol="cooperative",
        faults=ALL_FAULTS,
        min_faults=MIN_FAULTS,
        # closer than the soak's 2.5-6.5 s: the slice's length is its 16 faults (it took
        # 120-168 s in make test with the soak's gaps), and faults that overlap more are no
        # easier on the library
        fault_gap_s=(1.5, 4.5),
        every_fault=True,
        cpu_hog=CPU_HOG,
        workdir=tmp_path,
    )
    for name, value in overrides.items():
        setattr(settings, name, value)
    return settings


def run_and_check(
    settings: ChaosSettings, cluster: Any, seed_variable: str, test: str
) -> ChaosResult:
    """Run a slice, print its summary (with the command that replays it: the seed in
    ``seed_variable``, then ``test``), and check what every slice must hold."""
    result = run_chaos(settings, cluster=cluster, out=lambda line: print(line, flush=True))
    summary = format_summary(result, f"{seed_variable}={result.seed} pytest {test}")
    print("\n" + summary, flush=True)
    assert result.ok, f"seed {result.seed}:\n" + "\n".join(result.problems()) + "\n" + summary
    assert result.lost == [] and result.deleted_by_retention == 0
    assert result.fault_total >= settings.min_faults, result.faults
    # both worker behaviours ran, and the async pipeline committed
    assert set(result.modes) == set(settings.modes), result.modes
    assert sum(result.async_commit_whens.values()) > 0, "the async pipeline never committed"
    return result


def test_chaos_every_fault_loses_nothing(kafka_cluster: Any, tmp_path: Path) -> None:
    settings = every_fault_settings(tmp_path)
    result = run_and_check(
        settings, kafka_cluster, "FASTREBALANCE_CHAOS_SEED", f"{__file__}::{current_test()}"
    )
    # the run exercised what it claims to: every kind of fault the cluster allows, catch-ups,
    # both logs
    kinds = [
        k for k in ALL_FAULTS if k not in BROKER_FAULTS or hasattr(kafka_cluster, BROKER_FAULTS[k])
    ]
    assert set(result.faults) == set(kinds), result.faults
    assert result.token_samples > 0, "no sample ever saw a pending range: no catch-up ran?"
    assert result.checkpoint_samples > 0, "the child never checkpointed"
    assert result.backlog_first_deliveries > 0
