"""Catch-up metrics for Prometheus and OpenTelemetry (optional extras).

::

    pip install 'fastrebalance[prometheus]'      # PrometheusCollector
    pip install 'fastrebalance[otel]'            # OpenTelemetryMetrics

Both read ``Consumer.metrics_snapshot()``: the consumer's own thread publishes it at
every commit and rebalance and every second of a catch-up, and an exporter's thread
(a Prometheus scrape, an OpenTelemetry reader) only reads it, so nothing here touches
the consumer's librdkafka handles from another thread. ``fastrebalance status
--prometheus PORT`` serves the metrics a group's commit logs show, from outside the
application (``status_metrics``).

Every metric carries ``group`` and ``client_id`` labels, so several consumers of one
process can be told apart (give each a ``client.id``); partition metrics also carry
``topic`` and ``partition``. Names follow Prometheus conventions (``_total`` counters,
base units: records, bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "METRICS",
    "STATUS_METRICS",
    "Metric",
    "OpenTelemetryMetrics",
    "PrometheusCollector",
    "StatusCollector",
    "samples",
    "status_samples",
]

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Metric:
    """One metric: its Prometheus name (without the ``_total`` of counters for the
    OpenTelemetry name), its kind, unit and meaning."""

    name: str
    kind: Kind
    unit: str
    help: str
    per_partition: bool = False


#: Every metric, in the order of the docs' table (docs/operations.md, "Metrics").
METRICS: tuple[Metric, ...] = (
    Metric("fastrebalance_pending_records", "gauge", "records",
           "Backlog records not yet committed as processed", True),
    Metric("fastrebalance_pending_ranges", "gauge", "ranges",
           "Backlog ranges not yet committed as processed", True),
    Metric("fastrebalance_child_position", "gauge", "offset",
           "Next offset the child reads (absent when it is not reading the partition)", True),
    Metric("fastrebalance_token_bytes", "gauge", "bytes",
           "Size of the range token in the group's commit metadata", True),
    Metric("fastrebalance_token_budget_bytes", "gauge", "bytes",
           "parallel.rebalance.metadata.max.bytes: past it, ranges are coalesced"),
    Metric("fastrebalance_child_alive", "gauge", "",
           "1 while the child consumer runs (reading or on standby)"),
    Metric("fastrebalance_records_delivered_total", "counter", "records",
           "Records handed to the application, by stream (primary: as of the last "
           "commit or rebalance)"),
    Metric("fastrebalance_catchups_started_total", "counter", "catch-ups",
           "Partitions whose backlog the child started reading"),
    Metric("fastrebalance_catchups_finished_total", "counter", "catch-ups",
           "Partitions whose backlog the child finished reading"),
    Metric("fastrebalance_coalescings_total", "counter", "coalescings",
           "Tokens whose ranges were merged to fit the metadata budget"),
    Metric("fastrebalance_token_budget_warnings_total", "counter", "warnings",
           "Tokens that passed 75% of the metadata budget (a WARNING log each)"),
    Metric("fastrebalance_commit_failures_total", "counter", "commits",
           "Commits that failed, by log (group: the user's group; catchup: the child's)"),
    Metric("fastrebalance_plan_seconds", "gauge", "seconds",
           "Time the last assignment's plan took inside the rebalance callback "
           "(its broker round trips included)"),
    Metric("fastrebalance_plan_partitions", "gauge", "partitions",
           "Partitions the last assignment's plan covered"),
    Metric("fastrebalance_group_chunks_held", "gauge", "chunks",
           "Group-wide catch-up: chunks held, by holder member id, as this member's claims "
           "log says", True),
    Metric("fastrebalance_group_chunks_done_total", "counter", "chunks",
           "Group-wide catch-up: chunks this member read, committed and declared done"),
    Metric("fastrebalance_dead_members_total", "counter", "members",
           "Dead members of the group (their process gone from this host) handled at "
           "subscribe(), by result: removed, gone (already out of the group), replaced "
           "(a static member the broker hands over itself), failed (the old wait)"),
    Metric("fastrebalance_group_catchup_unusable", "gauge", "",
           "Group-wide catch-up: 1 once this member gave it up because its claims topic "
           "cannot be used (its backlogs are then read by its own catch-up consumer)"),
)  # fmt: skip

#: (metric name, labels, value)
Sample = tuple[str, dict[str, str], float]


def samples(snapshot: dict[str, Any]) -> list[Sample]:
    """The metrics of one ``Consumer.metrics_snapshot()`` (empty with the mode off)."""
    if not snapshot:
        return []
    base = {"group": str(snapshot["group_id"]), "client_id": str(snapshot["client_id"])}
    out: list[Sample] = []
    for (topic, partition), p in sorted(snapshot["partitions"].items()):
        labels = {**base, "topic": topic, "partition": str(partition)}
        out.append(("fastrebalance_pending_records", labels, p["pending_records"]))
        out.append(("fastrebalance_pending_ranges", labels, p["pending_ranges"]))
        if p["child_position"] is not None:
            out.append(("fastrebalance_child_position", labels, p["child_position"]))
        out.append(("fastrebalance_token_bytes", labels, p["token_bytes"]))
    out.append(("fastrebalance_token_budget_bytes", base, snapshot["token_budget_bytes"]))
    out.append(("fastrebalance_child_alive", base, 1.0 if snapshot["child_alive"] else 0.0))
    for stream, n in snapshot["records_delivered"].items():
        out.append(("fastrebalance_records_delivered_total", {**base, "stream": stream}, n))
    out.append(("fastrebalance_catchups_started_total", base, snapshot["catchups_started"]))
    out.append(("fastrebalance_catchups_finished_total", base, snapshot["catchups_finished"]))
    out.append(("fastrebalance_coalescings_total", base, snapshot["coalescings"]))
    out.append(
        ("fastrebalance_token_budget_warnings_total", base, snapshot["token_budget_warnings"])
    )
    for log_name, n in snapshot["commit_failures"].items():
        out.append(("fastrebalance_commit_failures_total", {**base, "log": log_name}, n))
    plan = snapshot.get("last_plan")
    if plan is not None:
        out.append(("fastrebalance_plan_seconds", base, plan["seconds"]))
        out.append(("fastrebalance_plan_partitions", base, plan["partitions"]))
    group = snapshot.get("group")
    if group is not None:
        for h in group["holders"]:
            labels = {**base, "topic": h["topic"], "partition": str(h["partition"])}
            labels["holder"] = h["holder"]
            out.append(("fastrebalance_group_chunks_held", labels, h["chunks"]))
        out.append(("fastrebalance_group_chunks_done_total", base, group["chunks_done"]))
        unusable = 1.0 if group.get("unusable") else 0.0
        out.append(("fastrebalance_group_catchup_unusable", base, unusable))
    dead = snapshot.get("dead_members")
    if dead is not None:
        for result in ("removed", "gone", "replaced", "failed"):
            labels = {**base, "result": result}
            out.append(("fastrebalance_dead_members_total", labels, dead.get(result, 0)))
    return out


def _families(found: Iterable[Sample]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    grouped: dict[str, list[Sample]] = {}
    for sample in found:
        grouped.setdefault(sample[0], []).append(sample)
    for metric in METRICS:
        rows = grouped.get(metric.name)
        if not rows:
            continue
        labels = sorted(rows[0][1])
        if metric.kind == "counter":
            family: Any = CounterMetricFamily(
                metric.name.removesuffix("_total"), metric.help, labels=labels
            )
        else:
            family = GaugeMetricFamily(metric.name, metric.help, labels=labels)
        for _, values, value in rows:
            family.add_metric([values[k] for k in labels], value)
        yield family


class PrometheusCollector:
    """A ``prometheus_client`` collector of one consumer's catch-up metrics.

    Example::

        from prometheus_client import REGISTRY, start_http_server
        from fastrebalance.metrics import PrometheusCollector

        REGISTRY.register(PrometheusCollector(consumer))
        start_http_server(9100, addr="127.0.0.1")  # its default: every interface

    Args:
        consumer: a ``fastrebalance.Consumer`` (or ``fastrebalance.aio.AIOConsumer``).
    """

    def __init__(self, consumer: Any) -> None:
        self._snapshot = _snapshot_of(consumer)

    def collect(self) -> Iterator[Any]:
        yield from _families(samples(self._snapshot()))

    def describe(self) -> list[Any]:
        # No names declared up front: several consumers' collectors (told apart by their
        # labels) may then share one registry.
        return []


class OpenTelemetryMetrics:
    """The same instruments through the OpenTelemetry metrics API: observable gauges and
    counters read at each collection by the application's own metric reader/exporter.

    Example::

        from opentelemetry import metrics
        from fastrebalance.metrics import OpenTelemetryMetrics

        OpenTelemetryMetrics(consumer)  # uses the global MeterProvider

    Args:
        consumer: a ``fastrebalance.Consumer`` (or ``fastrebalance.aio.AIOConsumer``).
        meter_provider: the provider to take the meter from (default: the global one).
    """

    def __init__(self, consumer: Any, meter_provider: Any = None) -> None:
        from opentelemetry import metrics

        provider = meter_provider or metrics.get_meter_provider()
        from . import __version__

        self._snapshot = _snapshot_of(consumer)
        meter = provider.get_meter("fastrebalance", __version__)
        self.instruments = []
        for metric in METRICS:
            name = metric.name.removesuffix("_total")
            create = (
                meter.create_observable_counter
                if metric.kind == "counter"
                else meter.create_observable_gauge
            )
            unit = metric.unit if metric.unit in ("bytes", "") else f"{{{metric.unit}}}"
            self.instruments.append(
                create(
                    name,
                    callbacks=[self._callback(metric.name)],
                    unit={"bytes": "By", "{seconds}": "s"}.get(unit, unit),
                    description=metric.help,
                )
            )

    def _callback(self, name: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Any]:
            return [
                Observation(value, labels)
                for metric, labels, value in samples(self._snapshot())
                if metric == name
            ]

        return observe


def _snapshot_of(consumer: Any) -> Callable[[], dict[str, Any]]:
    inner = getattr(consumer, "_consumer", consumer)  # an AIOConsumer holds the Consumer
    snapshot: Callable[[], dict[str, Any]] = inner.metrics_snapshot
    return snapshot


def status_samples(status: Any) -> list[Sample]:
    """What ``fastrebalance status`` reads from outside the application, as metrics:
    the same pending records and ranges, the token size, and the offsets and lags the
    group's commit logs show (``status.GroupStatus``)."""
    base = {"group": status.group, "client_id": "status"}
    out: list[Sample] = []
    for p in status.partitions:
        labels = {**base, "topic": p.topic, "partition": str(p.partition)}
        out.append(("fastrebalance_pending_records", labels, p.pending))
        out.append(("fastrebalance_pending_ranges", labels, len(p.ranges)))
        if p.committed is not None:
            out.append(("fastrebalance_committed_offset", labels, p.committed))
        if p.lag is not None:
            out.append(("fastrebalance_lag_records", labels, p.lag))
        if p.tool_lag is not None:
            out.append(("fastrebalance_tool_lag_records", labels, p.tool_lag))
        if p.checkpoint is not None:
            out.append(("fastrebalance_child_checkpoint", labels, p.checkpoint.offset))
        out.append(("fastrebalance_token_bytes", labels, p.token_bytes))
    return out


