"""``fastrebalance bench-scale``: what a restart costs at 1,000 partitions, side by side
with plain ``confluent_kafka.Consumer``; docs/benchmarks.md ("Scale") says what each
figure is and how it is measured.

Before each restart the fastrebalance group is *seeded*: an ``assign()``-only consumer
plans every partition and commits its start offsets, which stores a range token on
every partition, and exits without processing (a crash). B more records follow, so the
restart plans a second backlog on top of the token's.

The member processes (``_worker_member``, started by ``member_processes``, ended by
``finish``) are ``groupbench``'s too: there they also do the work and report it.

Thread ownership: each consumer handle belongs to the main thread of its worker
process; the fresh producer's handle to its own thread; every other handle to the
thread that calls ``run_scale()``. A worker's stdin reader thread touches no handle.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import json
import queue
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException, TopicPartition

from ..testing import _workload as w
from . import _args as a
from . import _runner as r
from ._runner import FAST, PLAIN, Column
from .workload import BATCH, FETCH_WAIT_MS, SESSION_TIMEOUT_MS, format_duration

__all__ = ["CellResult", "MemberResult", "ScaleResult", "ScaleSettings", "SeedResult",
           "add_command", "finish", "format_markdown", "member_processes",
           "per_partition_requests", "per_partition_senders", "run_scale"]  # fmt: skip

#: Requests that a client sends on a clock, not per partition: one Fetch carries every
#: partition led by its broker, a Heartbeat none. Every other type must not grow with P.
PERIODIC_REQUESTS = frozenset({"Fetch", "Heartbeat"})
#: librdkafka statistics interval of every measured consumer: often enough that a
#: document follows each phase within a second, rarely enough to cost little (each one
#: describes every partition; fastrebalance merges its own metrics into it).
STATS_INTERVAL_MS = 1000
_WORKER_MODULE = "fastrebalance.tools.scale"


@dataclass(frozen=True)
class ScaleSettings:
    """What to run: the options of ``bench-scale``. ``memory=False`` leaves out the
    memory cells (P and ``few`` partitions, one member, without statistics)."""

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
        if not self.layouts or any(t < 1 or self.partitions % t for t in self.layouts):
            raise ValueError(
                f"layouts={self.layouts} do not divide partitions={self.partitions} into "
                "equal topics"
            )
        if not self.members or min(self.members) < 1:
            raise ValueError(f"members={self.members} is invalid: expected >= 1")
        if not 0 <= self.threshold < self.backlog:
            raise ValueError(
                f"threshold={self.threshold} must be >= 0 and below backlog={self.backlog}: "
                "every partition must get a catch-up range"
            )
        if not 1 <= self.few < self.partitions:
            raise ValueError(f"few={self.few} must be >= 1 and below partitions")


@dataclass(frozen=True)
class MemberResult:
    """One member process of one cell. Times in seconds from its ``subscribe()``;
    ``plans``: (partitions, seconds, read_seconds) of every plan, fastrebalance only;
    ``requests`` by type over the whole run, the child's as of its latest statistics."""

    assigned_s: float | None
    settled_s: float | None
    first_fresh_s: float | None
    partitions: int
    plans: tuple[tuple[int, float, float], ...]
    commit_s: float | None
    rss_kib: int
    requests: dict[str, int]
    child_requests: dict[str, int]
    close_s: float


@dataclass(frozen=True)
class SeedResult:
    """The consumer that wrote a token on every partition before the crash; ``tokens``
    and ``metadata_bytes`` as a plain consumer reads them back."""

    plan_s: float
    commit_s: float
    committed: int
    tokens: int
    metadata_bytes: int
    coordinator_bytes: int | None  #: None if no statistics document came in time


