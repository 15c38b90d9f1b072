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

import contextlib
import dataclasses
import gc
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any

from confluent_kafka import (
    OFFSET_END,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka.admin import AdminClient

from .workload import (
    FETCH_WAIT_MS,
    REQUEST_TIMEOUT_S,
    SESSION_TIMEOUT_MS,
    check_reachable,
    cleanup,
    encode_value,
    format_duration,
    produce_time,
)

__all__ = [
    "CellResult",
    "MemberResult",
    "ScaleResult",
    "ScaleSettings",
    "SeedResult",
    "format_markdown",
    "per_partition_requests",
    "result_json",
    "run_scale",
]

Out = Callable[[str], None]
Key = tuple[str, int]

PLAIN, FAST = "plain", "fastrebalance"
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
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
def _rss_kib() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


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
    return _rss_kib()


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


def _commands(stream: IO[str], into: queue.Queue[str]) -> None:
    """The parent's commands, one a line (this thread touches no Kafka handle)."""
    for line in stream:
        into.put(line.strip())
    into.put("eof")


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


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


def _worker_seed(spec: dict[str, Any]) -> dict[str, Any]:
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
    rss_base = _rss_kib()
    base_snapshot = tracemalloc.take_snapshot() if traced else None
    _emit({"event": "ready"})
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
                _emit({"event": "fresh", "t": now})
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
            _emit({"event": "assignment", "t": now, "partitions": count, "plan": plan})
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
    rss = _rss_kib()
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


def _worker_main() -> int:
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=_commands, args=(sys.stdin, commands), name="commands", daemon=True
    ).start()
    spec = json.loads(commands.get())
    answer = _worker_seed(spec) if spec["kind"] == "seed" else _worker_member(spec, commands)
    _emit({"event": "result", "result": answer})
    return 0


# -------------------------------------------------------------------- parent
class _Worker:
    """One worker process: JSON spec and commands in, JSON events out (a pump thread
    moves its stdout to a queue, so that waiting for an event can time out)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", _WORKER_MODULE, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.send(json.dumps(spec))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put(None)

    def _drain_stderr(self) -> None:
        # librdkafka logs to stderr; kept (the tail) for the error message only
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)
            del self._err[:-40]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event; None when none came within ``timeout``. Raises if it died."""
        try:
            event = self.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if event is None:
            self.events.put(None)
            code = self.proc.wait()
            raise RuntimeError(
                f"scale worker {self.proc.pid} exited with code {code}: "
                + ("".join(self._err[-15:]).strip() or "(no stderr)")
            )
        return event

    def wait_for(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(deadline - time.monotonic())
            if event is None:
                raise RuntimeError(f"scale worker {self.proc.pid}: no {name!r} in {timeout:g}s")
            if event.get("event") == name:
                return event

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class _FreshSpray:
    """Writes fresh timestamped records round-robin over many partitions at a steady
    rate until stopped. Thread ownership: its Producer belongs to its own thread."""

    def __init__(self, bootstrap: str, partitions: Sequence[Key], rate: float) -> None:
        self._bootstrap = bootstrap
        self._partitions = list(partitions)
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fresh-spray", daemon=True)
        self.produced = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self._bootstrap, "linger.ms": 0})
            started = time.monotonic()
            seq = 0
            n = len(self._partitions)
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self._rate) + 1
                while seq < due:
                    topic, partition = self._partitions[seq % n]
                    try:
                        value = encode_value("F", seq, time.time())
                        producer.produce(topic, value, partition=partition)
                    except BufferError:
                        producer.poll(0.01)
                        continue
                    seq += 1
                producer.poll(0)
                self._stop.wait(max(0.0, started + seq / self._rate - time.monotonic()))
            producer.flush(10)
            self.produced = seq
        except BaseException as exc:  # reported by the owner
            self.error = exc


def _topic_names(run_id: str, topics: int, label: str) -> list[str]:
    return [f"fastrebalance-scale-{run_id}-{label}-{i}" for i in range(topics)]


