"""``fastrebalance demo``: a crash, a backlog, and two restarts compared side by side.

The story follows KIP-333's own example ("crash at 100, committed 70, end 120"): a
consumer committed at the start of a backlog and crashed; while it was down the log
grew and a producer keeps writing fresh records. We then restart the same group
twice, one run after the other so that the timings are comparable:

(a) a plain ``confluent_kafka.Consumer``, which must replay the whole backlog before
    it reaches a single fresh record;
(b) ``fastrebalance.Consumer`` with ``enable.parallel.rebalance=True``, whose primary
    starts at the log end while the child reads the backlog in parallel.

Both runs start from the same committed offsets: the crashed group's offsets are
copied into two fresh group ids, because a restarted consumer moves its group's
offsets and the second run would otherwise start where the first one ended.

Every record carries its produce time, so a record is *fresh* when it was produced
after the restart, and its latency is its delivery time minus its produce time. A
run ends once the backlog is delivered, ``tail_s`` seconds of steady fresh traffic
have followed, and every offset below the log end read at that point has been
delivered; whatever is still missing then (or at the run timeout) is *lost*. The
records, producers and that measuring loop live in ``_workload``, shared with
``fastrebalance bench``, so that the demo and the benchmark measure alike.

Thread ownership: the fresh producer's handle belongs to its own thread; every
other handle (cluster admin, watermark probe, the consumers) belongs to the thread
that calls ``run_demo()``.
"""

from __future__ import annotations

import argparse
import textwrap
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from .._config import DEFAULT_LAG_THRESHOLD
from .._consumer import Consumer as FastConsumer
from ..testing import EmbeddedKafka, ExternalKafka, KafkaCluster
from ..testing._workload import (
    REQUEST_TIMEOUT_S,
    VALUE_BYTES,
    FreshProducer,
    check_reachable,
    cleanup,
    partition_keys,
    produce_backlog,
    set_group_offsets,
    watermarks,
)
from . import _args as a
from ._runner import Out, quiet
from .workload import (
    BATCH,
    FETCH_WAIT_MS,
    SESSION_TIMEOUT_MS,
    RunResult,
    format_duration,
    measure_restart,
)

__all__ = ["DemoResult", "DemoSettings", "RunResult", "add_command", "format_results", "run_demo"]

#: Records the crashed consumer reads past its last commit before it dies.
_READ_BEFORE_CRASH = 1000
#: Printed lines wrap here; step details are indented under their step.
_WIDTH = 92
_INDENT = "      "


@dataclass(frozen=True)
class DemoSettings:
    """What to run. Defaults finish in about 20 s on the embedded cluster.

    Attributes:
        backlog: records produced before the restart, spread evenly over the partitions.
        partitions: partitions of the demo topic.
        rate: fresh records per second written during both runs.
        work_us: simulated busy work per delivered record, microseconds.
        bootstrap_servers: an existing cluster; None starts an embedded one.
        tail_s: seconds of fresh traffic each run keeps reading after its backlog is
            delivered, so both report steady-state latencies too.
        run_timeout_s: a run that has not delivered everything by then stops, and
            whatever it has not delivered counts as lost.
    """

    backlog: int = 200_000
    partitions: int = 4
    rate: float = 100.0
    work_us: float = 20.0
    bootstrap_servers: str | None = None
    tail_s: float = 2.0
    run_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backlog < 0:
            raise ValueError(f"backlog={self.backlog} is invalid: expected records >= 0")
        if self.partitions < 1:
            raise ValueError(f"partitions={self.partitions} is invalid: expected >= 1")
        if not self.rate > 0:
            raise ValueError(f"rate={self.rate} is invalid: expected records/s > 0")
        if self.work_us < 0 or self.tail_s < 0:
            raise ValueError("work_us and tail_s must be >= 0")
        if not self.run_timeout_s > 0:
            raise ValueError(f"run_timeout_s={self.run_timeout_s} is invalid: expected > 0")


@dataclass(frozen=True)
class DemoResult:
    """Everything ``run_demo()`` measured; ``lost`` is what the CLI's exit code checks."""

    settings: DemoSettings
    cluster: str
    topic: str
    crashed_group: str
    #: Records in the log after the backlog was produced, from the watermarks.
    log_backlog: int
    plain: RunResult
    fast: RunResult
    fresh_produced: int
    produce_failures: int
    wall_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def lost(self) -> int:
        return self.plain.lost + self.fast.lost

    @property
    def ok(self) -> bool:
        return self.lost == 0


