"""The chaos harness names the documented bound a worker's clean shutdown broke.

A worker that does not exit within the harness's limit after SIGTERM is reported with the
step it is stuck in and that step's bound (``documented_bounds``: the final synchronous
commit within ``socket.timeout.ms``, ``close()`` within twice it plus the revoke wait, a
``consume()`` within its timeout plus the planning budget), every step's duration, and its
thread stacks; a step that broke its bound but finished is reported too. The hang is
simulated with the worker's test-only ``--hang STEP=SECONDS`` (a sleep at the start of the
step, as a library call that never returns), with ``socket.timeout.ms`` at 2 s so that the
bounds are short. The unit tests (``tests/unit/test_chaos_checks.py``) cover the report's
logic; this covers the plumbing: the worker's watchdog thread, its events, the stack dump.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from fastrebalance.testing._chaos import ChaosSettings
from fastrebalance.testing._chaos_workers import Fleet, documented_bounds

pytestmark = [pytest.mark.integration]


def test_the_broken_bound_is_named(kafka_cluster: Any, tmp_path: Path) -> None:
    topic, group = f"t-{uuid4().hex[:10]}", f"g-{uuid4().hex[:10]}"
    kafka_cluster.create_topic(topic, 2)
    bounds = documented_bounds(2.0)
    assert bounds["commit"] == 2.0
    settings = ChaosSettings(socket_timeout_ms=2000)
    fleet = Fleet(kafka_cluster.bootstrap_servers, topic, group, settings, tmp_path)
    try:
        settings.worker_args = ("--hang", "final commit=120")
        stuck = fleet.add()
        settings.worker_args = ("--hang", "final commit=9.5")
        slow = fleet.add()
        deadline = time.monotonic() + 60
        while not (stuck.up and slow.up):
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        time.sleep(1.0)
        for run in (stuck, slow):
            fleet.sigterm(run)
        assert not fleet.terminate(stuck, "test", timeout=10.0)
        assert fleet.terminate(slow, "test")  # the limit the bounds give: it exits in time
    finally:
        fleet.kill_everything()

    (death,) = fleet.deaths
    print(death)
    assert death.startswith("w0.0 did not exit within 10 s of SIGTERM: w0.0: final commit still ")
    assert "(bound 2 s)" in death
    assert "w0.0's steps since SIGTERM: " in death and "(still running)" in death
    # the stack dump names where it is stuck
    assert "Thread 0x" in death and "_crashworker.py" in death and "__call__" in death
    (slow_report,) = fleet.slow
    assert re.fullmatch(r"w1\.0: final commit took 1\d s \(bound 2 s\)", slow_report)
