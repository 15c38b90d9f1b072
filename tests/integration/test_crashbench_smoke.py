"""A short slice of ``fastrebalance bench --scenario crash`` on a real broker: one SIGKILL
and restart with the dead member's removal on, measured from the kill, so the benchmark
behind the README's first numbers cannot rot. Its full run is a CLI command
(docs/operations.md, "Recovery time after a crash").

The slice keeps librdkafka's default 45 s session, so a restart that waited out the dead
member's session cannot pass for one that removed it.
"""

from __future__ import annotations

import pytest

from fastrebalance.testing import KafkaCluster
from fastrebalance.tools.crashbench import CrashSettings, format_markdown, measure

pytestmark = [pytest.mark.integration]


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_a_restart_after_a_kill_is_fresh_long_before_the_session_expires(
    kafka_cluster: KafkaCluster, protocol: str
) -> None:
    if kafka_cluster.kind == "embedded":
        pytest.skip("the removal needs a real broker: kafka-python's admin client cannot "
                    "bootstrap from librdkafka's mock cluster")  # fmt: skip
    proto = protocol.removeprefix("kip848-")
    s = CrashSettings(bootstrap=kafka_cluster.bootstrap_servers, reps=1, protocols=(proto,),
                      clients=("on",), rate=200.0, work_us=0.0, warmup_s=2.0,
                      give_up_s=120.0)  # fmt: skip
    run = measure(s, proto, "on", 0)
    assert run.lost == 0, run
    assert run.records > 0
    # far below the 45 s session the dead member would otherwise hold its partitions for;
    # generous for a loaded machine (a quiet one measures about 1 s)
    assert run.measured.get("assigned", 99.0) < 25.0, run
    assert run.measured.get("fresh", 99.0) < 30.0, run
    table = format_markdown(s, [run], "fastrebalance bench --scenario crash", "machine")
    assert f"| {proto} | fastrebalance, removal on |" in table
