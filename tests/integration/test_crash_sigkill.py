"""SIGKILL chaos on a KIP-848 group (``group.protocol=consumer``): no produced record is lost.

The SIGKILL-only slice of the chaos harness (``fastrebalance.testing._chaos``, also behind
``fastrebalance chaos``), on the new consumer group protocol, whose incremental assignment
moves a dead member's partitions without stopping the others: workers die at random
moments, while their child reads a backlog range, while a commit is in flight, and while
they join. The harness checks at-least-once delivery and that the group's committed offset,
sampled every 0.5 s with a plain consumer, never ran ahead of what the workers had durably
processed (for the bare offset and for the claim the range token plus the child checkpoint
make). The cooperative-protocol variant with every kind of fault is ``test_chaos.py``.

The seed is printed; ``FASTREBALANCE_CRASH_SEED`` replays one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._chaos import KILL_FAULTS, ChaosSettings, format_summary, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sigkill_chaos_kip848_loses_nothing(kafka_cluster: Any, tmp_path: Path) -> None:
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
        workdir=tmp_path,
    )
    result = run_chaos(settings, cluster=kafka_cluster, out=lambda line: print(line, flush=True))
    summary = format_summary(result, f"FASTREBALANCE_CRASH_SEED={result.seed} pytest {__file__}")
    print("\n" + summary, flush=True)
    assert result.ok, f"seed {result.seed}:\n" + "\n".join(result.problems()) + "\n" + summary
    assert set(result.faults) <= set(KILL_FAULTS)
    assert result.fault_total >= 6