# ------------------------------------------------------------------- groups
def _crash(
    bootstrap: str, topic: str, group: str, start: list[int], read: int
) -> tuple[list[int], int]:
    """A member of ``group`` commits ``start`` and reads ``read`` records, then dies.

    It dies without committing what it read, so those records are replayed: the
    at-least-once situation of the KIP. ``close()`` stands in for the crash; it is
    cheap and only ever leaves ``group``, whose offsets are copied elsewhere.

    Returns:
        The offsets ``group`` holds after the crash, and the records read uncommitted.
    """
    consumer = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
    )
    try:
        assigned: list[TopicPartition] = []
        consumer.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
        deadline = time.monotonic() + 30.0
        committed = False
        seen = 0
        while not committed or seen < read:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the crashing consumer got no partitions of {topic!r} within 30 s"
                    if not assigned
                    else f"the crashing consumer read only {seen} of {read} records in 30 s"
                )
            seen += sum(1 for m in consumer.consume(BATCH, 0.1) if m.error() is None)
            if assigned and not committed:
                offsets = [TopicPartition(topic, p, off) for p, off in enumerate(start)]
                consumer.commit(offsets=offsets, asynchronous=False)
                committed = True
        got = consumer.committed(
            [TopicPartition(topic, p) for p in range(len(start))], timeout=REQUEST_TIMEOUT_S
        )
        return [tp.offset for tp in sorted(got, key=lambda tp: tp.partition)], seen
    finally:
        consumer.close()


# ------------------------------------------------------------------ the demo
_BAR = 30  # progress bar width, characters


