"""The Spark source on a real standalone cluster: the reader runs in executor processes that
share nothing with the driver but the network.

A master and two workers are started from the pyspark install's own ``bin/spark-class``
(``org.apache.spark.deploy.master.Master``, ``...worker.Worker``) on 127.0.0.1, each in a
session of its own, and torn down with every executor and Python worker they started, even
when the test fails. The job is the crash harness's (``fastrebalance.testing._sparkchaos``)
with ``--master spark://127.0.0.1:PORT``, not killed: records from live traffic and a
backlog, one ``availableNow`` run, and the harness's check that the sink holds every
record of the topic exactly once.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastrebalance.testing._sparkchaos import (
    SparkChaosSettings,
    format_result,
    kill_session,
    run_spark_chaos,
    session_members,
)
from fastrebalance.testing._sparkpython import worker_python

pyspark = pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(what: str, timeout: float, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ready after {timeout:g}s")
        time.sleep(0.2)


class StandaloneCluster:
    """A master and ``workers`` workers of 1 core each, every JVM in its own session."""

    def __init__(self, folder: Path, workers: int = 2) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": worker_python(),  # this interpreter (_sparkpython)
        }
        self.env = env
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(_free_port()),
        )
        for i in range(workers):
            work = folder / f"worker-{i}"
            work.mkdir()
            self._start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "768m",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(work),
                self.url,
            )
        log = folder / "master.log"
        _wait_for(
            f"{workers} workers registered with the master",
            120,
            lambda: log.read_text().count("Registering worker") >= workers,
        )

    def _start(self, name: str, cls: str, *args: str) -> None:
        with open(self.folder / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def executors(self) -> list[Path]:
        """The executor folders the workers made (``app-*/<executor id>``)."""
        return sorted(self.folder.glob("worker-*/app-*/*"))

    def close(self) -> None:
        for p in self.procs:
            kill_session(p.pid)
            p.wait()


@pytest.fixture
def cluster(tmp_path: Path, kafka_cluster: Any) -> Iterator[StandaloneCluster]:
    if kafka_cluster.kind == "embedded":
        # As test_spark_connect's server: a deployment of Spark, run once per CI run (90 s
        # of make test's serial Spark chain).
        pytest.skip(
            "the standalone cluster runs on a real broker (make test-kafka, CI's Kafka 3.9 "
            "pass, or FASTREBALANCE_TEST_BOOTSTRAP)"
        )
    c = StandaloneCluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
        left = {p.pid: session_members(p.pid) for p in c.procs}
        assert not any(left.values()), f"processes left behind: {left}"


def test_the_job_on_a_standalone_cluster_delivers_every_record_once(
    cluster: StandaloneCluster, kafka_cluster, tmp_path: Path
) -> None:
    settings = SparkChaosSettings(
        duration_s=0,
        min_kills=0,
        triggers=("availableNow",),
        master=cluster.url,
        workdir=tmp_path / "job",
    )
    started = time.monotonic()
    result = run_spark_chaos(settings, kafka_cluster, out=print)
    print(format_result(result), f"\njob: {time.monotonic() - started:.1f}s")
    (phase,) = result.phases
    assert phase.ok, format_result(result)
    assert phase.kills == 0 and phase.attempts == phase.batches > 0
    assert phase.delivered == phase.owed == phase.in_topic > 0
    # the reader ran in executors, processes the workers started (not the driver). Which
    # worker's executor got the tasks is Spark's scheduling (both, or one of them alone on
    # a loaded machine): not asserted.
    executors = cluster.executors()
    assert executors and all(re.fullmatch(r"\d+", e.name) for e in executors), executors
    ran = [e for e in executors if "Finished task" in _text(e / "stderr")]
    assert ran, f"no executor finished a task: {executors}"


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
