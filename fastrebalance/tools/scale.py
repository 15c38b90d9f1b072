"""``fastrebalance bench-scale``: what a restart costs at 1,000 partitions, side by side
with plain ``confluent_kafka.Consumer``.

Nothing else in the benchmarks goes beyond a few partitions and one member. Here a group
restarts over P partitions (one topic, or P/10 topics of 10), with 1 or N members (one
process each), and every partition has a small backlog: with fastrebalance every
partition gets a catch-up range, and the group's commit log already holds a range token
on every partition, written before the "crash" (the *seed*, below). Measured:

* join → first fresh record (a record produced after ``subscribe()``), per member;
* the plan inside the rebalance callback (``metrics_snapshot()["last_plan"]``);
* a synchronous ``commit()`` writing a token on every partition: time, metadata bytes,
  and the bytes sent to the group coordinator (librdkafka's statistics);
* memory per assigned, idle partition: resident set with P partitions against a run
  with a few, and (``tracemalloc``) the library's own Python structures;
* ``close()``;
* broker requests by type over the whole run (librdkafka's statistics, primary and
  child): the proof that nothing on the rebalance path makes a request per partition.

How a cell runs. The parent owns the cluster, the topics and a producer that writes
fresh timestamped records over every partition throughout. For each (layout, members)
it writes B records to every partition and gives two new groups (one per consumer) the
committed offsets ``log end - B``. The fastrebalance group is then *seeded*: an
``assign()``-only fastrebalance consumer plans every partition (each gets the range
``[log end - B, log end)``) and commits its start offsets synchronously, which stores
the safe offset and a range token on every partition, and exits without processing
anything (a crash). B more records per partition follow, so the restart plans a second
backlog on top of the token's. Then the members start (one process each, built, then
told to subscribe at the same moment), run until the group has settled and every member
saw a fresh record, and on ``finish`` each commits synchronously, idles, reports its
memory and request counts, and closes.

Thread ownership: each consumer handle belongs to the main thread of its worker
process; the fresh producer's handle to its own thread; every other handle to the
thread that calls ``run_scale()``. A worker's stdin reader thread touches no handle.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import queue
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException, TopicPartition

from ..testing._workload import (
    REQUEST_TIMEOUT_S,
    FreshProducer,
    Key,
    log_ends,
    produce_records,
    produce_time,
    store_offsets,
)
from . import _args as a
from ._runner import (
    FAST,
    PLAIN,
    Column,
    Out,
    Session,
    Worker,
    alternate,
    div,
    emit,
    machine_line,
    maximum,
    md_table,
    memory_kib,
    quiet,
    ratio,
    revive,
    run_worker,
    table,
    worker_main,
)
from .workload import FETCH_WAIT_MS, SESSION_TIMEOUT_MS, format_duration

__all__ = [
    "CellResult",
    "MemberResult",
    "ScaleResult",
    "ScaleSettings",
    "SeedResult",
    "add_command",
    "format_markdown",
    "per_partition_requests",
    "run_scale",
]

#: Targets from the issue, reported next to the measurements, never asserted here.
TARGET_PLAN_S = 1.0
TARGET_BYTES_PER_PARTITION = 2048
#: Requests that a client sends on a clock, not per partition: one Fetch carries every
#: partition led by its broker, a Heartbeat none. Every other type must not grow with P.
PERIODIC_REQUESTS = frozenset({"Fetch", "Heartbeat"})
#: librdkafka statistics interval of every measured consumer: often enough that a
#: document follows each phase within a second, rarely enough to cost little (each one
#: describes every partition; fastrebalance merges its own metrics into it).
STATS_INTERVAL_MS = 1000
#: Records asked per consume() call, as in the other benchmarks (workload.BATCH).
BATCH = 500
_WORKER_MODULE = "fastrebalance.tools.scale"
_LIB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class ScaleSettings:
    """What to run. The defaults take about 3 minutes on 2 cores (docs/benchmarks.md).

    Attributes:
        partitions: P, partitions of the group in every layout.
        layouts: topics per layout; P is spread evenly over them (1: one topic of P
            partitions; 100: 100 topics of P/100).
        members: group sizes; every member is its own process.
        backlog: B, records written to every partition before the crash and again
            after it: each restart has 2 B per partition to catch up.
        threshold: ``parallel.rebalance.lag.threshold``, below B so that every
            partition gets a catch-up range.
        rate: fresh records per second over all partitions, throughout.
        few: partitions of the memory baseline (one topic, one member).
        settle_s: the group counts as settled after this long with no assignment change.
        run_timeout_s: a cell still unsettled (or with a member that saw no fresh record)
            after this long fails.
        bootstrap_servers: an existing cluster; None starts an embedded one.
        memory: also run the memory cells (P and ``few`` partitions, one member, without
            statistics; again with tracemalloc). False: the timed cells only.
    """

    partitions: int = 1000
    layouts: tuple[int, ...] = (1, 100)
    members: tuple[int, ...] = (1, 4)
    backlog: int = 20
    threshold: int = 10
    rate: float = 200.0
    few: int = 10
    settle_s: float = 2.0
    run_timeout_s: float = 120.0
    bootstrap_servers: str | None = None
    memory: bool = True

    def __post_init__(self) -> None:
        if self.partitions < 1 or not self.layouts or not self.members:
            raise ValueError("partitions, layouts and members must be >= 1")
        bad = [t for t in self.layouts if t < 1 or self.partitions % t]
        if bad:
            raise ValueError(
                f"layouts={bad} do not divide partitions={self.partitions} into equal topics"
            )
        if any(m < 1 for m in self.members):
            raise ValueError(f"members={self.members} is invalid: expected >= 1")
        if not 0 <= self.threshold < self.backlog:
            raise ValueError(
                f"threshold={self.threshold} must be >= 0 and below backlog={self.backlog}: "
                "every partition must get a catch-up range"
            )
        if not 1 <= self.few < self.partitions:
            raise ValueError(f"few={self.few} must be >= 1 and below partitions")
        if not (self.rate > 0 and self.settle_s >= 0 and self.run_timeout_s > 0):
            raise ValueError("rate and run_timeout_s must be > 0, settle_s >= 0")


@dataclass(frozen=True)
class MemberResult:
    """One member process of one cell. Times in seconds from its ``subscribe()``.

    Attributes:
        assigned_s: the first ``poll()``/``consume()`` that served an assignment
            returned (fastrebalance: its plan included).
        settled_s: the last assignment change it saw returned.
        first_fresh_s: it delivered the first record produced after its subscribe().
        partitions: partitions in its final assignment.
        assignments: assignments it was given (each rebalance counts).
        plans: (partitions, seconds, read_seconds) of every plan, fastrebalance only.
        commit_s: its synchronous bare ``commit()`` at the end (what it handed out).
        commit_partitions: partitions that commit stored (its result list).
        commit_error: why that commit failed (e.g. nothing consumed), if it did.
        rss_kib: resident set once idle (every backlog delivered, then ~1 s of trickle).
        rss_trimmed_kib: the same after glibc's ``malloc_trim(0)`` handed freed heap
            back to the system (None without glibc): what is live, not what was freed.
        rss_base_kib: resident set after the consumer was built, before subscribe().
        traced_lib_bytes: with tracemalloc, Python memory allocated under the library's
            own frames (fastrebalance, tools excluded) and alive once idle.
        traced_all_bytes: with tracemalloc, all Python memory the process gained after
            the consumer was built.
        requests: broker requests by type over the whole run, the primary's (the
            consumer's own handle for plain).
        child_requests: the child's, as of its latest statistics (fastrebalance).
        close_s: ``close()``.
    """

    consumer: str
    assigned_s: float | None
    settled_s: float | None
    first_fresh_s: float | None
    partitions: int
    assignments: int
    plans: tuple[tuple[int, float, float], ...]
    commit_s: float | None
    commit_partitions: int
    commit_error: str | None
    rss_kib: int
    rss_base_kib: int
    traced_lib_bytes: int | None
    traced_all_bytes: int | None
    requests: dict[str, int]
    child_requests: dict[str, int]
    close_s: float
    delivered: int = 0
    rss_trimmed_kib: int | None = None


@dataclass(frozen=True)
class SeedResult:
    """The fastrebalance consumer that wrote a token on every partition before the crash.

    Attributes:
        plan_s, plan_read_s: its ``assign()`` of every partition (planning included).
        commit_s: the synchronous ``commit(offsets=...)`` of every partition.
        committed: partitions in that commit's result.
        tokens: partitions whose committed metadata decodes as a range token (read back
            by a plain consumer of the group).
        metadata_bytes: commit metadata over all partitions, as read back.
        coordinator_bytes: bytes sent to the group coordinator across the commit
            (librdkafka statistics; None if no document came in time).
    """

    plan_s: float
    plan_read_s: float
    commit_s: float
    committed: int
    tokens: int
    metadata_bytes: int
    coordinator_bytes: int | None
    requests: dict[str, int]


@dataclass(frozen=True)
class CellResult:
    """One (layout, members, consumer) restart."""

    topics: int
    partitions: int
    members: int
    consumer: str
    backlog: int  #: records between the committed offsets and the log end, at the go
    wall_s: float  #: from the go to the group settled and every member past a fresh record
    results: tuple[MemberResult, ...]
    seed: SeedResult | None = None
    #: "timed" (with librdkafka statistics, for the request counts), "memory" (no
    #: statistics: their documents describe every partition and would be counted as
    #: per-partition memory) or "traced" (no statistics, tracemalloc: slower)
    mode: str = "timed"


@dataclass(frozen=True)
class ScaleResult:
    settings: ScaleSettings
    cluster: str
    machine: dict[str, Any]
    cells: tuple[CellResult, ...]
    wall_s: float
    notes: tuple[str, ...] = field(default=())


# ----------------------------------------------------------------- requests
def _requests(stats: dict[str, Any] | None) -> dict[str, int]:
    """Requests sent, by type, summed over the brokers of one statistics document."""
    out: Counter[str] = Counter()
    for broker in (stats or {}).get("brokers", {}).values():
        for name, n in (broker.get("req") or {}).items():
            if n:
                out[name] += int(n)
    return dict(out)


def _coordinator_txbytes(stats: dict[str, Any] | None) -> int | None:
    for broker in (stats or {}).get("brokers", {}).values():
        if str(broker.get("name", "")).startswith("GroupCoordinator"):
            return int(broker.get("txbytes", 0))
    return None


def per_partition_requests(requests: dict[str, int], partitions: int) -> dict[str, int]:
    """Request types sent at least once per two partitions, apart from the periodic
    ones: on a rebalance path that batches its round trips this stays empty."""
    limit = max(partitions // 2, 2)
    return {k: v for k, v in requests.items() if k not in PERIODIC_REQUESTS and v >= limit}


# -------------------------------------------------------------------- worker
def _trimmed_rss_kib() -> int | None:
    """RSS after returning freed heap to the system: librdkafka's fetch buffers and the
    plan's temporary objects leave free pages in the heap that RSS still counts."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        return None
    return memory_kib()


