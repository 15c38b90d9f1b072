"""Chaos for exactly-once: eos workers SIGKILLed mid-transaction, and each input once.

Every worker runs a read-process-write loop with catch-up on: it copies each input record to
an output topic inside a producer transaction that also carries both commit logs
(``Consumer.send_offsets_to_transaction``). Workers are killed at random moments, among them
after producing and before committing, and inside ``commit_transaction``; restarted
incarnations reuse their slot's ``transactional.id`` and so fence the dead one. The check
reads the output topic ``read_committed`` and demands exactly one output per input value.

It needs a broker that stores transactional offsets: librdkafka's mock acknowledges
TxnOffsetCommit and drops it, so here (no Docker, no FASTREBALANCE_TEST_BOOTSTRAP) it skips.
``fastrebalance chaos --modes eos`` is the long soak.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._chaos import ChaosSettings, format_summary, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_eos_workers_write_each_input_once(transactional_cluster: Any, tmp_path: Path) -> None:
    seed = os.environ.get("FASTREBALANCE_CHAOS_SEED")
    settings = ChaosSettings(
        duration_s=float(os.environ.get("FASTREBALANCE_CHAOS_SECONDS", 60)),
        seed=int(seed) if seed else None,
        workers=2,
        min_workers=1,
        max_workers=3,
        partitions=4,
        rate=300,
        modes=("eos",),
        faults=("kill", "kill_catchup", "kill_commit", "stop", "restart", "add", "remove"),
        min_faults=7,
        workdir=tmp_path,
    )
    result = run_chaos(settings, cluster=transactional_cluster, out=lambda s: print(s, flush=True))
    summary = format_summary(result, f"FASTREBALANCE_CHAOS_SEED={result.seed} pytest {__file__}")
    print("\n" + summary, flush=True)
    assert result.ok, "\n".join(result.problems()) + "\n" + summary
    # the check read something, and the run exercised what it claims to
    assert result.output_records >= result.produced > 0
    assert result.output_missing == [] and result.output_duplicated == []
    assert result.fault_total >= settings.min_faults, result.faults
    assert result.backlog_first_deliveries > 0, "no catch-up ran: the child never delivered"
