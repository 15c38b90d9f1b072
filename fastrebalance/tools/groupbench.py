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
import os
import queue
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition

from .._ranges import RangeSet
from ..testing._workload import FreshProducer, produce_time
from . import _args as a
from ._runner import Session, Worker, worker_main

__all__ = ["GroupRun", "add_command", "format_table", "main", "run_group_bench"]

KINDS = ("plain", "catchup", "group")
_WORKER_MODULE = "fastrebalance.tools.groupbench"


# -- a member process -------------------------------------------------------------------------
def _worker_member(spec: dict[str, Any], commands: queue.Queue[str]) -> dict[str, Any]:
    """Read, wait W per record, write what was processed to the member's file, until the
    parent says ``finish``."""
    if os.environ.get("GROUPBENCH_LOG"):  # a member's own timeline, for looking into a run
        import logging

        logging.basicConfig(
            filename=f"{spec['out']}.log",
            level=logging.DEBUG,
            format="%(created).3f %(name)s %(message)s",
        )
        logging.getLogger("fastrebalance.child").setLevel(logging.WARNING)
    conf: dict[str, Any] = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 10,
        "session.timeout.ms": 10000,
    }
    if spec["consumer"] == "plain":
        consumer: Any = PlainConsumer(conf)
    else:
        from fastrebalance import Consumer

        conf["enable.parallel.rebalance"] = True
        if spec["consumer"] == "group":
            conf["parallel.rebalance.group.catchup"] = True
            conf["parallel.rebalance.group.chunk.records"] = spec["chunk"]
        consumer = Consumer(conf)
    consumer.subscribe([spec["topic"]])
    backlog, work_s = spec["backlog"], spec["work_us"] / 1e6
    with open(spec["out"], "w", encoding="ascii") as out:
        while commands.empty():  # "finish" (or "eof": the parent went away)
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
                        latency = now - produce_time(m.value())
                        lines.append(f"f {1000 * latency:.2f} {now:.4f}\n")
            out.write("".join(lines))
            out.flush()
            with contextlib.suppress(Exception):
                consumer.commit(asynchronous=True)
    consumer.close()
    return {}


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
    rate: float,
    chunk: int,
    timeout_s: float,
    workdir: Path,
    create: Callable[[str, int], None],
) -> GroupRun:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"gbench-{tag}", f"gbench-{tag}"
    _prepare(bootstrap, topic, group, backlog, create)
    paths = [workdir / f"{tag}-{i}.out" for i in range(members)]
    files = _Files(paths, backlog)
    fresh = FreshProducer(bootstrap, [(topic, 0)], rate)
    fresh.start()
    began = time.time()
    spec = {"kind": "member", "consumer": kind, "bootstrap": bootstrap, "topic": topic,
            "group": group, "backlog": backlog, "work_us": work_us, "chunk": chunk}  # fmt: skip
    workers: list[Worker] = []
    drained = False
    try:
        workers += [Worker(_WORKER_MODULE, {**spec, "out": str(path)}) for path in paths]
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
        fresh.stop()
        for w in workers:
            w.send("finish")
        for w in workers:
            with contextlib.suppress(RuntimeError):
                w.wait_for("result", 30.0)
            w.close()
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
    rate: float = 200,
    chunk: int = 10_000,
    timeout_s: float = 300.0,
    out: Callable[[str], None] = print,
    *,
    create: Callable[[str, int], None],
) -> list[GroupRun]:
    """Every (members, kind) run; ``create`` makes a topic (the cluster's own)."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="gbench-") as tmp:
        workdir = Path(os.environ.get("GROUPBENCH_DIR") or tmp)
        for members in member_counts:
            for kind in kinds:
                r = run_one(bootstrap, kind, members, backlog, work_us, rate, chunk, timeout_s,
                            workdir, create)  # fmt: skip
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


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    """``python -m fastrebalance.tools.groupbench run``: the options ``fastrebalance bench
    --scenario group`` leaves at the defaults of the issue's proof."""
    p = a.command(commands, "run", "group-wide catch-up", [
        "One partition's backlog drained by 1, 2 and 3 member processes, three ways: plain "
        "confluent-kafka, per-member catch-up, group-wide catch-up (docs/benchmarks.md)."
    ])  # fmt: skip
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one")
    a.option(p, "--backlog", 300_000, a.number(int, 1), "N", "backlog records (default: {})")
    a.option(p, "--work-us", 50.0, a.number(float, 0), "W",
             "waiting work per record, microseconds (default: {})")
    a.option(p, "--members", (1, 2, 3), a.number_list(int, 1), "N,...",
             "member processes, one run each (default: {})")
    a.option(p, "--kinds", KINDS, a.name_list(KINDS), "LIST", "kinds to run (default: {})")
    a.rate(p, 200, "fresh records per second (default: {})")
    a.option(p, "--chunk", 10_000, a.number(int, 1), "N",
             "parallel.rebalance.group.chunk.records (default: {})")
    a.timeout(p, 300.0, "give up on a drain after this long (default: {})")
    a.report_files(p)
    p.set_defaults(func=run_from_args)


def run_from_args(args: argparse.Namespace) -> int:
    """The ``run`` command, and ``fastrebalance bench --scenario group`` (which passes its
    own namespace: what it lacks takes the defaults of the issue's proof)."""
    backlog = getattr(args, "backlog", 300_000)
    work_us = getattr(args, "work_us", 50.0)
    if not isinstance(work_us, float | int):
        work_us = 50.0
    members = list(getattr(args, "members", (1, 2, 3)))
    kinds = list(getattr(args, "kinds", KINDS))
    rate, chunk = int(args.rate), getattr(args, "chunk", 10_000)
    with Session("gbench", args.bootstrap_servers) as session:
        command = (
            f"python -m fastrebalance.tools.groupbench run --backlog {backlog} --work-us"
            f" {work_us:g} --members {a.word(members)} --kinds {a.word(kinds)} --rate {rate}"
            f" --chunk {chunk}"
            + (f" --bootstrap-servers {session.bootstrap}" if args.bootstrap_servers else "")
        )
        print(f"fastrebalance group bench: {command}", flush=True)
        runs = run_group_bench(
            session.bootstrap, backlog=backlog, work_us=float(work_us), member_counts=members,
            kinds=kinds, rate=rate, chunk=chunk, timeout_s=getattr(args, "timeout", 300.0),
            out=lambda line: print(line, flush=True), create=session.cluster.create_topic,
        )  # fmt: skip
    a.write_report(args, format_table(runs, command), runs)
    return a.EXIT_OK if all(r.drain_s is not None for r in runs) else a.EXIT_CHECK_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrebalance.tools.groupbench")
    add_command(parser.add_subparsers(dest="command", required=True))
    return a.run(parser, argv)


if __name__ == "__main__":
    sys.exit(worker_main({"member": _worker_member}) if sys.argv[1:] == ["--worker"] else main())
