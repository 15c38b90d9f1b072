"""The two chaos slices on a loaded machine: a CPU hog runs beside them.

``test_chaos.py`` (every kind of fault, cooperative protocol) and ``test_crash_sigkill.py``
(the four SIGKILL kinds, KIP-848) again, shorter, while two busy processes (``cpu_hog``:
``while True: pass``) compete for the CPU with the broker, the producer and every worker for
the whole run (the harness kills them afterwards, also when the run fails). A loaded
machine stretches every step: heartbeats, rebalances, commits and the child's catch-up come
late and in different orders, timeouts fire that never fire on a quiet machine. Each fault
kind the slice knows is injected at least once (``every_fault``), and everything the quiet
slices check must still hold: nothing lost, no offset ahead of processing, every clean
shutdown within the library's documented bounds.

The seeds are printed; ``FASTREBALANCE_CHAOS_SEED`` / ``FASTREBALANCE_CRASH_SEED`` replay
one (``FASTREBALANCE_CHAOS_LOADED_SECONDS`` lengthens the first).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._chaos import ALL_FAULTS, BROKER_FAULTS, KILL_FAULTS

from .test_chaos import current_test, every_fault_settings, run_and_check
from .test_crash_sigkill import sigkill_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPU_HOG = 2


def test_chaos_every_fault_loses_nothing_on_a_loaded_machine(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    settings = every_fault_settings(
        tmp_path,
        duration_s=float(os.environ.get("FASTREBALANCE_CHAOS_LOADED_SECONDS", 40)),
        min_faults=len(ALL_FAULTS),
        every_fault=True,
        cpu_hog=CPU_HOG,
    )
    result = run_and_check(
        settings, kafka_cluster, "FASTREBALANCE_CHAOS_SEED", f"{__file__}::{current_test()}"
    )
    kinds = [
        k for k in ALL_FAULTS if k not in BROKER_FAULTS or hasattr(kafka_cluster, BROKER_FAULTS[k])
    ]
    assert set(result.faults) == set(kinds), result.faults


def test_sigkill_chaos_kip848_loses_nothing_on_a_loaded_machine(
    kip848_cluster: Any, tmp_path: Path
) -> None:
    settings = sigkill_settings(tmp_path, duration_s=20.0, every_fault=True, cpu_hog=CPU_HOG)
    result = run_and_check(
        settings, kip848_cluster, "FASTREBALANCE_CRASH_SEED", f"{__file__}::{current_test()}"
    )
    assert set(result.faults) == set(KILL_FAULTS), result.faults