#: The metrics only ``status`` has (it sees the logs, not a running consumer).
STATUS_METRICS: tuple[Metric, ...] = (
    Metric("fastrebalance_committed_offset", "gauge", "offset",
           "The offset Kafka stores for the group: the safe offset", True),
    Metric("fastrebalance_lag_records", "gauge", "records",
           "Records not yet processed: the primary's lag plus the pending backlog", True),
    Metric("fastrebalance_tool_lag_records", "gauge", "records",
           "What lag monitors report: log end minus the stored offset", True),
    Metric("fastrebalance_child_checkpoint", "gauge", "offset",
           "The child's latest checkpoint in the catch-up group's log", True),
)  # fmt: skip


class StatusCollector:
    """A collector that reads the group's logs at each scrape (``status --prometheus``).

    ``read`` is called on the scrape's thread: it must own what it uses (a
    ``StatusReader`` of its own)."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        found = status_samples(self._read())
        for metric in (*METRICS, *STATUS_METRICS):
            rows = [s for s in found if s[0] == metric.name]
            if not rows:
                continue
            labels = sorted(rows[0][1])
            family = GaugeMetricFamily(metric.name, metric.help, labels=labels)
            for _, values, value in rows:
                family.add_metric([values[k] for k in labels], value)
            yield family

    def describe(self) -> list[Any]:
        return []
