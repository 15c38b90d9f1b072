"""Every example runs, so that none can rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.py"))
#: The Spark demo starts its own embedded Kafka whatever the suite runs against, so it runs
#: in make test only (see the test); the consumer examples are marked kafka4 too. The Kafka 4
#: pass had run the Spark demo, 83 s of a 268 s pass, on that embedded Kafka.
SPARK_EXAMPLES = {"spark_streaming_job.py"}


#: generous: the Spark example starts a JVM and runs two queries (~40 s alone, 120 s was
#: exceeded beside three other Spark JVMs on this 2-core machine)
TIMEOUT_S = 360


#: arguments of an example, where its defaults would only make the run longer (the Spark
#: job's demo piles up 60,000 records by default: 76 s of make test's serial Spark chain)
ARGS = {"spark_streaming_job.py": ["demo", "--backlog", "10000"]}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.name, marks=() if p.name in SPARK_EXAMPLES else pytest.mark.kafka4)
        for p in EXAMPLES
    ],
)
def test_example_runs(path: Path, kafka_cluster) -> None:
    """On the embedded cluster each example starts its own, as a user's first run does; on a
    real broker the consumer examples run against it (``--bootstrap-servers``). The Spark
    demo always starts its own embedded Kafka: on a broker pass it would only repeat make
    test's run (100 s of the Kafka 3.9 pass's longest chain)."""
    args = ARGS.get(path.name, [])
    if kafka_cluster.kind != "embedded":
        if path.name in SPARK_EXAMPLES:
            pytest.skip("the Spark demo runs on its own embedded Kafka: make test runs it")
        args = [*args, "--bootstrap-servers", kafka_cluster.bootstrap_servers]
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