def _lib_frame(filename: str) -> bool:
    return filename.startswith(_LIB_DIR) and not filename.startswith(_TOOLS_DIR)


def _traced(snapshot: Any, lib_only: bool) -> int:
    """Bytes alive in a tracemalloc snapshot: all of them, or those allocated with one
    of the library's own frames on the stack (what the consumer keeps, librdkafka's
    objects made for it included)."""
    if not lib_only:
        return int(sum(t.size for t in snapshot.traces))
    return int(
        sum(t.size for t in snapshot.traces if any(_lib_frame(f.filename) for f in t.traceback))
    )


class _Stats:
    """The latest librdkafka statistics document (the consumer's thread stores it from
    its stats_cb, served inside poll()/consume(); read by the same thread)."""

    def __init__(self) -> None:
        self.raw: str | None = None
        self.count = 0

    def __call__(self, stats: str) -> None:
        self.raw = stats
        self.count += 1

    def doc(self) -> dict[str, Any] | None:
        if self.raw is None:
            return None
        parsed: dict[str, Any] = json.loads(self.raw)
        return parsed


def _make(kind: str, spec: dict[str, Any], stats: _Stats) -> Any:
    conf: dict[str, Any] = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "auto.offset.reset": "earliest",
        **spec.get("conf", {}),
    }
    if spec.get("stats", True):
        conf["statistics.interval.ms"] = STATS_INTERVAL_MS
        conf["stats_cb"] = stats
    if kind == PLAIN:
        return PlainConsumer(conf)
    from .._consumer import Consumer as FastConsumer

    conf["enable.parallel.rebalance"] = True
    conf["parallel.rebalance.lag.threshold"] = spec["threshold"]
    return FastConsumer(conf)


