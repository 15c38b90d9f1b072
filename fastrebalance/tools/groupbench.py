"""``fastrebalance bench --scenario group``: one partition's backlog drained by 1, 2 and 3 member
processes, three ways side by side.

* ``plain``: ``confluent_kafka.Consumer``: the partition's one owner reads the backlog in
  order, fresh records behind it;
* ``catchup``: ``fastrebalance.Consumer`` with ``enable.parallel.rebalance`` (today's
  per-member catch-up): the owner's child reads the backlog, its primary the fresh records;
  the other members have nothing to read (one partition);
* ``group``: the same with ``parallel.rebalance.group.catchup=true``: every member's child
  reads chunks of the backlog.

Each run: a group commits offset 0 of a fresh one-partition topic, B records arrive (the
backlog), then N member processes start while a producer writes fresh timestamped records.
Every record costs W microseconds of *waiting* (as for a database write; slept once per
batch, ``len(batch) * W``, because a sleep of 50 us overshoots by the kernel's timer slack),
so that members overlap on a 2-core machine. A member writes what it processed to its own
file; the parent merges them.

Measured per run: **drain**, from the first record any member processed to the moment every
backlog offset had been processed by some member (the group's join, 3 s on a new Apache
Kafka group, is the same for every kind and is left out: it is reported as ``start``), and
the latency (produce to processed) p50/p99 of the fresh records produced from that first
record on (those produced during the join wait for it alike, whatever the kind).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition

from .._ranges import RangeSet

__all__ = ["GroupRun", "format_table", "main", "run_group_bench"]

KINDS = ("plain", "catchup", "group")


# -- a member process -------------------------------------------------------------------------
def _member(args: argparse.Namespace) -> int:
    if os.environ.get("GROUPBENCH_LOG"):  # a member's own timeline, for looking into a run
        import logging

        logging.basicConfig(
            filename=f"{args.out}.log",
            level=logging.DEBUG,
            format="%(created).3f %(name)s %(message)s",
        )
        logging.getLogger("fastrebalance.child").setLevel(logging.WARNING)
    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 10,
        "session.timeout.ms": 10000,
    }
    if args.kind == "plain":
        consumer: Any = PlainConsumer(conf)
    else:
        from fastrebalance import Consumer

        conf["enable.parallel.rebalance"] = True
        if args.kind == "group":
            conf["parallel.rebalance.group.catchup"] = True
            conf["parallel.rebalance.group.chunk.records"] = args.chunk
        consumer = Consumer(conf)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.subscribe([args.topic])
    backlog, work_s = args.backlog, args.work_us / 1e6
    with open(args.out, "w", encoding="ascii") as out:
        while not stop.is_set():
            msgs = [m for m in consumer.consume(500, 0.1) if m.error() is None]
            if not msgs:
                continue
            time.sleep(len(msgs) * work_s)  # the work: waiting, as for a database write
            now = time.time()
            lines = []
            offsets: list[int] = sorted(m.offset() for m in msgs if m.offset() < backlog)
            start = prev = -2
            for o in offsets:  # backlog offsets as ranges
                if o == prev + 1:
                    prev = o
                else:
                    if start >= 0:
                        lines.append(f"b {start} {prev + 1} {now:.4f}\n")
                    start = prev = o
            if start >= 0:
                lines.append(f"b {start} {prev + 1} {now:.4f}\n")
            for m in msgs:
                if m.offset() >= backlog:
                    with contextlib.suppress(ValueError):
                        lines.append(f"f {1000 * (now - float(m.value())):.2f} {now:.4f}\n")
            out.write("".join(lines))
            out.flush()
            with contextlib.suppress(Exception):
                consumer.commit(asynchronous=True)
    consumer.close()
    return 0


# -- one run ------------------------------------------------------------------------------------
@dataclass
class GroupRun:
    kind: str
    members: int
    backlog: int
    work_us: float
    drain_s: float | None
    start_s: float | None
    fresh_p50_ms: float | None
    fresh_p99_ms: float | None
    fresh: int
    shares: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Files:
    """The members' files, read incrementally."""

    def __init__(self, paths: list[Path], backlog: int) -> None:
        self._paths = paths
        self._pos = dict.fromkeys(paths, 0)
        self.covered = RangeSet()
        self.backlog = backlog
        self.first: float | None = None
        self.last = 0.0
        self.fresh: list[tuple[float, float]] = []  # (produced at, latency ms)
        self.shares = dict.fromkeys(paths, 0)

    def refresh(self) -> None:
        for path in self._paths:
            if not path.exists():
                continue
            with path.open("rb") as f:
                f.seek(self._pos[path])
                data = f.read()
            cut = data.rfind(b"\n") + 1
            self._pos[path] += cut
            for line in data[:cut].decode().splitlines():
                parts = line.split()
                if parts[0] == "b":
                    s, e, t = int(parts[1]), int(parts[2]), float(parts[3])
                    self.covered.add(s, e)
                    self.shares[path] += e - s
                    self.last = max(self.last, t)
                    self.first = t if self.first is None else min(self.first, t)
                elif parts[0] == "f":
                    lat, t = float(parts[1]), float(parts[2])
                    self.fresh.append((t - lat / 1000.0, lat))
                    self.first = t if self.first is None else min(self.first, t)

    def drained(self) -> bool:
        return self.covered.as_tuple() == ((0, self.backlog),)