def run_demo(
    settings: DemoSettings | None = None,
    *,
    cluster: KafkaCluster | None = None,
    out: Out | None = print,
) -> DemoResult:
    """Run the whole story and return what was measured.

    Args:
        settings: what to run; ``DemoSettings()`` when None.
        cluster: a running cluster to use (tests pass their session cluster); when
            None, ``settings.bootstrap_servers`` names an existing one, or an
            embedded cluster is started and stopped around the demo.
        out: receives the story line by line; None prints nothing.

    Raises:
        RuntimeError, KafkaException: the cluster did not do what the demo needs
            (unreachable, a timeout); a lost record is *not* an error but ``lost``.
    """
    s = settings or DemoSettings()
    emit = out or quiet

    def say(text: str) -> None:
        indent = _INDENT if text.startswith("[") or text.startswith(_INDENT) else ""
        emit(textwrap.fill(text, _WIDTH, subsequent_indent=indent, break_on_hyphens=False))

    began = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    topic = f"fastrebalance-demo-{run_id}"
    group = f"fastrebalance-demo-{run_id}"
    notes: list[str] = []

    with ExitStack() as stack:
        steps = 7
        owns_external = cluster is None and bool(s.bootstrap_servers)
        if cluster is None:
            if s.bootstrap_servers:
                say(f"[1/{steps}] Using the Kafka cluster at {s.bootstrap_servers}")
                cluster = stack.enter_context(ExternalKafka(s.bootstrap_servers))
            else:
                say(f"[1/{steps}] Starting an embedded Kafka (librdkafka's mock cluster)...")
                embedded = stack.enter_context(EmbeddedKafka())
                cluster = embedded
                say(
                    f"{_INDENT}ready at {embedded.bootstrap_servers}"
                    f" in {embedded.startup_seconds:.1f} s"
                )
        else:
            say(
                f"[1/{steps}] Using the {cluster.kind} Kafka cluster at {cluster.bootstrap_servers}"
            )
        bootstrap = cluster.bootstrap_servers
        cluster_desc = f"{cluster.kind} cluster at {bootstrap}"

        check_reachable(bootstrap)
        cluster.create_topic(topic, s.partitions)
        say(f"[2/{steps}] Created topic {topic} with {s.partitions} partitions")

        # Closed (callback stack: last in, first out) before the cluster stops.
        probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-probe"})
        stack.callback(probe.close)

        t = time.monotonic()
        failures = produce_backlog(bootstrap, topic, s.partitions, s.backlog)
        marks = watermarks(probe, topic, s.partitions)
        low = [lo for lo, _hi in marks]
        log_backlog = sum(hi - lo for lo, hi in marks)
        say(
            f"[3/{steps}] Produced a backlog of {s.backlog:,} records ({VALUE_BYTES} bytes, lz4)"
            f" in {time.monotonic() - t:.1f} s; the log holds {log_backlog:,}:"
        )
        say(_INDENT + "  ".join(f"p{p} [{lo:,}, {hi:,})" for p, (lo, hi) in enumerate(marks)))
        if failures:
            notes.append(f"{failures:,} backlog records failed to produce")
        if log_backlog < s.backlog - failures:
            notes.append(
                f"retention kept {log_backlog:,} of {s.backlog:,} backlog records;"
                " the runs use what the log holds"
            )
        per_partition = log_backlog / s.partitions
        if per_partition <= DEFAULT_LAG_THRESHOLD:
            notes.append(
                f"~{per_partition:,.0f} records per partition is within"
                f" parallel.rebalance.lag.threshold ({DEFAULT_LAG_THRESHOLD}): no catch-up,"
                " both consumers replay the backlog alike"
            )

        t = time.monotonic()
        read = min(_READ_BEFORE_CRASH, log_backlog)
        committed, read = _crash(bootstrap, topic, group, low, read)
        say(
            f"[4/{steps}] A consumer in group {group} committed the start of the backlog"
            f" (offsets {', '.join(map(str, committed))}), read {read:,} records past it, then"
            f" crashed without committing them ({time.monotonic() - t:.1f} s)"
        )
        plain_group, fast_group = f"{group}-plain", f"{group}-fast"
        set_group_offsets(bootstrap, topic, plain_group, committed)
        set_group_offsets(bootstrap, topic, fast_group, committed)
        say(
            f"{_INDENT}its committed offsets copied to {plain_group} and {fast_group},"
            " so both restarts begin at the same backlog"
        )

        fresh = FreshProducer(bootstrap, partition_keys(topic, s.partitions), s.rate)
        fresh.start()
        stack.callback(fresh.stop)
        say(
            f"[5/{steps}] A producer keeps writing {s.rate:g} fresh records/s,"
            " each stamped with its produce time"
        )

        common: dict[str, Any] = {
            "bootstrap": bootstrap,
            "topic": topic,
            "start": committed,
            "probe": probe,
            "work_us": s.work_us,
            "tail_s": s.tail_s,
            "run_timeout_s": s.run_timeout_s,
        }
        say(
            f"[6/{steps}] Restart (a): plain confluent_kafka.Consumer in {plain_group};"
            f" every record costs {s.work_us:g} us of work"
        )
        plain = measure_restart("plain", PlainConsumer, group=plain_group, **common)
        say(_INDENT + _run_summary(plain))

        say(
            f"[7/{steps}] Restart (b): fastrebalance.Consumer(enable.parallel.rebalance=True)"
            f" in {fast_group}, same work"
        )

        def make_fast(conf: dict[str, Any]) -> FastConsumer:
            return FastConsumer({**conf, "enable.parallel.rebalance": True})

        def bar(elapsed: float, done: int, total: int, first_fresh: float | None) -> None:
            filled = _BAR * done // total if total else _BAR
            fresh_at = "waiting" if first_fresh is None else f"first after {first_fresh:.2f} s"
            emit(
                f"{_INDENT}{elapsed:5.1f} s  backlog [{'#' * filled}{'.' * (_BAR - filled)}]"
                f" {done:,}/{total:,}  fresh records: {fresh_at}"
            )

        fast = measure_restart("fastrebalance", make_fast, group=fast_group, progress=bar, **common)
        say(_INDENT + _run_summary(fast))

        fresh.stop()
        if fresh.error is not None:
            raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
        if fresh.failures:
            notes.append(f"{fresh.failures:,} fresh records failed to produce")
        if owns_external:
            cleanup(bootstrap, [topic], [group, plain_group, fast_group, f"{fast_group}.catchup"])

    return DemoResult(
        settings=s,
        cluster=cluster_desc,
        topic=topic,
        crashed_group=group,
        log_backlog=log_backlog,
        plain=plain,
        fast=fast,
        fresh_produced=fresh.sent,
        produce_failures=failures + fresh.failures,
        wall_s=time.monotonic() - began,
        notes=tuple(notes),
    )


# ----------------------------------------------------------------- printing
def _run_summary(r: RunResult) -> str:
    parts = [
        f"backlog {r.backlog:,}",
        f"joined after {format_duration(r.joined_s)}",
        f"first fresh record after {format_duration(r.first_fresh_s)}",
        f"backlog delivered after {format_duration(r.backlog_done_s)}",
    ]
    if r.child_alive is not None:
        parts.append(f"child consumer {'still alive' if r.child_alive else 'not alive'}")
    if r.timed_out:
        parts.append("TIMED OUT")
    return "; ".join(parts)


def _ratio(plain: float | None, fast: float | None) -> str:
    if plain is None or fast is None or plain <= 0 or fast <= 0:
        return "-"
    return f"{plain / fast:.1f}x" if plain / fast < 100 else f"{plain / fast:,.0f}x"


