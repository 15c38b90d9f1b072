"""Every example runs, so that none can rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka4]
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.py"))


#: generous: the Spark example starts a JVM and runs two queries (~40 s alone, 120 s was
#: exceeded beside three other Spark JVMs on this 2-core machine)
TIMEOUT_S = 360


#: arguments of an example, where its defaults would only make the run longer (the Spark
#: job's demo piles up 60,000 records by default: 76 s of make test's serial Spark chain)
ARGS = {"spark_streaming_job.py": ["demo", "--backlog", "10000"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(path), *ARGS.get(path.name, [])],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