@dataclass(frozen=True)
class CellResult:
    """One (layout, members, consumer) restart."""

    topics: int
    partitions: int
    members: int
    consumer: str
    backlog: int  #: records between the committed offsets and the log end, at the go
    results: tuple[MemberResult, ...]
    seed: SeedResult | None
    #: "timed" (with librdkafka statistics, for the request counts) or "memory" (none:
    #: their documents describe every partition and would count as per-partition memory)
    mode: str


@dataclass(frozen=True)
class ScaleResult:
    settings: ScaleSettings
    cluster: str
    machine: dict[str, Any]
    cells: tuple[CellResult, ...]
    wall_s: float


def _requests(stats: dict[str, Any] | None) -> dict[str, int]:
    """Requests sent, by type, summed over the brokers of one statistics document."""
    out: Counter[str] = Counter()
    for broker in (stats or {}).get("brokers", {}).values():
        out.update({name: int(n) for name, n in (broker.get("req") or {}).items() if n})
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


# ------------------------------------------------------------------- members
class _Stats:
    """The latest librdkafka statistics document, stored by the consumer's stats_cb
    inside poll()/consume() and read by the same thread; parsed only when read."""

    def __init__(self) -> None:
        self.raw: str | None = None
        self.count = 0

    def __call__(self, stats: str) -> None:
        self.raw, self.count = stats, self.count + 1

    def doc(self) -> dict[str, Any] | None:
        return None if self.raw is None else dict(json.loads(self.raw))


def member_consumer(spec: dict[str, Any], stats: Callable[[str], None] | None = None) -> Any:
    """A group member's consumer: ``spec["consumer"]`` is ``plain`` or a fastrebalance
    kind, configured by ``fast_conf``; ``conf`` is for both."""
    conf: dict[str, Any] = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "auto.offset.reset": "earliest",
        **spec["conf"],
    }
    if stats is not None:
        conf.update({"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": stats})
    if spec["consumer"] == PLAIN:
        return PlainConsumer(conf)
    from .._consumer import Consumer as FastConsumer

    return FastConsumer({**conf, "enable.parallel.rebalance": True, **spec["fast_conf"]})


@contextlib.contextmanager
def member_processes(specs: Sequence[dict[str, Any]]) -> Iterator[list[r.Worker]]:
    """A member process (``_worker_member``) per spec, killed on the way out whatever
    happened."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(contextlib.closing(r.Worker(_WORKER_MODULE, s))) for s in specs]


def finish(workers: Sequence[r.Worker], timeout: float) -> list[dict[str, Any]]:
    """Tell every member to finish, then each one's result."""
    for worker in workers:
        worker.send("finish")
    return [worker.wait_for("result", timeout)["result"] for worker in workers]


def _wait_stats(consumer: Any, stats: _Stats, after: int, timeout: float = 3.0) -> None:
    """Serve the consumer until a statistics document newer than number ``after`` came."""
    deadline = time.monotonic() + timeout
    while stats.count <= after and time.monotonic() < deadline:
        consumer.poll(0.05)