def format_results(result: DemoResult) -> str:
    """The side-by-side table, its legend, and the verdict line."""
    p, f = result.plain, result.fast
    d = format_duration
    rows: list[tuple[str, str, str, str]] = [
        ("", "plain", "fastrebalance", "plain/fast"),
        ("backlog at restart (records)", f"{p.backlog:,}", f"{f.backlog:,}", ""),
        ("joined the group after", d(p.joined_s), d(f.joined_s), ""),
    ]
    for label, name in (("time to first fresh record", "first_fresh_s"),
                        ("fresh latency p50", "fresh_p50_s"), ("fresh latency p99", "fresh_p99_s"),
                        ("backlog fully delivered after", "backlog_done_s")):  # fmt: skip
        plain, fast = getattr(p, name), getattr(f, name)
        rows.append((label, d(plain), d(fast), _ratio(plain, fast)))
    for label, name in (("fresh records delivered", "fresh_records"),
                        ("  of which behind newer ones", "fresh_out_of_order"),
                        ("records checked", "expected"), ("duplicates", "duplicates"),
                        ("lost", "lost")):  # fmt: skip
        rows.append((label, f"{getattr(p, name):,}", f"{getattr(f, name):,}", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0])] + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i]
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    s = result.settings
    legend = [
        "Times count from each restart (the consumer's creation). A fresh record was produced"
        " after the restart; its latency runs from produce to delivery."
        f" {s.work_us:g} us of work per record, {s.rate:g} fresh records/s,"
        f" {s.partitions} partitions, {result.cluster}.",
        "plain/fast above 1: fastrebalance was that many times faster.",
        "The second run's backlog also holds the fresh records written during the first.",
        "Fresh records behind newer ones were produced before fastrebalance read the log end,"
        " so they lie below where its primary starts and its child delivers them with the"
        " backlog; in short runs they set its p99.",
    ]
    legend += [f"note: {n}" for n in result.notes]
    for r in (p, f):
        if r.errors:
            legend.append(f"note: {r.label} saw errors: {'; '.join(r.errors)}")
        if r.timed_out:
            legend.append(f"note: {r.label} timed out after {s.run_timeout_s:g} s")
    lines.append("")
    lines += [
        textwrap.fill(text, _WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        for text in legend
    ]
    verdict = f"lost: {result.lost}" + (
        " (every record from the committed offsets to the log end was delivered at least"
        " once, in both runs)"
        if result.ok
        else " - CHECK FAILED: records were never delivered"
    )
    lines += [
        "",
        textwrap.fill(verdict, _WIDTH, subsequent_indent="  "),
        f"demo wall time: {result.wall_s:.1f} s",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    d = DemoSettings()
    p = a.command(
        commands,
        "demo",
        "crash a consumer, then compare a plain restart with a fastrebalance restart",
        (
            "Produce a backlog, let a consumer commit at its start and crash, keep a producer "
            "writing fresh timestamped records, then restart the group twice, one after the "
            "other: (a) a plain confluent_kafka.Consumer, (b) fastrebalance.Consumer with "
            "enable.parallel.rebalance=True.",
            "Prints, for each: time to the first fresh record (produced after the restart), "
            "fresh-record latency p50/p99, time until the backlog is delivered, duplicates, "
            "and lost records (exit code 1 if any).",
            "Runs on an embedded Kafka (librdkafka's mock cluster, no Docker needed) unless "
            "--bootstrap-servers names a cluster; the defaults take about 20 s.",
        ),
        """\
examples:
  fastrebalance demo
  fastrebalance demo --backlog 1000000 --partitions 8 --work-us 5
  fastrebalance demo --bootstrap-servers localhost:9092   # docker compose up -d --wait
""",
    )
    a.option(p, "--backlog", d.backlog, a.number(int, 0), "N",
             "records produced before the restart (default: {})")
    a.partitions(p, d.partitions, "partitions of the demo topic (default: {})")
    a.rate(p, d.rate, "fresh records per second during the restarts (default: {})")
    a.option(p, "--work-us", d.work_us, a.number(float, 0), "W",
             "simulated processing per record, microseconds (default: {})")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one (e.g. "
                        "localhost:9092); the demo topic and groups are deleted afterwards")
    a.option(p, "--tail", d.tail_s, a.number(float, 0), "SECONDS", "fresh traffic each "
             "restart keeps reading after its backlog is delivered (default: {})")
    a.timeout(p, d.run_timeout_s, "give up on a restart after this long; undelivered records "
              "count as lost (default: {})")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    settings = DemoSettings(
        backlog=args.backlog, partitions=args.partitions, rate=args.rate, work_us=args.work_us,
        bootstrap_servers=args.bootstrap_servers, tail_s=args.tail, run_timeout_s=args.timeout,
    )  # fmt: skip
    print("fastrebalance demo: KIP-333 faster rebalancing after a consumer crash\n", flush=True)
    result = run_demo(settings, out=lambda line: print(line, flush=True))
    print()
    print(format_results(result), flush=True)
    return a.EXIT_OK if result.ok else a.EXIT_CHECK_FAILED