def _keys(topics: Sequence[str], per_topic: int) -> list[Key]:
    return [(t, p) for t in topics for p in range(per_topic)]


def _produce(bootstrap: str, keys: Sequence[Key], per_partition: int) -> None:
    """``per_partition`` backlog records on every partition, all delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    failed = 0

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1

    seq = 0
    for topic, partition in keys:
        for _ in range(per_partition):
            value = encode_value("B", seq, time.time())
            while True:
                try:
                    producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            seq += 1
        producer.poll(0)
    left = producer.flush(60)
    if failed or left:
        raise RuntimeError(f"backlog: {failed + left} of {seq} records not delivered")


def _log_ends(probe: PlainConsumer, keys: Sequence[Key]) -> dict[Key, int]:
    """Every partition's log end in one ListOffsets request (a partition without an
    answer is asked alone)."""
    ask = [TopicPartition(t, p, OFFSET_END) for t, p in keys]
    ends: dict[Key, int] = {}
    with contextlib.suppress(KafkaException):
        for tp in probe.offsets_for_times(ask, timeout=REQUEST_TIMEOUT_S):
            if tp.error is None and tp.offset >= 0:
                ends[(tp.topic, tp.partition)] = tp.offset
    for key in keys:
        if key not in ends:
            _low, high = probe.get_watermark_offsets(
                TopicPartition(*key), timeout=REQUEST_TIMEOUT_S, cached=False
            )
            ends[key] = high
    return ends


def _set_offsets(bootstrap: str, group: str, offsets: dict[Key, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    request = [ConsumerGroupTopicPartitions(group, tps)]
    admin.alter_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT_S)[group].result()


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
    workers: list[_Worker] = []
    try:
        for _ in range(members):
            workers.append(_Worker(spec))
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
            got = w.wait_for("result", 120.0)["result"]
            got["plans"] = tuple(tuple(p) for p in got["plans"])
            results.append(MemberResult(**got))
        return wall, tuple(results)
    finally:
        for w in workers:
            w.close()


def _seed(bootstrap: str, group: str, keys: Sequence[Key]) -> SeedResult:
    worker = _Worker({"kind": "seed", "bootstrap": bootstrap, "group": group,
                      "partitions": [list(k) for k in keys], "threshold": 0})  # fmt: skip
    try:
        got = worker.wait_for("result", 120.0)["result"]
    finally:
        worker.close()
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
    """Run every cell and return the measurements.

    Args:
        settings: what to run; ``ScaleSettings()`` when None.
        cluster: a running ``KafkaCluster`` (tests pass theirs); when None,
            ``settings.bootstrap_servers`` names one, or an embedded one is started.
        out: receives a progress line per run; None prints nothing.

    Raises:
        RuntimeError, KafkaException: the cluster or a worker failed.
    """
    from ..testing import EmbeddedKafka, ExternalKafka
    from .bench import _loadavg, _quiet, machine_info

    s = settings or ScaleSettings()
    emit = out or _quiet
    began = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    cells: list[CellResult] = []
    notes: list[str] = []
    all_topics: list[str] = []
    groups: list[str] = []
    load_start = _loadavg()
    with ExitStack() as stack:
        owns_external = cluster is None and bool(s.bootstrap_servers)
        if cluster is None:
            if s.bootstrap_servers:
                cluster = stack.enter_context(ExternalKafka(s.bootstrap_servers))
            else:
                emit("starting an embedded Kafka (librdkafka's mock cluster)...")
                cluster = stack.enter_context(EmbeddedKafka())
        bootstrap = cluster.bootstrap_servers
        check_reachable(bootstrap)
        probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": f"scale-{run_id}-p"})
        stack.callback(probe.close)

        def group(name: str) -> str:
            g = f"scale-{run_id}-{name}"
            groups.extend([g, f"{g}.catchup"])
            return g

        def prepare(keys: Sequence[Key], tag: str, seeded: bool) -> dict[str, Any]:
            """B records everywhere, both groups at log end - B, the fastrebalance one
            seeded with a token on every partition, then B more records."""
            _produce(bootstrap, keys, s.backlog)
            ends = _log_ends(probe, keys)
            start = {k: e - s.backlog for k, e in ends.items()}
            groups_ = {PLAIN: group(f"{tag}-plain"), FAST: group(f"{tag}-fast")}
            for g in groups_.values():
                _set_offsets(bootstrap, g, start)
            seed = _seed(bootstrap, groups_[FAST], keys) if seeded else None
            _produce(bootstrap, keys, s.backlog)
            return {"groups": groups_, "start": start, "seed": seed}

        def backlog_now(keys: Sequence[Key], start: dict[Key, int]) -> int:
            ends = _log_ends(probe, keys)
            return sum(ends[k] - start[k] for k in keys)

        turn = 0
        layouts = [(t, s.partitions // t, f"{t}t") for t in s.layouts]
        few = [(1, s.few, "few")] if s.memory else []
        for topics_n, per_topic, label in [*layouts, *few]:
            topics = _topic_names(run_id, topics_n, label)
            for t in topics:
                cluster.create_topic(t, per_topic)
            all_topics.extend(topics)
            keys = _keys(topics, per_topic)
            spray = _FreshSpray(bootstrap, keys, s.rate)
            spray.start()
            try:
                # the few-partition runs are the memory baseline only
                runs = [] if label == "few" else [(m, "timed") for m in s.members]
                if topics_n == 1 and s.memory:
                    runs += [(1, "memory"), (1, "traced")]
                for members, mode in runs:
                    tag = f"{label}-{members}m-{mode}"
                    prep = prepare(keys, tag, seeded=True)
                    order = (PLAIN, FAST) if turn % 2 == 0 else (FAST, PLAIN)
                    turn += 1
                    for consumer in order:
                        backlog = backlog_now(keys, prep["start"])
                        wall, results = _run_cell(
                            bootstrap,
                            s,
                            consumer=consumer,
                            topics=topics,
                            keys=keys,
                            members=members,
                            group=prep["groups"][consumer],
                            mode=mode,
                        )
                        cell = CellResult(
                            topics=topics_n,
                            partitions=len(keys),
                            members=members,
                            consumer=consumer,
                            backlog=backlog,
                            wall_s=wall,
                            results=results,
                            seed=prep["seed"] if consumer == FAST else None,
                            mode=mode,
                        )
                        cells.append(cell)
                        emit(_cell_line(cell))
            finally:
                spray.stop()
            if spray.error is not None:
                raise RuntimeError(f"the fresh producer failed: {spray.error}") from spray.error
        if owns_external:
            cleanup(bootstrap, all_topics, groups)
    machine = machine_info()
    machine["loadavg_start"] = load_start
    machine["loadavg_end"] = _loadavg()
    return ScaleResult(
        settings=s,
        cluster=f"{cluster.kind} cluster at {bootstrap}",
        machine=machine,
        cells=tuple(cells),
        wall_s=time.monotonic() - began,
        notes=tuple(notes),
    )


# ------------------------------------------------------------------ printing
def _max(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def _median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def _layout(cell: CellResult) -> str:
    if cell.topics == 1:
        return f"1 topic of {cell.partitions:,}"
    return f"{cell.topics} topics of {cell.partitions // cell.topics}"


def _plan_max(cell: CellResult) -> tuple[float | None, int]:
    plans = [p for r in cell.results for p in r.plans]
    if not plans:
        return None, 0
    worst = max(plans, key=lambda p: p[1])
    return worst[1], worst[0]


def _cell_line(cell: CellResult) -> str:
    d = format_duration
    plan, planned = _plan_max(cell)
    rs = cell.results
    line = (
        f"{_layout(cell)}, {cell.members} member(s), {cell.consumer}"
        f"{'' if cell.mode == 'timed' else f' ({cell.mode})'}: backlog {cell.backlog:,},"
        f" first fresh {d(_max(r.first_fresh_s for r in rs))},"
        f" settled {d(_max(r.settled_s for r in rs))}"
    )
    if plan is not None:
        line += f", plan {d(plan)} ({planned:,} partitions)"
    line += (
        f", commit {d(_max(r.commit_s for r in rs))}, close {d(_max(r.close_s for r in rs))},"
        f" RSS {_max(r.rss_kib for r in rs) or 0:,.0f} KiB"
    )
    if cell.seed is not None:
        line += (
            f"; seed: {cell.seed.tokens:,} tokens, {cell.seed.metadata_bytes:,} metadata bytes,"
            f" commit {d(cell.seed.commit_s)}"
        )
    return line


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    align = ["---"] * min(left, len(header)) + ["--:"] * max(0, len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


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


def _restart_table(result: ScaleResult) -> list[str]:
    d = format_duration
    header = ["layout", "members", "consumer", "backlog at restart", "assigned", "settled",
              "first fresh", "plan (partitions)", "plan: round trips", "commit()",
              "close()", "first fresh ÷ plain", "close() ÷ plain"]  # fmt: skip
    rows = []
    for cell in _timed(result):
        if cell.partitions == result.settings.few:
            continue
        rs = cell.results
        plan, planned = _plan_max(cell)
        reads = _max(p[2] for r in rs for p in r.plans)
        plain = _pair(result, cell, PLAIN) if cell.consumer == FAST else None
        fresh = _max(r.first_fresh_s for r in rs)
        close = _max(r.close_s for r in rs)
        plain_fresh = _max(r.first_fresh_s for r in plain.results) if plain else None
        plain_close = _max(r.close_s for r in plain.results) if plain else None
        rows.append(
            [
                _layout(cell),
                str(cell.members),
                cell.consumer,
                f"{cell.backlog:,}",
                d(_max(r.assigned_s for r in rs)),
                d(_max(r.settled_s for r in rs)),
                d(fresh),
                f"{d(plan)} ({planned:,})" if plan is not None else "-",
                d(reads) if reads is not None else "-",
                d(_max(r.commit_s for r in rs)),
                d(close),
                _ratio(fresh, plain_fresh),
                _ratio(close, plain_close),
            ]
        )
    return _md_table(header, rows, left=3)


def _token_table(result: ScaleResult) -> list[str]:
    d = format_duration
    header = ["layout", "partitions", "plan of assign()", "commit() sync", "tokens stored",
              "metadata bytes", "per partition", "sent to the coordinator",
              "plain commit() sync (no metadata)"]  # fmt: skip
    rows = []
    seen: set[tuple[int, int]] = set()
    for cell in _timed(result):
        seed = cell.seed
        if seed is None or cell.partitions == result.settings.few:
            continue
        if (cell.topics, cell.members) in seen or cell.members != 1:
            continue
        seen.add((cell.topics, cell.members))
        plain = _pair(result, cell, PLAIN)
        plain_commit = _max(r.commit_s for r in plain.results) if plain else None
        rows.append(
            [
                _layout(cell),
                f"{cell.partitions:,}",
                d(seed.plan_s),
                d(seed.commit_s),
                f"{seed.tokens:,}",
                f"{seed.metadata_bytes:,}",
                f"{seed.metadata_bytes / cell.partitions:.1f} B",
                f"{seed.coordinator_bytes:,} B" if seed.coordinator_bytes is not None else "-",
                d(plain_commit),
            ]
        )
    return _md_table(header, rows)


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
    rows.append(["fastrebalance ÷ plain", "", "", _ratio(fast_rss, plain_rss),
                 _ratio(fast_trim, plain_trim), "", ""])  # fmt: skip
    return _md_table(header, rows)


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
    return _md_table(header, rows, left=4)


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
    m = result.machine
    lines: list[str] = []
    if command:
        lines += [f"Command: `{command}`", ""]
    load = " → ".join(
        ", ".join(f"{x:.2f}" for x in la)
        for la in (m.get("loadavg_start"), m.get("loadavg_end"))
        if la
    )
    lines += [
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['platform']}, Python {m['python']},"
        f" confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']};"
        f" load average (1, 5, 15 min) {load}. Cluster: {result.cluster}."
        f" Wall time {result.wall_s / 60:.1f} min.",
        "",
        f"### Restart: {s.partitions:,} partitions, {2 * s.backlog} backlog records on every"
        f" partition, {s.rate:g} fresh records/s",
        "",
    ]
    lines += _restart_table(result)
    lines += [
        "",
        "Times from each member's `subscribe()`, the slowest member of the group (one"
        " process per member, all told to subscribe at once). *assigned*: the first"
        " `consume()` that served an assignment returned (fastrebalance: its plan"
        " included); *settled*: the last assignment change returned; *first fresh*: the"
        " first record produced after `subscribe()` delivered. *plan*: the slowest plan"
        " inside a rebalance callback (`last_plan`) and its partitions; *round trips*: its"
        " share spent reading both commit logs and the watermarks. *commit()*: the"
        " member's synchronous bare commit once its backlog was delivered. Ratios:"
        " fastrebalance ÷ plain, same cell.",
        "",
        "### A range token on every partition: one synchronous commit",
        "",
    ]
    lines += _token_table(result)
    lines += [
        "",
        "Before each fastrebalance restart an `assign()`-only fastrebalance consumer planned"
        " every partition (*plan of assign()*, each gains a range) and stored its start"
        " offsets with `commit(offsets=..., asynchronous=False)`: the safe offset and a"
        " range token on every partition, in one OffsetCommit request. *tokens stored*:"
        " partitions whose metadata, read back by a plain consumer, decodes as a token."
        " *sent to the coordinator*: bytes librdkafka sent to the group coordinator"
        " across the commit (its statistics), i.e. the request. Plain: its members' bare"
        " synchronous commit, offsets only.",
        "",
        "### Memory per assigned, idle partition (one member)",
        "",
    ]
    lines += _memory_table(result)
    lines += [
        "",
        f"RSS: `VmRSS` once the backlog is delivered and the member idles (~1 s of trickle),"
        " in runs without librdkafka statistics (their documents describe every partition),"
        f" {s.partitions:,} partitions against {s.few} on one topic, divided by the"
        " difference; librdkafka's own per-partition state (two clients for"
        " fastrebalance: the child keeps its own state for every partition it read) is in"
        " it, and so is heap freed but not given back (fetch buffers, the plan's temporary"
        " objects): *after malloc_trim* is the same once glibc returned that."
        " *traced*: `tracemalloc` in separate runs (it slows everything), Python memory"
        " alive once idle that was allocated with a library frame on the stack"
        " (fastrebalance's ledgers, histories, epochs, tokens, metrics snapshot), or"
        " anywhere in the process after the consumer was built.",
        "",
        "### Broker requests (librdkafka statistics)",
        "",
    ]
    lines += _request_table(result)
    lines += [
        "",
        "Summed over the members, whole run (join, plans, catch-up, commits, idle); the"
        " child's as of its last statistics document. *per-partition types*: request types"
        " other than Fetch/Heartbeat (periodic: one Fetch carries every partition of a"
        " broker) sent at least once per two partitions a member holds.",
        "",
        "### Targets",
        "",
    ]
    rows = [
        [name, {True: "✓ met", False: "✗ missed", None: "-"}[ok], why]
        for name, (ok, why) in targets(result).items()
    ]
    lines += _md_table(["target", "", "measured"], rows)
    for note in result.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines).rstrip() + "\n"


def result_json(result: ScaleResult) -> str:
    return json.dumps(dataclasses.asdict(result), indent=1, default=str)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_worker_main())
    from .cli import main as cli_main

    sys.exit(cli_main(["bench-scale", *sys.argv[1:]]))