def _worker_seed(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    """assign() every partition (each gets a range), store the start offsets with their
    tokens in one synchronous commit, exit without processing: the crash."""
    stats = _Stats()
    consumer = member_consumer(spec, stats)
    try:
        consumer.assign([TopicPartition(t, p) for t, p in spec["partitions"]])
        plan = consumer.metrics_snapshot()["last_plan"]
        # the primary's start: the end of the range the plan added
        starts = [
            TopicPartition(key[0], key[1], status.pending_ranges[-1][1])
            for key, status in consumer.catchup_status().items()
        ]
        _wait_stats(consumer, stats, stats.count)
        before, seen = _coordinator_txbytes(stats.doc()), stats.count
        began = time.monotonic()
        committed = consumer.commit(offsets=starts, asynchronous=False)
        commit_s = time.monotonic() - began
        _wait_stats(consumer, stats, seen)
        after = _coordinator_txbytes(stats.doc())
        return {
            "plan_s": plan["seconds"],
            "with_range": len(starts),
            "commit_s": commit_s,
            "committed": len(committed or ()),
            "coordinator_bytes": None if before is None or after is None else after - before,
        }
    finally:
        consumer.close()


def _worker_member(spec: dict[str, Any], commands: queue.Queue[str]) -> dict[str, Any]:
    """A group member: subscribes at the parent's ``go``, reports its assignment changes
    and its first fresh record and, with ``work_us`` (groupbench), does the work and
    reports what it processed, until ``finish``. Then a bench-scale member measures its
    commit, memory and ``close()``; a groupbench member just closes."""
    fast = spec["consumer"] != PLAIN
    stats = _Stats()
    consumer = member_consumer(spec, stats if spec.get("stats") else None)
    r.emit({"event": "ready"})
    if commands.get() != "go":
        raise RuntimeError("the parent went away before the go")
    changed: list[bool] = []

    def on_change(_c: Any, _partitions: list[TopicPartition]) -> None:
        changed.append(True)

    wall0, t0 = time.time(), time.monotonic()
    consumer.subscribe(spec["topics"], on_assign=on_change, on_revoke=on_change)
    assigned_s = settled_s = first_fresh_s = None
    plans: list[tuple[int, float, float]] = []
    while commands.empty():  # until "finish" (or "eof": the parent went away)
        msgs = [m for m in consumer.consume(BATCH, spec["consume_s"]) if m.error() is None]
        now = time.monotonic() - t0
        if "work_us" in spec:
            _work(consumer, msgs, spec["backlogs"], spec["work_us"] / 1e6)
        elif first_fresh_s is None and any(w.produce_time(m.value()) >= wall0 for m in msgs):
            first_fresh_s = now
            r.emit({"event": "fresh", "t": now})
        if changed:
            changed.clear()
            count = len(consumer.assignment())
            if count and assigned_s is None:
                assigned_s = now
            settled_s = now
            plan = consumer.metrics_snapshot().get("last_plan") if fast else None
            if plan is not None and (not plans or plans[-1][1] != plan["seconds"]):
                plans.append((plan["partitions"], plan["seconds"], plan["read_seconds"]))
            r.emit({"event": "assignment", "t": now, "partitions": count})
    if "work_us" in spec:
        consumer.close()
        return {}
    # Every backlog record delivered (the child back on standby), then the commit.
    deadline = time.monotonic() + 30.0
    while fast and time.monotonic() < deadline:
        if all(s.child_position is None for s in consumer.catchup_status().values()):
            break
        consumer.consume(BATCH, 0.01)
    commit_s = None
    began = time.monotonic()
    with contextlib.suppress(KafkaException):  # e.g. nothing consumed: commit_s stays None
        consumer.commit(asynchronous=False)
        commit_s = time.monotonic() - began
    # Idle: assigned, nothing left to catch up, a trickle of fresh records.
    idle_until = time.monotonic() + 1.0
    while time.monotonic() < idle_until:
        consumer.consume(BATCH, 0.05)
    if spec["stats"]:
        _wait_stats(consumer, stats, stats.count)
    doc = stats.doc()
    gc.collect()
    rss, partitions = r.memory_kib(), len(consumer.assignment())
    began = time.monotonic()
    consumer.close()
    return dataclasses.asdict(
        MemberResult(
            assigned_s=assigned_s,
            settled_s=settled_s,
            first_fresh_s=first_fresh_s,
            partitions=partitions,
            plans=tuple(plans),
            commit_s=commit_s,
            rss_kib=rss,
            requests=_requests(doc),
            child_requests=_requests(((doc or {}).get("fastrebalance") or {}).get("child")),
            close_s=time.monotonic() - began,
        )
    )


def _work(consumer: Any, msgs: list[Any], backlogs: Sequence[int], work_s: float) -> None:
    """groupbench's work: W per record of *waiting* (as for a database write), slept once
    per batch because a sleep of 50 us overshoots by the kernel's timer slack; then the
    backlog offsets processed (below ``backlogs[partition]``), as ``(partition, start,
    end)`` spans, and the fresh latencies go to the parent in a ``processed`` event, and an
    asynchronous commit."""
    if not msgs:
        return
    time.sleep(len(msgs) * work_s)
    now = time.time()

    def in_backlog(m: Any) -> bool:
        return bool(m.offset() < backlogs[m.partition()])

    backlog = sorted((m.partition(), m.offset()) for m in msgs if in_backlog(m))
    spans = []
    # backlog offsets as spans: consecutive offsets of a partition keep offset - index constant
    for _, run in itertools.groupby(enumerate(backlog), lambda io: (io[1][0], io[1][1] - io[0])):
        span = [po for _, po in run]
        spans.append((span[0][0], span[0][1], span[-1][1] + 1))
    fresh = [1000 * (now - w.produce_time(m.value())) for m in msgs if not in_backlog(m)]
    r.emit({"event": "processed", "t": now, "backlog": spans, "fresh_ms": fresh})
    with contextlib.suppress(Exception):
        consumer.commit(asynchronous=True)


# -------------------------------------------------------------------- parent
def _seed(spec: dict[str, Any], keys: Sequence[w.Key]) -> SeedResult:
    """Run the seed, then read its tokens back as any tool reads a group: a plain
    consumer's committed()."""
    from .._token import TokenError, decode_group_token

    got = r.run_worker(_WORKER_MODULE, {**spec, "partitions": [list(k) for k in keys]}, 120.0)
    if got.pop("with_range") != len(keys):
        raise RuntimeError(f"seed: not all of {len(keys)} partitions got a catch-up range")
    reader = PlainConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"]})
    try:
        tps = reader.committed([TopicPartition(*k) for k in keys], timeout=w.REQUEST_TIMEOUT_S)
    finally:
        reader.close()
    tokens = size = 0
    for tp in tps:
        size += len((tp.metadata or "").encode("utf-8"))
        with contextlib.suppress(TokenError):
            tokens += decode_group_token(tp.metadata or "") is not None
    return SeedResult(**got, tokens=tokens, metadata_bytes=size)


def _run_cell(
    s: ScaleSettings, spec: dict[str, Any], members: int, partitions: int
) -> tuple[MemberResult, ...]:
    """Start the members, go, wait for the group to settle and for a fresh record at
    every member, then finish them all."""
    with member_processes([spec] * members) as workers:
        for worker in workers:
            worker.wait_for("ready", 60.0)
        for worker in workers:
            worker.send("go")
        assigned, fresh = [0] * members, [False] * members
        began = last_change = time.monotonic()
        while True:
            for i, worker in enumerate(workers):
                while (event := worker.next_event(0.0)) is not None:
                    if event["event"] == "assignment":
                        assigned[i], last_change = event["partitions"], time.monotonic()
                    elif event["event"] == "fresh":
                        fresh[i] = True
            now = time.monotonic()
            settled = sum(assigned) == partitions and all(assigned) and all(fresh)
            if settled and now - last_change >= s.settle_s:
                break
            if now > began + s.run_timeout_s:
                raise RuntimeError(
                    f"{spec['consumer']}, {members} member(s): not settled after "
                    f"{s.run_timeout_s:g}s (assigned {assigned}, fresh {fresh})"
                )
            time.sleep(0.02)
        return tuple(r.revive(MemberResult, res) for res in finish(workers, 120.0))


def run_scale(
    settings: ScaleSettings | None = None, *, cluster: Any = None, out: r.Out | None = print
) -> ScaleResult:
    """Run every cell and return the measurements. ``cluster``: a running
    ``KafkaCluster`` to use (tests pass theirs); ``out``: the progress lines (None: quiet)."""
    s = settings or ScaleSettings()
    say = out or r.quiet
    cells: list[CellResult] = []
    with r.Session("scale", s.bootstrap_servers, cluster, say) as session:
        bootstrap = session.bootstrap
        conf = {"session.timeout.ms": SESSION_TIMEOUT_MS, "fetch.wait.max.ms": FETCH_WAIT_MS}

        def produce(keys: Sequence[w.Key]) -> None:
            failed = w.produce_records(bootstrap, keys, s.backlog * len(keys))
            if failed:
                raise RuntimeError(f"backlog: {failed} of {s.backlog * len(keys)} records lost")

        turn = 0
        layouts = [(t, s.partitions // t, f"{t}t") for t in s.layouts]
        for topics_n, per_topic, label in [*layouts, *([(1, s.few, "few")] if s.memory else [])]:
            topics = [session.topic(f"-{label}-{i}", per_topic) for i in range(topics_n)]
            keys = [(t, p) for t in topics for p in range(per_topic)]
            # the few-partition runs are the memory baseline only
            runs = [] if label == "few" else [(m, "timed") for m in s.members]
            runs += [(1, "memory")] if topics_n == 1 and s.memory else []
            fresh = w.FreshProducer(bootstrap, keys, s.rate)
            fresh.start()
            try:
                for members, mode in runs:
                    # B records everywhere, both groups at log end - B, the fastrebalance
                    # one seeded with a token on every partition, then B more records.
                    tag = f"{label}-{members}m-{mode}"
                    produce(keys)
                    start = {k: e - s.backlog for k, e in w.log_ends(session.probe, keys).items()}
                    groups = {c: session.group(f"{tag}-{c}") for c in (PLAIN, FAST)}
                    for group in groups.values():
                        w.store_offsets(bootstrap, group, start)
                    seed = _seed({
                        "kind": "seed", "consumer": FAST, "bootstrap": bootstrap,
                        "group": groups[FAST], "conf": {**conf, "enable.auto.commit": False},
                        "fast_conf": {"parallel.rebalance.lag.threshold": 0},
                    }, keys)  # fmt: skip
                    produce(keys)
                    for consumer in r.alternate((PLAIN, FAST), turn):
                        ends = w.log_ends(session.probe, keys)
                        spec = {
                            "kind": "member", "consumer": consumer, "bootstrap": bootstrap,
                            "group": groups[consumer], "topics": topics, "conf": conf,
                            "fast_conf": {"parallel.rebalance.lag.threshold": s.threshold},
                            "stats": mode == "timed", "consume_s": 0.01,
                        }  # fmt: skip
                        cell = CellResult(
                            topics=topics_n, partitions=len(keys), members=members,
                            consumer=consumer, backlog=sum(ends[k] - start[k] for k in keys),
                            results=_run_cell(s, spec, members, len(keys)),
                            seed=seed if consumer == FAST else None, mode=mode,
                        )  # fmt: skip
                        cells.append(cell)
                        row = [f(cell) for _, f in _restart_columns(cells)]
                        say(f"{mode}: {' | '.join(row)}")
                    turn += 1
            finally:
                fresh.stop()
            if fresh.error is not None:
                raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
    return ScaleResult(s, session.description, session.machine(), tuple(cells), session.wall_s)


# ------------------------------------------------------------------ printing
def _layout(cell: CellResult) -> str:
    if cell.topics == 1:
        return f"1 topic of {cell.partitions:,}"
    return f"{cell.topics} topics of {cell.partitions // cell.topics}"


def _slowest(cell: CellResult | None, name: str) -> float | None:
    """A member time of a cell: its slowest member's (the group's)."""
    return r.maximum(getattr(m, name) for m in cell.results) if cell else None


def _timed(cells: Sequence[CellResult]) -> list[CellResult]:
    return [c for c in cells if c.mode == "timed"]


def _pair(cells: Sequence[CellResult], cell: CellResult, consumer: str) -> CellResult | None:
    def key(c: CellResult) -> tuple[int, int, int, str]:
        return c.topics, c.partitions, c.members, c.mode

    return next((c for c in cells if key(c) == key(cell) and c.consumer == consumer), None)


def _restart_columns(cells: Sequence[CellResult]) -> list[Column[CellResult]]:
    """The restart table's columns (also the progress line of each cell)."""
    d = format_duration

    def vs_plain(cell: CellResult, name: str) -> str:
        plain = _pair(cells, cell, PLAIN) if cell.consumer == FAST else None
        return r.ratio(r.div(_slowest(cell, name), _slowest(plain, name)))

    def plan(cell: CellResult) -> str:
        worst = max((p for m in cell.results for p in m.plans), key=lambda p: p[1], default=None)
        return "-" if worst is None else f"{d(worst[1])} ({worst[0]:,})"

    return [
        ("layout", _layout),
        ("members", lambda c: str(c.members)),
        ("consumer", lambda c: c.consumer),
        ("backlog at restart", lambda c: f"{c.backlog:,}"),
        ("assigned", lambda c: d(_slowest(c, "assigned_s"))),
        ("settled", lambda c: d(_slowest(c, "settled_s"))),
        ("first fresh", lambda c: d(_slowest(c, "first_fresh_s"))),
        ("plan (partitions)", plan),
        ("plan: round trips", lambda c: d(r.maximum(p[2] for m in c.results for p in m.plans))),
        ("commit()", lambda c: d(_slowest(c, "commit_s"))),
        ("close()", lambda c: d(_slowest(c, "close_s"))),
        ("first fresh ÷ plain", lambda c: vs_plain(c, "first_fresh_s")),
        ("close() ÷ plain", lambda c: vs_plain(c, "close_s")),
    ]


def _token_table(cells: Sequence[CellResult]) -> list[str]:
    """One row per layout: its one-member fastrebalance cell's seed."""
    d = format_duration
    seeded = [(c, c.seed) for c in cells if c.seed is not None and c.members == 1]
    columns: list[Column[tuple[CellResult, SeedResult]]] = [
        ("layout", lambda cs: _layout(cs[0])),
        ("partitions", lambda cs: f"{cs[0].partitions:,}"),
        ("plan of assign()", lambda cs: d(cs[1].plan_s)),
        ("commit() sync", lambda cs: d(cs[1].commit_s)),
        ("tokens stored", lambda cs: f"{cs[1].tokens:,}"),
        ("metadata bytes", lambda cs: f"{cs[1].metadata_bytes:,}"),
        ("per partition", lambda cs: f"{cs[1].metadata_bytes / cs[0].partitions:.1f} B"),
        ("sent to the coordinator",
         lambda cs: "-" if cs[1].coordinator_bytes is None else f"{cs[1].coordinator_bytes:,} B"),
        ("plain commit() sync (no metadata)",
         lambda cs: d(_slowest(_pair(cells, cs[0], PLAIN), "commit_s"))),
    ]  # fmt: skip
    return r.table(columns, seeded)


def _memory_table(s: ScaleSettings, cells: Sequence[CellResult]) -> list[str]:
    """RSS per assigned idle partition: the one-topic P-partition run against the
    few-partition one (one member each), divided by the difference in partitions."""
    rss = {(c.consumer, c.partitions): c.results[0].rss_kib for c in cells if c.mode == "memory"}
    rows, per = [], {}
    for c in (PLAIN, FAST):
        big, few = rss.get((c, s.partitions)), rss.get((c, s.few))
        per[c] = None if big is None or few is None else (big - few) / (s.partitions - s.few)
        rows.append([c, _kib(big, ",.0f"), _kib(few, ",.0f"), _kib(per[c], ",.2f")])
    rows.append(["fastrebalance ÷ plain", "", "", r.ratio(r.div(per[FAST], per[PLAIN]))])
    header = ["consumer", f"RSS, {s.partitions:,} partitions", f"RSS, {s.few}", "RSS per partition"]
    return r.md_table(header, rows)


def _kib(value: float | None, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}} KiB"


def _flagged(cell: CellResult, handle: str) -> list[str]:
    """Request types a member of the cell sent once per partition, from one handle."""
    return sorted({
        name for m in cell.results
        for name in per_partition_requests(getattr(m, handle), max(m.partitions, 1))
    })  # fmt: skip


def per_partition_senders(result: ScaleResult) -> list[str]:
    """The fastrebalance cells where a handle sent some request type once per partition
    (exit code 1), with those types."""
    found = [
        (c, _flagged(c, "requests") + _flagged(c, "child_requests"))
        for c in _timed(result.cells)
        if c.consumer == FAST
    ]
    return [f"{_layout(c)}, {c.members} member(s): {', '.join(t)}" for c, t in found if t]


def _request_table(cells: Sequence[CellResult]) -> list[str]:
    rows = []
    for cell in cells:
        handles = [("consumer", "requests")]
        if cell.consumer == FAST:
            handles = [("primary", "requests"), ("child", "child_requests")]
        for handle, pick in handles:
            total: Counter[str] = Counter()
            for m in cell.results:
                total.update(getattr(m, pick))
            rows.append([
                _layout(cell), str(cell.members), cell.consumer, handle,
                ", ".join(f"{k} {v:,}" for k, v in sorted(total.items())) or "-",
                ", ".join(_flagged(cell, pick))
                or f"none (≈{cell.partitions // cell.members:,} per member)",
            ])  # fmt: skip
    header = ["layout", "members", "consumer", "handle", "requests by type (whole run)",
              "per-partition types"]  # fmt: skip
    return r.md_table(header, rows, left=4)


def format_markdown(result: ScaleResult, command: str | None = None) -> str:
    """The tables as Markdown; docs/benchmarks.md explains every column."""
    s, timed = result.settings, _timed(result.cells)
    lines = [f"Command: `{command}`", ""] if command else []
    lines += [
        f"{r.machine_line(result.machine, result.cluster)} Wall time {result.wall_s / 60:.1f} min.",
        "",
        f"### Restart: {s.partitions:,} partitions, {2 * s.backlog} backlog records on every"
        f" partition, {s.rate:g} fresh records/s",
        "",
        *r.table(_restart_columns(timed), timed, left=3),
        "",
        "### A range token on every partition: one synchronous commit",
        "",
        *_token_table(timed),
        "",
        "### Memory per assigned, idle partition (one member)",
        "",
        *_memory_table(s, result.cells),
        "",
        "### Broker requests (librdkafka statistics)",
        "",
        *_request_table(timed),
        "",
        "Every column: docs/benchmarks.md, Scale (what each time, byte count and memory"
        " figure is, and how it is measured).",
    ]
    return "\n".join(lines) + "\n"


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
            "N members (one process each), a small backlog on every partition and, for "
            "fastrebalance, a range token on every partition written before the restart. "
            "Measured for plain confluent-kafka and fastrebalance: join to first fresh "
            "record, the plan, a synchronous commit of a token on every partition, RSS per "
            "assigned idle partition, close(), and broker requests by type "
            "(docs/benchmarks.md, Scale).",
            "Exit code 1 if a member sent some request type once per partition or the "
            "token was not stored on every partition. Runs on an embedded Kafka unless "
            "--bootstrap-servers names a cluster.",
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
    failed = [f"requests once per partition: {c}" for c in per_partition_senders(result)]
    failed += [f"{_layout(c)}: {c.seed.tokens:,} tokens" for c in result.cells
               if c.seed is not None and c.seed.tokens != c.partitions]  # fmt: skip
    for line in failed:
        print(f"check failed: {line}", file=sys.stderr)
    return a.EXIT_CHECK_FAILED if failed else a.EXIT_OK


if __name__ == "__main__":
    sys.exit(r.worker_main({"seed": _worker_seed, "member": _worker_member}))
