"""Every consumer example runs, so that none can rot (the Spark job's: test_spark_example.py).

On the embedded cluster each example starts its own, as a user's first run does; on a real
broker they run against it (``--bootstrap-servers``), Kafka 4 included. They are not in the
serial Spark chain of tests/conftest.py: they start no JVM.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]
EXAMPLES = Path(__file__).parents[2] / "examples"
#: the Spark job example, tested in test_spark_example.py
SPARK_EXAMPLES = {"spark_streaming_job.py"}
TIMEOUT_S = 120


def run_example(path: Path, args: list[str], timeout: float) -> None:
    proc = subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


@pytest.mark.kafka4
@pytest.mark.parametrize(
    "path",
    [p for p in sorted(EXAMPLES.glob("*.py")) if p.name not in SPARK_EXAMPLES],
    ids=lambda p: p.name,
)
def test_example_runs(path: Path, kafka_cluster) -> None:
    args = []
    if kafka_cluster.kind != "embedded":
        args = ["--bootstrap-servers", kafka_cluster.bootstrap_servers]
    run_example(path, args, TIMEOUT_S)