def admin_create_topic(bootstrap: str) -> Callable[[str, int], None]:
    """Topic creation on a real cluster (the embedded one has its own: no CreateTopics)."""

    def create(topic: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        new = NewTopic(topic, num_partitions=partitions, replication_factor=-1)
        admin.create_topics([new])[topic].result(30)

    return create


def _prepare(
    bootstrap: str, topic: str, group: str, backlog: int, create: Callable[[str, int], None]
) -> None:
    create(topic, 1)
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        c.close()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for i in range(backlog):
        while True:
            try:
                p.produce(topic, value=b"0", partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 20000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("backlog not delivered")


def run_one(
    bootstrap: str,
    kind: str,
    members: int,
    backlog: int,
    work_us: float,
    rate: int,
    chunk: int,
    timeout_s: float,
    workdir: Path,
    create: Callable[[str, int], None],
) -> GroupRun:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"gbench-{tag}", f"gbench-{tag}"
    _prepare(bootstrap, topic, group, backlog, create)
    stop_fresh = threading.Event()

    def fresh() -> None:  # the producer handle is this thread's own
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        every = 1.0 / rate
        while not stop_fresh.wait(every):
            p.produce(topic, value=f"{time.time():.6f}".encode(), partition=0)
            p.poll(0)
        p.flush(10)

    paths = [workdir / f"{tag}-{i}.out" for i in range(members)]
    files = _Files(paths, backlog)
    feeder = threading.Thread(target=fresh, name="gbench-fresh", daemon=True)
    feeder.start()
    began = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fastrebalance.tools.groupbench", "member",
             "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--kind", kind,
             "--backlog", str(backlog), "--work-us", str(work_us), "--chunk", str(chunk),
             "--out", str(path)],
            stdout=subprocess.DEVNULL,
        )
        for path in paths
    ]  # fmt: skip
    drained = False
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.2)
            files.refresh()
            if files.drained():
                drained = True
                break
        time.sleep(1.0)  # fresh records after the drain count too
        files.refresh()
    finally:
        stop_fresh.set()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        feeder.join(15)
    # fresh records produced once the group reads (before, the group's join held them:
    # the same for every kind, and part of the backlog plan)
    fresh_ms = sorted(lat for at, lat in files.fresh if files.first and at >= files.first)
    return GroupRun(
        kind=kind,
        members=members,
        backlog=backlog,
        work_us=work_us,
        drain_s=round(files.last - files.first, 2) if drained and files.first else None,
        start_s=round(files.first - began, 2) if files.first else None,
        fresh_p50_ms=round(statistics.median(fresh_ms), 1) if fresh_ms else None,
        fresh_p99_ms=round(fresh_ms[int(0.99 * (len(fresh_ms) - 1))], 1) if fresh_ms else None,
        fresh=len(fresh_ms),
        shares=[files.shares[p] for p in paths],
    )


def run_group_bench(
    bootstrap: str,
    backlog: int = 300_000,
    work_us: float = 50.0,
    member_counts: Sequence[int] = (1, 2, 3),
    kinds: Sequence[str] = KINDS,
    rate: int = 200,
    chunk: int = 10_000,
    timeout_s: float = 300.0,
    out: Callable[[str], None] = print,
    create: Callable[[str, int], None] | None = None,
) -> list[GroupRun]:
    create = create or admin_create_topic(bootstrap)
    runs = []
    keep = os.environ.get("GROUPBENCH_DIR")
    with tempfile.TemporaryDirectory(prefix="gbench-") as tmp:
        if keep:
            tmp = keep
        for members in member_counts:
            for kind in kinds:
                r = run_one(
                    bootstrap,
                    kind,
                    members,
                    backlog,
                    work_us,
                    rate,
                    chunk,
                    timeout_s,
                    Path(tmp),
                    create,
                )
                out(
                    f"{kind} x{members}: drain {r.drain_s}s (start {r.start_s}s), fresh "
                    f"p50 {r.fresh_p50_ms} ms p99 {r.fresh_p99_ms} ms, shares {r.shares}"
                )
                runs.append(r)
    return runs


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.2f}{unit}"


