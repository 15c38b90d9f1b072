"""The Spark job example runs, so that it cannot rot.

It always starts its own embedded Kafka (its ``demo`` command is the one a user runs first),
so it runs in make test only: on a broker pass it would repeat that run (83 s of the Kafka 4
pass's 268 s, and 100 s of the Kafka 3.9 pass's longest chain, when it ran there).
"""

from __future__ import annotations

import pytest

from .test_examples import EXAMPLES, run_example

pytestmark = [pytest.mark.integration]

#: generous: the job starts a JVM and runs two queries (~40 s alone, 120 s was exceeded
#: beside three other Spark JVMs on this 2-core machine)
TIMEOUT_S = 360


def test_spark_example_runs(kafka_cluster) -> None:
    if kafka_cluster.kind != "embedded":
        pytest.skip("the Spark demo runs on its own embedded Kafka: make test runs it")
    # its demo piles up 60,000 records by default: 76 s of make test's serial Spark chain
    run_example(EXAMPLES / "spark_streaming_job.py", ["demo", "--backlog", "10000"], TIMEOUT_S)
