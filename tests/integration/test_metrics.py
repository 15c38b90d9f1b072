"""Catch-up metrics read from a real Prometheus registry and a real OpenTelemetry reader
during a catch-up, checked against catchup_status(); the 75 % token warning; and
``fastrebalance status --prometheus`` scraped over HTTP."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fastrebalance import Consumer, TopicPartition
from fastrebalance.metrics import METRICS, OpenTelemetryMetrics, PrometheusCollector, samples

from .helpers import base_conf, drain, produce

pytestmark = pytest.mark.integration


def _catching_up(bs: str, group: str, topic: str, **extra: Any) -> Consumer:
    """Crash with 1000 committed, log end 6000: catching up [1000, 6000)."""
    produce(bs, topic, 6000)
    seed = Consumer(base_conf(bs, group))
    seed.assign([TopicPartition(topic, 0, 1000)])
    seed.commit(offsets=[TopicPartition(topic, 0, 1000)], asynchronous=False)
    seed.close()
    c = Consumer(base_conf(bs, group, **{"client.id": "metrics-test", **extra}))
    c.assign([TopicPartition(topic, 0)])
    return c


def test_prometheus_numbers_match_catchup_status(kafka_cluster, topic_factory, unique_group):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _catching_up(bs, unique_group, topic)
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(c))
    labels = {"group": unique_group, "client_id": "metrics-test", "topic": topic, "partition": "0"}
    base = {"group": unique_group, "client_id": "metrics-test"}
    try:
        got = drain(c, lambda ms: len(ms) >= 2000)
        child_2000 = next(m for m in got if m.offset() == 2000)
        c.commit(message=child_2000, asynchronous=False)  # publishes a snapshot
        status = c.catchup_status()[(topic, 0)]
        pending = sum(e - s for s, e in status.pending_ranges)

        def value(name: str, which: dict[str, str] = labels) -> float | None:
            return registry.get_sample_value(name, which)

        assert value("fastrebalance_pending_records") == pending == 6000 - 2001
        assert value("fastrebalance_pending_ranges") == len(status.pending_ranges) == 1
        if status.child_position is not None:
            assert value("fastrebalance_child_position") == status.child_position
        assert value("fastrebalance_child_alive", base) == 1.0
        assert value("fastrebalance_token_bytes") and value("fastrebalance_token_bytes") > 10
        assert value("fastrebalance_token_budget_bytes", base) == 4000
        assert value("fastrebalance_catchups_started_total", base) == 1
        child = value("fastrebalance_records_delivered_total", {**base, "stream": "child"})
        assert child is not None and child >= 1001
        assert value("fastrebalance_commit_failures_total", {**base, "log": "group"}) == 0
        # drained: the catch-up finished, the counters say so
        drain(c, lambda ms: any(m.offset() == 5999 for m in ms))
        c.commit(asynchronous=False)
        assert value("fastrebalance_pending_records") == 0
        assert value("fastrebalance_catchups_finished_total", base) == 1
        text = "\n".join(f"{n} {v}" for n, _, v in samples(c.metrics_snapshot()))
        # every metric but the child's position (it was not reading) and group-wide
        # catch-up's (off here: test_group_catchup.py checks them)
        assert all(
            m.name in text
            for m in METRICS
            if m.name != "fastrebalance_child_position"
            and not m.name.startswith("fastrebalance_group_")
        )
    finally:
        c.close()


def test_opentelemetry_reader_gets_the_same_numbers(kafka_cluster, topic_factory, unique_group):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _catching_up(bs, unique_group, topic)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    OpenTelemetryMetrics(c, meter_provider=provider)
    try:
        got = drain(c, lambda ms: len(ms) >= 1500)
        c.commit(message=next(m for m in got if m.offset() == 1499), asynchronous=False)
        status = c.catchup_status()[(topic, 0)]
        points: dict[str, list[Any]] = {}
        data = reader.get_metrics_data()
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    points[metric.name] = list(metric.data.data_points)
        (pending,) = points["fastrebalance_pending_records"]
        assert pending.value == sum(e - s for s, e in status.pending_ranges) == 6000 - 1500
        assert dict(pending.attributes)["topic"] == topic
        (started,) = points["fastrebalance_catchups_started"]
        assert started.value == 1
    finally:
        c.close()
        provider.shutdown()


def test_a_token_past_three_quarters_of_its_budget_is_warned_once(
    kafka_cluster, topic_factory, unique_group, caplog
):
    """Many crashes left many pending ranges: the token takes over 75 % of
    parallel.rebalance.metadata.max.bytes. A WARNING and a counter say so once, before
    coalescing (past the budget) starts re-reading processed records."""
    from confluent_kafka import Consumer as PlainConsumer

    from fastrebalance._token import GroupToken, encode_group_token

    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 4000)
    budget = 400
    ranges: list[tuple[int, int]] = []
    while True:  # crash ranges of 10 records, 50 apart, until the token passes 80 %
        ranges.append((len(ranges) * 60, len(ranges) * 60 + 10))
        text, _ = encode_group_token(GroupToken(4000, tuple(ranges)), budget)
        if len(text) > 0.8 * budget:
            break
    seed = PlainConsumer({"bootstrap.servers": bs, "group.id": unique_group})
    seed.commit(offsets=[TopicPartition(topic, 0, 0, text)], asynchronous=False)
    seed.close()
    caplog.set_level(logging.WARNING, logger="fastrebalance")
    conf = {"client.id": "metrics-test", "parallel.rebalance.metadata.max.bytes": budget}
    c = Consumer(base_conf(bs, unique_group, **conf))
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(c))
    base = {"group": unique_group, "client_id": "metrics-test"}
    try:
        c.assign([TopicPartition(topic, 0)])
        produce(bs, topic, 2, start=4000)
        fresh = [m for m in drain(c, lambda ms: any(m.offset() == 4001 for m in ms))
                 if m.offset() >= 4000]  # fmt: skip
        for m in fresh:  # the primary's records: the pending ranges stay
            c.commit(message=m, asynchronous=False)
        warnings = [r for r in caplog.records if "of commit metadata" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert registry.get_sample_value("fastrebalance_token_budget_warnings_total", base) == 1
        labels = {**base, "topic": topic, "partition": "0"}
        size = registry.get_sample_value("fastrebalance_token_bytes", labels)
        assert size is not None and 0.75 * budget < size <= budget
    finally:
        c.close()


def _free_port(family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ipv6_loopback() -> bool:
    try:
        _free_port(socket.AF_INET6, "::1")
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("address", "url_host"),
    [
        ("{port}", "127.0.0.1"),  # a port alone: loopback
        ("127.0.0.1:{port}", "127.0.0.1"),
        pytest.param("[::1]:{port}", "[::1]", marks=pytest.mark.skipif(
            not _ipv6_loopback(), reason="no IPv6 loopback on this host")),
    ],
)  # fmt: skip
def test_status_serves_the_group_s_metrics_over_http(
    kafka_cluster, topic_factory, unique_group, address: str, url_host: str
):
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    c = _catching_up(bs, unique_group, topic)
    try:
        got = drain(c, lambda ms: len(ms) >= 1000)
        c.commit(message=next(m for m in got if m.offset() == 1499), asynchronous=False)
    finally:
        c.close()
    v6 = url_host.startswith("[")
    port = _free_port(socket.AF_INET6, "::1") if v6 else _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastrebalance.tools.cli", "status", "-b", bs, "-g", unique_group,
         "--prometheus", address.format(port=port), "--interval", "0.5", "--count", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    want = f'fastrebalance_pending_records{{client_id="status",group="{unique_group}"'
    try:
        # it listens before its first read: a scrape before that has no group metrics yet
        deadline, body = time.monotonic() + 30, ""
        while want not in body:
            try:
                url = f"http://{url_host}:{port}/metrics"
                body = urllib.request.urlopen(url, timeout=2).read().decode()
            except OSError:
                pass
            assert time.monotonic() < deadline, proc.stderr.read() if proc.poll() else body
            time.sleep(0.2)
        line = next(x for x in body.splitlines() if x.startswith(want))
        assert float(line.split()[-1]) == 6000 - 1500
        assert "fastrebalance_committed_offset" in body and "fastrebalance_lag_records" in body
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"serving metrics on http://{url_host}:{port}/metrics" in out