def format_table(runs: list[GroupRun], command: str) -> str:
    by = {(r.kind, r.members): r for r in runs}
    lines = [
        f"Group-wide catch-up: `{command}`",
        "",
        "| members | kind | drain s | vs catchup | vs plain | fresh p50 ms | fresh p99 ms "
        "| backlog share per member |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    def ratio(r: GroupRun, b: GroupRun | None) -> str:
        if b is None or not b.drain_s or r.drain_s is None:
            return "-"
        return f"{r.drain_s / b.drain_s:.2f}x"

    for r in runs:
        base = by.get(("catchup", r.members))
        plain = by.get(("plain", r.members))
        lines.append(
            f"| {r.members} | {r.kind} | {_fmt(r.drain_s)} | {ratio(r, base)} | {ratio(r, plain)} "
            f"| {_fmt(r.fresh_p50_ms)} | {_fmt(r.fresh_p99_ms)} "
            f"| {', '.join(f'{s:,}' for s in r.shares)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("member")
    for name in ("--bootstrap", "--topic", "--group", "--out"):
        m.add_argument(name, required=True)
    m.add_argument("--kind", choices=KINDS, required=True)
    m.add_argument("--backlog", type=int, required=True)
    m.add_argument("--work-us", type=float, default=50.0)
    m.add_argument("--chunk", type=int, default=10_000)
    r = sub.add_parser("run")
    r.add_argument("--bootstrap-servers", default=None)
    r.add_argument("--backlog", type=int, default=300_000)
    r.add_argument("--work-us", type=float, default=50.0)
    r.add_argument("--members", default="1,2,3")
    r.add_argument("--kinds", default=",".join(KINDS))
    r.add_argument("--rate", type=int, default=200)
    r.add_argument("--chunk", type=int, default=10_000)
    r.add_argument("--timeout", type=float, default=300.0)
    r.add_argument("--markdown", default=None)
    r.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.cmd == "member":
        return _member(args)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    """The ``run`` command, and ``fastrebalance bench --scenario group`` (which passes its
    own namespace: what it lacks takes the defaults of the issue's proof)."""
    bootstrap = getattr(args, "bootstrap_servers", None)
    cluster = None
    if not bootstrap:
        from fastrebalance.testing import EmbeddedKafka

        cluster = EmbeddedKafka()
        bootstrap = cluster.bootstrap_servers
    backlog = getattr(args, "backlog", 300_000)
    work_us = getattr(args, "work_us", 50.0)
    if not isinstance(work_us, float | int):
        work_us = 50.0
    members = [int(x) for x in str(getattr(args, "members", "1,2,3")).split(",")]
    kinds = [k for k in str(getattr(args, "kinds", ",".join(KINDS))).split(",") if k]
    rate, chunk = int(getattr(args, "rate", 200)), getattr(args, "chunk", 10_000)
    command = (
        f"python -m fastrebalance.tools.groupbench run --backlog {backlog} --work-us {work_us:g}"
        f" --members {','.join(map(str, members))} --kinds {','.join(kinds)} --rate {rate}"
        f" --chunk {chunk}" + (f" --bootstrap-servers {bootstrap}" if cluster is None else "")
    )
    print(f"fastrebalance group bench: {command}", flush=True)
    try:
        runs = run_group_bench(
            bootstrap,
            backlog=backlog,
            work_us=float(work_us),
            member_counts=members,
            kinds=kinds,
            rate=rate,
            chunk=chunk,
            timeout_s=getattr(args, "timeout", 300.0) or 300.0,
            out=lambda line: print(line, flush=True),
            create=cluster.create_topic if cluster is not None else None,
        )
    finally:
        if cluster is not None:
            cluster.close()
    table = format_table(runs, command)
    print()
    print(table, flush=True)
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(table)
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps([r.as_dict() for r in runs], indent=1))
    return 0 if all(r.drain_s is not None for r in runs) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
