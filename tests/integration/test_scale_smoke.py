"""The scale scenario, bounded (100 partitions, one member, seconds), so that it cannot
rot; and the property it exists to show, pinned: nothing on the rebalance path asks the
broker once per partition.

Times are checked only against generous bounds (a shared CI machine makes them noise:
the benchmark, docs/benchmarks.md, is where speed is judged). What is checked is that a
token landed on every partition, every member got its partitions and a fresh record, and
that no request type other than the periodic Fetch/Heartbeat was sent once per partition,
counted twice over: by librdkafka's statistics in the scenario, and by counting the calls
made on both librdkafka handles in-process below.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest
from confluent_kafka import Producer, TopicPartition

import fastrebalance
from fastrebalance import _child, _consumer
from fastrebalance.testing import KafkaCluster
from fastrebalance.testing._workload import set_group_offsets
from fastrebalance.tools.cli import EXIT_USAGE, main
from fastrebalance.tools.scale import (
    FAST,
    PLAIN,
    ScaleSettings,
    format_markdown,
    per_partition_requests,
    per_partition_senders,
    run_scale,
)

from .helpers import base_conf

pytestmark = pytest.mark.integration

PARTITIONS = 100
SMOKE = ScaleSettings(
    partitions=PARTITIONS,
    layouts=(1,),
    members=(1,),
    backlog=20,
    threshold=10,
    rate=200.0,
    # the child's statistics come with the commit's serve() once it is a second old
    settle_s=1.2,
    run_timeout_s=60.0,
    memory=False,
)


def test_scale_smoke(kafka_cluster: KafkaCluster) -> None:
    result = run_scale(SMOKE, cluster=kafka_cluster, out=None)
    report = format_markdown(result, "fastrebalance bench-scale (smoke)")

    assert {c.consumer for c in result.cells} == {PLAIN, FAST}, report
    for cell in result.cells:
        assert cell.partitions == PARTITIONS and cell.backlog >= 2 * 20 * PARTITIONS, report
        (member,) = cell.results
        assert member.partitions == PARTITIONS, report
        assert member.first_fresh_s is not None and member.first_fresh_s < 30, report
        assert member.commit_s is not None and member.commit_s < 30, report
        assert member.close_s < 30, report
        assert member.requests, report  # librdkafka's statistics came
        assert per_partition_requests(member.requests, PARTITIONS) == {}, report
        if cell.consumer == FAST:
            # the plan covered every partition, well inside its 30 s budget
            assert max(p[0] for p in member.plans) == PARTITIONS, report
            assert max(p[1] for p in member.plans) < 20, report
            assert member.child_requests, report  # the child's statistics came too
            assert per_partition_requests(member.child_requests, PARTITIONS) == {}, report
            seed = cell.seed
            assert seed is not None, report
            # a range token on every partition, in one synchronous commit
            assert seed.committed == seed.tokens == PARTITIONS, report
            assert seed.metadata_bytes > 0 and seed.commit_s < 30, report
    assert per_partition_senders(result) == [], report
    assert "### Restart" in report and "### Broker requests" in report, report


def backlog(bootstrap: str, keys: list[tuple[str, int]], per_partition: int = 20) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for topic, partition in keys:
        for i in range(per_partition):
            p.produce(topic, value=str(i).encode(), partition=partition)
        p.poll(0)
    assert p.flush(30) == 0


class _Counting:
    """A librdkafka handle whose calls are counted (by method name)."""

    def __init__(self, handle: Any, calls: Counter[str]) -> None:
        self._handle = handle
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handle, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            # librdkafka answers a cached watermark query locally: no round trip
            self._calls[f"{name}(cached)" if kwargs.get("cached") else name] += 1
            return attr(*args, **kwargs)

        return counted


@pytest.fixture
def counted_handles(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Counter[str]]]:
    """Every librdkafka consumer handle fastrebalance creates, counted: the primary's
    calls and the child's apart."""
    calls: dict[str, Counter[str]] = {"primary": Counter(), "child": Counter()}

    def factory(which: str, make: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
        return lambda conf: _Counting(make(conf), calls[which])

    monkeypatch.setattr(_consumer, "_RdConsumer", factory("primary", _consumer._RdConsumer))
    monkeypatch.setattr(_child, "_RdConsumer", factory("child", _child._RdConsumer))
    yield calls


#: Calls that reach the broker (or librdkafka's main thread) once per call, whatever
#: the number of partitions they name.
_ROUND_TRIPS = ("committed", "offsets_for_times", "get_watermark_offsets", "commit",
                "list_topics", "assign", "incremental_assign", "incremental_unassign",
                "seek", "position")  # fmt: skip


def test_rebalance_path_calls_each_handle_a_fixed_number_of_times(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[[int], str],
    counted_handles: dict[str, Counter[str]],
) -> None:
    """A restart over 100 partitions, each with a token pending and a new backlog: the
    plan inside the rebalance callback reads both commit logs and the watermarks with a
    handful of batched calls, not one per partition."""
    bootstrap = kafka_cluster.bootstrap_servers
    topics = [topic_factory(50), topic_factory(50)]
    keys = [(t, p) for t in topics for p in range(50)]
    group = f"g-{uuid4().hex[:10]}"
    backlog(bootstrap, keys)
    for topic in topics:
        set_group_offsets(bootstrap, topic, group, [0] * 50)

    # Before the crash: every partition planned with a range and committed with a token.
    seed = fastrebalance.Consumer(base_conf(bootstrap, group))
    seed.assign([TopicPartition(t, p) for t, p in keys])
    starts = [
        TopicPartition(key[0], key[1], status.pending_ranges[-1][1])
        for key, status in seed.catchup_status().items()
    ]
    assert len(starts) == len(keys)
    seed.commit(offsets=starts, asynchronous=False)
    seed.close()
    backlog(bootstrap, keys)
    for counter in counted_handles.values():
        counter.clear()

    c = fastrebalance.Consumer(base_conf(bootstrap, group))
    try:
        c.subscribe(topics)
        deadline = time.monotonic() + 30
        while (c.metrics_snapshot().get("last_plan") or {}).get("partitions") != len(keys):
            assert time.monotonic() < deadline, "no plan of every partition within 30 s"
            c.poll(0.1)
        planned = c.metrics_snapshot()["last_plan"]
        statuses = c.catchup_status()
        # every partition: the token's range and the new backlog, one range (adjacent)
        assert len(statuses) == len(keys)
        assert all(s.pending_ranges == ((0, 40),) for s in statuses.values()), statuses
    finally:
        c.close()

    for which, counter in counted_handles.items():
        busy = {name: n for name, n in counter.items() if name in _ROUND_TRIPS and n > 3}
        assert not busy, f"{which} handle: {dict(counter)}"
    primary = counted_handles["primary"]
    # the group's log once, the watermarks twice (earliest, latest): all batched
    assert primary["committed"] == 1 and primary["offsets_for_times"] == 2, dict(primary)
    assert primary["get_watermark_offsets"] == 0, dict(primary)
    child = counted_handles["child"]
    # its checkpoints once for the tokens, once for stale checkpoints; one assign
    assert child["committed"] == 2 and child["incremental_assign"] == 1, dict(child)
    assert planned["seconds"] < 20, planned


@pytest.mark.parametrize(
    "argv",
    [
        ["bench-scale", "--partitions", "1000", "--layouts", "3"],
        ["bench-scale", "--members", "0"],
        ["bench-scale", "--backlog", "10", "--threshold", "10"],
        ["bench-scale", "--partitions", "x"],
    ],
)
def test_cli_bench_scale_usage_errors_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage:" in err or "error:" in err