def _wait_stats(consumer: Any, stats: _Stats, after: int, timeout: float = 3.0) -> None:
    """Serve the consumer until a statistics document newer than number ``after`` came."""
    deadline = time.monotonic() + timeout
    while stats.count <= after and time.monotonic() < deadline:
        consumer.poll(0.05)


def _worker_seed(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    """assign() every partition (each gets a range), store the start offsets with their
    tokens in one synchronous commit, exit without processing: the crash."""
    stats = _Stats()
    consumer = _make(FAST, {**spec, "conf": {"enable.auto.commit": False}}, stats)
    try:
        tps = [TopicPartition(t, p) for t, p in spec["partitions"]]
        consumer.assign(tps)
        plan = consumer.metrics_snapshot()["last_plan"]
        starts = []
        for key, status in consumer.catchup_status().items():
            # the primary's start: the end of the range the plan added
            starts.append(TopicPartition(key[0], key[1], status.pending_ranges[-1][1]))
        _wait_stats(consumer, stats, stats.count)
        before = _coordinator_txbytes(stats.doc())
        seen = stats.count
        began = time.monotonic()
        result = consumer.commit(offsets=starts, asynchronous=False)
        commit_s = time.monotonic() - began
        _wait_stats(consumer, stats, seen)
        after = _coordinator_txbytes(stats.doc())
        sent = after - before if before is not None and after is not None else None
        return {
            "plan_s": plan["seconds"],
            "plan_read_s": plan["read_seconds"],
            "planned": plan["partitions"],
            "with_range": len(starts),
            "commit_s": commit_s,
            "committed": len(result or ()),
            "coordinator_bytes": sent,
            "requests": _requests(stats.doc()),
        }
    finally:
        consumer.close()


def _worker_member(spec: dict[str, Any], commands: queue.Queue[str]) -> dict[str, Any]:
    import tracemalloc

    kind: str = spec["consumer"]
    traced = bool(spec.get("tracemalloc"))
    if traced:
        tracemalloc.start(32)
    stats = _Stats()
    consumer = _make(kind, spec, stats)
    gc.collect()
    rss_base = memory_kib()
    base_snapshot = tracemalloc.take_snapshot() if traced else None
    emit({"event": "ready"})
    if commands.get() != "go":
        raise RuntimeError("the parent went away before the go")
    changed: list[bool] = []
    assignments = 0

    def on_assign(_c: Any, _partitions: list[TopicPartition]) -> None:
        nonlocal assignments
        assignments += 1
        changed.append(True)

    def on_revoke(_c: Any, _partitions: list[TopicPartition]) -> None:
        changed.append(True)

    wall0 = time.time()
    t0 = time.monotonic()
    consumer.subscribe(spec["topics"], on_assign=on_assign, on_revoke=on_revoke)
    assigned_s = settled_s = first_fresh_s = None
    plans: list[tuple[int, float, float]] = []
    delivered = 0
    while True:
        msgs = consumer.consume(BATCH, 0.01)
        now = time.monotonic() - t0
        for m in msgs:
            if m.error() is not None:
                continue
            delivered += 1
            if first_fresh_s is None and produce_time(m.value()) >= wall0:
                first_fresh_s = now
                emit({"event": "fresh", "t": now})
        if changed:
            changed.clear()
            count = len(consumer.assignment())
            if count and assigned_s is None:
                assigned_s = now
            settled_s = now
            plan = None
            if kind == FAST:
                plan = consumer.metrics_snapshot().get("last_plan")
                if plan is not None and (not plans or plans[-1][1] != plan["seconds"]):
                    plans.append((plan["partitions"], plan["seconds"], plan["read_seconds"]))
            emit({"event": "assignment", "t": now, "partitions": count, "plan": plan})
        with contextlib.suppress(queue.Empty):
            command = commands.get_nowait()
            if command in ("finish", "eof"):
                break
    # Every backlog record delivered (the child back on standby), then the commit.
    deadline = time.monotonic() + 30.0
    while kind == FAST and time.monotonic() < deadline:
        if all(s.child_position is None for s in consumer.catchup_status().values()):
            break
        delivered += len(consumer.consume(BATCH, 0.01))
    commit_s = None
    commit_partitions = 0
    commit_error = None
    began = time.monotonic()
    try:
        result = consumer.commit(asynchronous=False)
        commit_s = time.monotonic() - began
        commit_partitions = len(result or ())
    except KafkaException as exc:
        commit_error = str(exc.args[0])
    # Idle: assigned, nothing left to catch up, a trickle of fresh records.
    idle_until = time.monotonic() + 1.0
    while time.monotonic() < idle_until:
        delivered += len(consumer.consume(BATCH, 0.05))
    if spec.get("stats", True):
        _wait_stats(consumer, stats, stats.count)
    doc = stats.doc()
    gc.collect()
    rss = memory_kib()
    trimmed = _trimmed_rss_kib()
    traced_lib = traced_all = None
    if traced and base_snapshot is not None:
        snap = tracemalloc.take_snapshot()
        traced_lib = _traced(snap, True) - _traced(base_snapshot, True)
        traced_all = _traced(snap, False) - _traced(base_snapshot, False)
        tracemalloc.stop()
    child = ((doc or {}).get("fastrebalance") or {}).get("child")
    partitions = len(consumer.assignment())
    began = time.monotonic()
    consumer.close()
    close_s = time.monotonic() - began
    return dataclasses.asdict(
        MemberResult(
            consumer=kind,
            assigned_s=assigned_s,
            settled_s=settled_s,
            first_fresh_s=first_fresh_s,
            partitions=partitions,
            assignments=assignments,
            plans=tuple(plans),
            commit_s=commit_s,
            commit_partitions=commit_partitions,
            commit_error=commit_error,
            rss_kib=rss,
            rss_base_kib=rss_base,
            traced_lib_bytes=traced_lib,
            traced_all_bytes=traced_all,
            requests=_requests(doc),
            child_requests=_requests(child),
            close_s=close_s,
            delivered=delivered,
            rss_trimmed_kib=trimmed,
        )
    )


# -------------------------------------------------------------------- parent
def _read_tokens(bootstrap: str, group: str, keys: Sequence[Key]) -> tuple[int, int]:
    """(partitions whose committed metadata is a valid range token, metadata bytes),
    read as any tool reads a group: a plain consumer's committed()."""
    from .._token import TokenError, decode_group_token

    reader = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = reader.committed([TopicPartition(*k) for k in keys], timeout=REQUEST_TIMEOUT_S)
    finally:
        reader.close()
    tokens = size = 0
    for tp in got:
        metadata = tp.metadata or ""
        size += len(metadata.encode("utf-8"))
        with contextlib.suppress(TokenError):
            if decode_group_token(metadata) is not None:
                tokens += 1
    return tokens, size


def _run_cell(
    bootstrap: str,
    s: ScaleSettings,
    *,
    consumer: str,
    topics: Sequence[str],
    keys: Sequence[Key],
    members: int,
    group: str,
    mode: str = "timed",
) -> tuple[float, tuple[MemberResult, ...]]:
    """Start the members, go, wait for the group to settle and for a fresh record at
    every member, then finish them all. Returns (wall seconds to that point, results)."""
    spec = {
        "kind": "member",
        "consumer": consumer,
        "bootstrap": bootstrap,
        "group": group,
        "topics": list(topics),
        "threshold": s.threshold,
        "stats": mode == "timed",
        "tracemalloc": mode == "traced",
    }
    workers: list[Worker] = []
    try:
        for _ in range(members):
            workers.append(Worker(_WORKER_MODULE, spec))
        for w in workers:
            w.wait_for("ready", 60.0)
        began = time.monotonic()
        for w in workers:
            w.send("go")
        assigned = [0] * members
        fresh = [False] * members
        last_change = time.monotonic()
        deadline = began + s.run_timeout_s
        while True:
            for i, w in enumerate(workers):
                while True:
                    event = w.next_event(0.0)
                    if event is None:
                        break
                    if event["event"] == "assignment":
                        assigned[i] = event["partitions"]
                        last_change = time.monotonic()
                    elif event["event"] == "fresh":
                        fresh[i] = True
            now = time.monotonic()
            settled = sum(assigned) == len(keys) and all(assigned)
            if settled and all(fresh) and now - last_change >= s.settle_s:
                break
            if now > deadline:
                raise RuntimeError(
                    f"{consumer}, {members} member(s), {len(topics)} topic(s): not settled "
                    f"after {s.run_timeout_s:g}s (assigned {assigned}, fresh {fresh})"
                )
            time.sleep(0.02)
        wall = time.monotonic() - began
        for w in workers:
            w.send("finish")
        results = []
        for w in workers:
            results.append(revive(MemberResult, w.wait_for("result", 120.0)["result"]))
        return wall, tuple(results)
    finally:
        for w in workers:
            w.close()


def _seed(bootstrap: str, group: str, keys: Sequence[Key]) -> SeedResult:
    spec = {"kind": "seed", "bootstrap": bootstrap, "group": group,
            "partitions": [list(k) for k in keys], "threshold": 0}  # fmt: skip
    got = run_worker(_WORKER_MODULE, spec, 120.0)
    if got["with_range"] != len(keys):
        raise RuntimeError(
            f"seed: {got['with_range']} of {len(keys)} partitions got a catch-up range"
        )
    tokens, size = _read_tokens(bootstrap, group, keys)
    return SeedResult(
        plan_s=got["plan_s"],
        plan_read_s=got["plan_read_s"],
        commit_s=got["commit_s"],
        committed=got["committed"],
        tokens=tokens,
        metadata_bytes=size,
        coordinator_bytes=got["coordinator_bytes"],
        requests=got["requests"],
    )


def run_scale(
    settings: ScaleSettings | None = None,
    *,
    cluster: Any = None,
    out: Out | None = print,
) -> ScaleResult:
    """Run every cell and return the measurements (arguments and errors: as
    ``bench.run_bench``'s, with ``ScaleSettings``)."""
    s = settings or ScaleSettings()
    emit = out or quiet
    cells: list[CellResult] = []
    with Session("scale", s.bootstrap_servers, cluster, emit) as session:
        bootstrap = session.bootstrap

        def prepare(keys: Sequence[Key], tag: str) -> tuple[dict[str, str], dict[Key, int]]:
            """B records everywhere, both groups at log end - B, the fastrebalance one
            seeded with a token on every partition, then B more records."""
            produce(keys)
            start = {k: e - s.backlog for k, e in log_ends(session.probe, keys).items()}
            groups = {PLAIN: session.group(f"{tag}-plain"), FAST: session.group(f"{tag}-fast")}
            for g in groups.values():
                store_offsets(bootstrap, g, start)
            seeds[tag] = _seed(bootstrap, groups[FAST], keys)
            produce(keys)
            return groups, start

        def produce(keys: Sequence[Key]) -> None:
            failed = produce_records(bootstrap, keys, s.backlog * len(keys))
            if failed:
                raise RuntimeError(f"backlog: {failed} of {s.backlog * len(keys)} records lost")

        seeds: dict[str, SeedResult] = {}
        turn = 0
        layouts = [(t, s.partitions // t, f"{t}t") for t in s.layouts]
        for topics_n, per_topic, label in [*layouts, *([(1, s.few, "few")] if s.memory else [])]:
            topics = [session.topic(f"-{label}-{i}", per_topic) for i in range(topics_n)]
            keys = [(t, p) for t in topics for p in range(per_topic)]
            fresh = FreshProducer(bootstrap, keys, s.rate)
            fresh.start()
            try:
                # the few-partition runs are the memory baseline only
                runs = [] if label == "few" else [(m, "timed") for m in s.members]
                if topics_n == 1 and s.memory:
                    runs += [(1, "memory"), (1, "traced")]
                for members, mode in runs:
                    tag = f"{label}-{members}m-{mode}"
                    groups, start = prepare(keys, tag)
                    for consumer in alternate((PLAIN, FAST), turn):
                        ends = log_ends(session.probe, keys)
                        backlog = sum(ends[k] - start[k] for k in keys)
                        wall, results = _run_cell(
                            bootstrap, s, consumer=consumer, topics=topics, keys=keys,
                            members=members, group=groups[consumer], mode=mode,
                        )  # fmt: skip
                        cell = CellResult(
                            topics=topics_n, partitions=len(keys), members=members,
                            consumer=consumer, backlog=backlog, wall_s=wall, results=results,
                            seed=seeds[tag] if consumer == FAST else None, mode=mode,
                        )  # fmt: skip
                        cells.append(cell)
                        emit(_cell_line(cell))
                    turn += 1
            finally:
                fresh.stop()
            if fresh.error is not None:
                raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
    return ScaleResult(
        settings=s,
        cluster=session.description,
        machine=session.machine(),
        cells=tuple(cells),
        wall_s=session.wall_s,
    )


# ------------------------------------------------------------------ printing
def _layout(cell: CellResult) -> str:
    if cell.topics == 1:
        return f"1 topic of {cell.partitions:,}"
    return f"{cell.topics} topics of {cell.partitions // cell.topics}"


def _slowest_plan(cell: CellResult) -> tuple[float | None, int]:
    plans = [p for r in cell.results for p in r.plans]
    if not plans:
        return None, 0
    worst = max(plans, key=lambda p: p[1])
    return worst[1], worst[0]


def _cell_line(cell: CellResult) -> str:
    d = format_duration
    plan, planned = _slowest_plan(cell)
    rs = cell.results
    line = (
        f"{_layout(cell)}, {cell.members} member(s), {cell.consumer}"
        f"{'' if cell.mode == 'timed' else f' ({cell.mode})'}: backlog {cell.backlog:,},"
        f" first fresh {d(maximum(r.first_fresh_s for r in rs))},"
        f" settled {d(maximum(r.settled_s for r in rs))}"
    )
    if plan is not None:
        line += f", plan {d(plan)} ({planned:,} partitions)"
    line += (
        f", commit {d(maximum(r.commit_s for r in rs))}, close {d(maximum(r.close_s for r in rs))},"
        f" RSS {maximum(r.rss_kib for r in rs) or 0:,.0f} KiB"
    )
    if cell.seed is not None:
        line += (
            f"; seed: {cell.seed.tokens:,} tokens, {cell.seed.metadata_bytes:,} metadata bytes,"
            f" commit {d(cell.seed.commit_s)}"
        )
    return line


def _timed(result: ScaleResult) -> list[CellResult]:
    return [c for c in result.cells if c.mode == "timed"]


def _pair(result: ScaleResult, cell: CellResult, consumer: str) -> CellResult | None:
    return next(
        (
            c
            for c in _timed(result)
            if (c.topics, c.partitions, c.members, c.consumer)
            == (cell.topics, cell.partitions, cell.members, consumer)
        ),
        None,
    )


def _slowest(cell: CellResult | None, name: str) -> float | None:
    """A member time of a cell: its slowest member's (the group's)."""
    return maximum(getattr(r, name) for r in cell.results) if cell else None


def _restart_table(result: ScaleResult) -> list[str]:
    d = format_duration

    def vs_plain(cell: CellResult, name: str) -> str:
        plain = _pair(result, cell, PLAIN) if cell.consumer == FAST else None
        return ratio(div(_slowest(cell, name), _slowest(plain, name)))

    def plan(cell: CellResult) -> str:
        seconds, planned = _slowest_plan(cell)
        return f"{d(seconds)} ({planned:,})" if seconds is not None else "-"

    def reads(cell: CellResult) -> str:
        got = maximum(p[2] for r in cell.results for p in r.plans)
        return d(got) if got is not None else "-"

    columns: list[Column[CellResult]] = [
        ("layout", _layout),
        ("members", lambda c: str(c.members)),
        ("consumer", lambda c: c.consumer),
        ("backlog at restart", lambda c: f"{c.backlog:,}"),
        ("assigned", lambda c: d(_slowest(c, "assigned_s"))),
        ("settled", lambda c: d(_slowest(c, "settled_s"))),
        ("first fresh", lambda c: d(_slowest(c, "first_fresh_s"))),
        ("plan (partitions)", plan),
        ("plan: round trips", reads),
        ("commit()", lambda c: d(_slowest(c, "commit_s"))),
        ("close()", lambda c: d(_slowest(c, "close_s"))),
        ("first fresh ÷ plain", lambda c: vs_plain(c, "first_fresh_s")),
        ("close() ÷ plain", lambda c: vs_plain(c, "close_s")),
    ]
    cells = [c for c in _timed(result) if c.partitions != result.settings.few]
    return table(columns, cells, left=3)


def _token_table(result: ScaleResult) -> list[str]:
    """One row per layout: its one-member fastrebalance cell's seed."""
    d = format_duration

    def _plain(cell: CellResult) -> CellResult | None:
        return _pair(result, cell, PLAIN)

    def _bytes(n: int | None) -> str:
        return "-" if n is None else f"{n:,} B"

    columns: list[Column[tuple[CellResult, SeedResult]]] = [
        ("layout", lambda cs: _layout(cs[0])),
        ("partitions", lambda cs: f"{cs[0].partitions:,}"),
        ("plan of assign()", lambda cs: d(cs[1].plan_s)),
        ("commit() sync", lambda cs: d(cs[1].commit_s)),
        ("tokens stored", lambda cs: f"{cs[1].tokens:,}"),
        ("metadata bytes", lambda cs: f"{cs[1].metadata_bytes:,}"),
        ("per partition", lambda cs: f"{cs[1].metadata_bytes / cs[0].partitions:.1f} B"),
        ("sent to the coordinator", lambda cs: _bytes(cs[1].coordinator_bytes)),
        ("plain commit() sync (no metadata)", lambda cs: d(_slowest(_plain(cs[0]), "commit_s"))),
    ]
    seeded: dict[int, tuple[CellResult, SeedResult]] = {}
    for c in _timed(result):
        if c.seed is not None and c.partitions != result.settings.few and c.members == 1:
            seeded.setdefault(c.topics, (c, c.seed))
    return table(columns, seeded.values())


def memory_per_partition(result: ScaleResult) -> dict[str, dict[str, float | None]]:
    """Per consumer: RSS KiB and traced bytes per assigned idle partition, each the
    difference between the one-topic P-partition run and the few-partition run, one
    member, divided by the difference in partitions."""
    s = result.settings
    out: dict[str, dict[str, float | None]] = {}
    for consumer in (PLAIN, FAST):

        def one(partitions: int, mode: str, consumer: str = consumer) -> MemberResult | None:
            for c in result.cells:
                if (c.consumer, c.partitions, c.members, c.topics, c.mode) == (
                    consumer, partitions, 1, 1, mode
                ):
                    return c.results[0]
            return None

        big, small = one(s.partitions, "memory"), one(s.few, "memory")
        tbig, tsmall = one(s.partitions, "traced"), one(s.few, "traced")
        n = s.partitions - s.few
        trimmed = None
        if big and small and big.rss_trimmed_kib is not None and small.rss_trimmed_kib:
            trimmed = (big.rss_trimmed_kib - small.rss_trimmed_kib) / n
        entry: dict[str, float | None] = {
            "rss_kib_big": big.rss_kib if big else None,
            "rss_kib_few": small.rss_kib if small else None,
            "rss_kib_per_partition": (big.rss_kib - small.rss_kib) / n if big and small else None,
            "rss_trimmed_kib_per_partition": trimmed,
            "traced_lib_per_partition": None,
            "traced_all_per_partition": None,
        }
        for name in ("traced_lib", "traced_all"):
            got_big = getattr(tbig, f"{name}_bytes", None)
            got_small = getattr(tsmall, f"{name}_bytes", None)
            if got_big is not None and got_small is not None:
                entry[f"{name}_per_partition"] = (got_big - got_small) / n
        out[consumer] = entry
    return out


def _memory_table(result: ScaleResult) -> list[str]:
    s = result.settings
    mem = memory_per_partition(result)
    header = ["consumer", f"RSS, {s.partitions:,} partitions", f"RSS, {s.few}",
              "RSS per partition", "after malloc_trim", "traced, library frames, per partition",
              "traced, whole process, per partition"]  # fmt: skip
    rows = []
    for consumer in (PLAIN, FAST):
        m = mem[consumer]

        def kib(v: float | None) -> str:
            return f"{v:,.0f} KiB" if v is not None else "-"

        def per(v: float | None, unit: str = "B") -> str:
            if v is None:
                return "-"
            return f"{v:,.2f} {unit}" if unit == "KiB" else f"{v:,.0f} {unit}"

        rows.append(
            [
                consumer,
                kib(m["rss_kib_big"]),
                kib(m["rss_kib_few"]),
                per(m["rss_kib_per_partition"], "KiB"),
                per(m["rss_trimmed_kib_per_partition"], "KiB"),
                per(m["traced_lib_per_partition"]) if consumer == FAST else "- (none in Python)",
                per(m["traced_all_per_partition"]),
            ]
        )
    plain_rss, fast_rss = mem[PLAIN]["rss_kib_per_partition"], mem[FAST]["rss_kib_per_partition"]
    plain_trim = mem[PLAIN]["rss_trimmed_kib_per_partition"]
    fast_trim = mem[FAST]["rss_trimmed_kib_per_partition"]
    rows.append(["fastrebalance ÷ plain", "", "", ratio(div(fast_rss, plain_rss)),
                 ratio(div(fast_trim, plain_trim)), "", ""])  # fmt: skip
    return md_table(header, rows)


def _request_table(result: ScaleResult) -> list[str]:
    header = ["layout", "members", "consumer", "handle", "requests by type (whole run)",
              "per-partition types"]  # fmt: skip
    rows = []
    for cell in _timed(result):
        if cell.partitions == result.settings.few:
            continue
        for handle, pick in (("primary", "requests"), ("child", "child_requests")):
            if handle == "child" and cell.consumer == PLAIN:
                continue
            total: Counter[str] = Counter()
            for r in cell.results:
                total.update(getattr(r, pick))
            per_member = cell.partitions // cell.members
            flagged = set()
            for r in cell.results:
                flagged |= set(per_partition_requests(getattr(r, pick), max(r.partitions, 1)))
            shown = ", ".join(f"{k} {v:,}" for k, v in sorted(total.items()))
            rows.append(
                [
                    _layout(cell),
                    str(cell.members),
                    cell.consumer,
                    handle if cell.consumer == FAST else "consumer",
                    shown or "-",
                    ", ".join(sorted(flagged)) or f"none (≈{per_member:,} per member)",
                ]
            )
    return md_table(header, rows, left=4)


def targets(result: ScaleResult) -> dict[str, tuple[bool | None, str]]:
    """The issue's targets: met or not, and the number that decides."""
    s = result.settings
    plans = [
        p[1] for c in _timed(result) if c.partitions == s.partitions for r in c.results
        for p in r.plans if p[0] >= s.partitions
    ]  # fmt: skip
    plans += [c.seed.plan_s for c in _timed(result) if c.seed and c.partitions == s.partitions]
    worst = max(plans) if plans else None
    flagged = {
        f"{_layout(c)} {c.members}m {c.consumer}": sorted(
            set(per_partition_requests(r.requests, max(r.partitions, 1)))
            | set(per_partition_requests(r.child_requests, max(r.partitions, 1)))
        )
        for c in _timed(result)
        if c.consumer == FAST and c.partitions == s.partitions
        for r in c.results
    }
    bad = {k: v for k, v in flagged.items() if v}
    traced = memory_per_partition(result)[FAST]["traced_lib_per_partition"]
    return {
        f"plan of {s.partitions:,} partitions < {TARGET_PLAN_S:g} s": (
            None if worst is None else worst < TARGET_PLAN_S,
            f"worst {format_duration(worst)}",
        ),
        "no per-partition broker requests": (
            not bad if flagged else None,
            "none" if not bad else "; ".join(f"{k}: {', '.join(v)}" for k, v in bad.items()),
        ),
        f"memory per idle partition < {TARGET_BYTES_PER_PARTITION / 1024:g} KiB": (
            None if traced is None else traced < TARGET_BYTES_PER_PARTITION,
            "-" if traced is None else f"{traced:,.0f} B (library's own structures)",
        ),
    }


def format_markdown(result: ScaleResult, command: str | None = None) -> str:
    """The tables, their targets and a legend, as Markdown."""
    s = result.settings
    lines: list[str] = []
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [
        machine_line(result.machine, result.cluster) + f" Wall time {result.wall_s / 60:.1f} min.",
        "",
        f"### Restart: {s.partitions:,} partitions, {2 * s.backlog} backlog records on every"
        f" partition, {s.rate:g} fresh records/s",
        "",
    ]
    lines += _restart_table(result)
    lines += ["", "### A range token on every partition: one synchronous commit", ""]
    lines += _token_table(result)
    lines += ["", "### Memory per assigned, idle partition (one member)", ""]
    lines += _memory_table(result)
    lines += ["", "### Broker requests (librdkafka statistics)", ""]
    lines += _request_table(result)
    lines += [
        "",
        "Every column: docs/benchmarks.md, Scale (what each time, byte count and memory"
        " figure is, and how it is measured).",
        "",
        "### Targets",
        "",
    ]
    rows = [
        [name, {True: "✓ met", False: "✗ missed", None: "-"}[ok], why]
        for name, (ok, why) in targets(result).items()
    ]
    lines += md_table(["target", "", "measured"], rows)
    for note in result.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines).rstrip() + "\n"



# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    d = ScaleSettings()
    p = a.command(
        commands,
        "bench-scale",
        "benchmark a restart at 1,000 partitions (planning, commit size, memory, "
        "requests) against plain confluent-kafka",
        (
            "A group restarts over P partitions (one topic, or P/T topics each), with 1 or "
            "N members (one process each), and every partition has a small backlog: with "
            "fastrebalance every partition gets a catch-up range, and the group already "
            "holds a range token on every partition (written by an assign()-only "
            "fastrebalance consumer before the restart). A producer writes fresh records "
            "over every partition throughout.",
            "Measured for plain confluent_kafka.Consumer and fastrebalance.Consumer "
            "(enable.parallel.rebalance=True): join to first fresh record, the plan inside "
            "the rebalance callback, a synchronous commit of a token on every partition "
            "(time, metadata bytes, bytes sent), memory per assigned idle partition (RSS, "
            "and tracemalloc of the library's own structures), close(), and broker requests "
            "by type (librdkafka statistics), to show that nothing is asked per partition.",
            "Exit code 1 if a member sent some request type once per partition or the "
            "token was not stored on every partition; the timing and memory targets are "
            "reported, not enforced. Runs on an embedded Kafka unless --bootstrap-servers "
            "names a cluster.",
        ),
        """\
examples:
  fastrebalance bench-scale                             # 1,000 partitions, ~4 min on 2 cores
  fastrebalance bench-scale --partitions 100 --layouts 1 --members 1   # seconds
  fastrebalance bench-scale --bootstrap-servers localhost:9092 --markdown scale.md
""",
    )
    a.partitions(p, d.partitions, "partitions of the group in every layout (default: {})", 2)
    a.option(p, "--layouts", d.layouts, a.number_list(int, 1), "T,...",
             "topics to spread the partitions over, one run each; must divide P (default: {})")
    a.option(p, "--members", d.members, a.number_list(int, 1), "N,...",
             "group sizes, one process per member (default: {})")
    a.option(p, "--backlog", d.backlog, a.number(int, 1), "B", "records written to every "
             "partition before the crash, and again after it (default: {})")
    a.threshold(p, d.threshold, "parallel.rebalance.lag.threshold, below B (default: {})")
    a.rate(p, d.rate, "fresh records per second over all partitions (default: {})")
    a.option(p, "--few", d.few, a.number(int, 1), "N",
             "partitions of the memory baseline run (default: {})")
    a.option(p, "--settle", d.settle_s, a.number(float, 0), "SECONDS", "the group counts as "
             "settled after this long without an assignment change (default: {})")
    a.timeout(p, d.run_timeout_s,
              "give up on a run that has not settled after this long (default: {})")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one; the benchmark "
                        "topics and groups are deleted afterwards")
    a.report_files(p)
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    try:
        settings = ScaleSettings(
            partitions=args.partitions, layouts=args.layouts, members=args.members,
            backlog=args.backlog, threshold=args.threshold, rate=args.rate, few=args.few,
            settle_s=args.settle, run_timeout_s=args.timeout,
            bootstrap_servers=args.bootstrap_servers,
        )  # fmt: skip
    except ValueError as exc:
        print(f"fastrebalance bench-scale: error: {exc}", file=sys.stderr)
        return a.EXIT_USAGE
    # The exact command, every option spelled out, so the tables can be reproduced.
    options = ("partitions", "layouts", "members", "backlog", "threshold", "rate", "few",
               "settle", "bootstrap_servers")  # fmt: skip
    command = " ".join(["fastrebalance bench-scale", *a.spelled(args, options)])
    print(f"fastrebalance bench-scale: {command}\n", flush=True)
    result = run_scale(settings, out=lambda line: print(line, flush=True))
    a.write_report(args, format_markdown(result, command), result)
    requests_ok = targets(result)["no per-partition broker requests"][0] is not False
    tokens_ok = all(c.seed.tokens == c.partitions for c in result.cells if c.seed is not None)
    return a.EXIT_OK if requests_ok and tokens_ok else a.EXIT_CHECK_FAILED


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(worker_main({"seed": _worker_seed, "member": _worker_member}))
