"""The CI slice of the group-wide catch-up chaos: three member processes SIGKILLed and
restarted at random while the group drains a backlog and fresh records arrive; then
everything must be processed and the group's offset must never have been unsafe.

Once with the classic protocol, once with the consumer protocol (KIP-848) where the cluster
serves it. Replay a failing run with its seed: ``FASTREBALANCE_GROUP_CHAOS_SEED=<seed>``; the
long run is ``fastrebalance chaos-group --duration 30m [--protocol consumer]``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fastrebalance.testing import KafkaCluster
from fastrebalance.testing._groupchaos import run_group_chaos


def test_group_chaos_slice_loses_nothing(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    _slice(kafka_cluster, tmp_path, "classic")


@pytest.mark.kafka4
def test_group_chaos_slice_kip848_loses_nothing(
    kip848_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """The same under the consumer protocol (KIP-848): the embedded cluster and Kafka 4."""
    _slice(kip848_cluster, tmp_path, "consumer")


def _slice(kafka_cluster: KafkaCluster, tmp_path: Path, protocol: str) -> None:
    seed = int(os.environ.get("FASTREBALANCE_GROUP_CHAOS_SEED") or random.randrange(1 << 30))
    report = run_group_chaos(
        kafka_cluster.bootstrap_servers,
        tmp_path,
        seconds=20,
        members=3,
        backlog=20_000,
        fresh_per_s=100,
        work_us=200,
        chunk=1000,
        claim_timeout_ms=3000,
        seed=seed,
        kill_every_s=(1.5, 4.0),
        drain_s=60,
        create_topic=kafka_cluster.create_topic,
        log=print,
        protocol=protocol,
        group_timeout=kafka_cluster.kind != "embedded",
    )
    print(f"seed {seed}: {report.as_dict()}")
    assert report.kills >= 3, report.as_dict()
    assert report.drained, f"not drained within 60 s (seed {seed}): {report.as_dict()}"
    assert report.lost == 0 and report.unsafe == 0, f"seed {seed}: {report.as_dict()}"
    assert report.samples > 0
