"""``fastrebalance bench --scenario group``: one partition's backlog drained by 1, 2 and 3 member
processes (``scale.member_processes``), three kinds side by side: ``plain``
(confluent-kafka), ``catchup`` (per-member catch-up) and ``group``
(``parallel.rebalance.group.catchup=true``). docs/benchmarks.md ("Group-wide catch-up")
says what is measured.

Every record costs W microseconds of *waiting* (as for a database write), slept once per
batch because a sleep of 50 us overshoots by the kernel's timer slack; so members overlap
on a 2-core machine. A member writes what it processed to its own file (``b START END T``
for backlog offsets, ``f LATENCY_MS T`` for fresh records); the parent merges the files.

Thread ownership: each consumer handle belongs to the main thread of its worker process,
the fresh producer's to its own thread, every other one to the thread that made it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import queue
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from .._ranges import RangeSet
from ..testing._workload import FreshProducer, produce_time, set_group_offsets
from . import _args as a
from ._runner import Session, worker_main
from .scale import finish, member_consumer, member_processes

__all__ = ["GroupRun", "add_command", "format_table", "main", "run_group_bench"]

KINDS = ("plain", "catchup", "group")
#: The issue's proof: what ``fastrebalance bench --scenario group`` runs.
DEFAULTS = {"backlog": 300_000, "work_us": 50.0, "members": (1, 2, 3), "kinds": KINDS,
            "chunk": 10_000}  # fmt: skip
_WORKER_MODULE = "fastrebalance.tools.groupbench"


def _worker_member(spec: dict[str, Any], commands: queue.Queue[str]) -> dict[str, Any]:
    """Read, wait W per record, write what was processed to the member's file, until the
    parent says ``finish``."""
    if os.environ.get("GROUPBENCH_LOG"):  # a member's own timeline, for looking into a run
        import logging

        logging.basicConfig(filename=f"{spec['out']}.log", level=logging.DEBUG,
                            format="%(created).3f %(name)s %(message)s")  # fmt: skip
        logging.getLogger("fastrebalance.child").setLevel(logging.WARNING)
    consumer = member_consumer(spec)
    consumer.subscribe([spec["topic"]])
    backlog, work_s = spec["backlog"], spec["work_us"] / 1e6
    with open(spec["out"], "w", encoding="ascii") as out:
        while commands.empty():  # "finish" (or "eof": the parent went away)
            msgs = [m for m in consumer.consume(500, 0.1) if m.error() is None]
            if not msgs:
                continue
            time.sleep(len(msgs) * work_s)  # the work: waiting, as for a database write
            now = time.time()
            offsets = sorted(m.offset() for m in msgs if m.offset() < backlog)
            # backlog offsets as ranges: consecutive offsets keep offset - index constant
            for _, run in itertools.groupby(enumerate(offsets), lambda io: io[1] - io[0]):
                span = [o for _, o in run]
                out.write(f"b {span[0]} {span[-1] + 1} {now:.4f}\n")
            for m in msgs:
                if m.offset() >= backlog:
                    with contextlib.suppress(ValueError):
                        out.write(f"f {1000 * (now - produce_time(m.value())):.2f} {now:.4f}\n")
            out.flush()
            with contextlib.suppress(Exception):
                consumer.commit(asynchronous=True)
    consumer.close()
    return {}


@dataclass
class GroupRun:
    kind: str
    members: int
    drain_s: float | None
    start_s: float | None
    fresh_p50_ms: float | None
    fresh_p99_ms: float | None
    fresh: int
    shares: list[int]


class _Files:
    """The members' files, read incrementally."""

    def __init__(self, paths: list[Path]) -> None:
        self._pos = dict.fromkeys(paths, 0)
        self.shares = dict.fromkeys(paths, 0)
        self.covered = RangeSet()
        self.first: float | None = None
        self.last = 0.0
        self.fresh: list[tuple[float, float]] = []  # (produced at, latency ms)

    def refresh(self) -> None:
        for path in (p for p in self._pos if p.exists()):
            with path.open("rb") as f:
                f.seek(self._pos[path])
                data = f.read()
            cut = data.rfind(b"\n") + 1
            self._pos[path] += cut
            for kind, *fields in (line.split() for line in data[:cut].decode().splitlines()):
                t = float(fields[-1])
                self.first = t if self.first is None else min(self.first, t)
                if kind == "b":
                    start, end = int(fields[0]), int(fields[1])
                    self.covered.add(start, end)
                    self.shares[path] += end - start
                    self.last = max(self.last, t)
                else:
                    self.fresh.append((t - float(fields[0]) / 1000.0, float(fields[0])))


def _prepare(bootstrap: str, topic: str, group: str, backlog: int) -> None:
    """The group at offset 0, then the backlog (one-byte records)."""
    set_group_offsets(bootstrap, topic, group, [0])
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
    bootstrap: str, kind: str, members: int, o: dict[str, Any], workdir: Path,
    create: Callable[[str, int], None],
) -> GroupRun:  # fmt: skip
    """One run; ``o``: the options (``DEFAULTS``' keys, ``rate`` and ``timeout``)."""
    tag = uuid.uuid4().hex[:8]
    topic = group = f"gbench-{tag}"
    create(topic, 1)
    _prepare(bootstrap, topic, group, o["backlog"])
    paths = [workdir / f"{tag}-{i}.out" for i in range(members)]
    files = _Files(paths)
    fast_conf = {}
    if kind == "group":
        fast_conf = {"parallel.rebalance.group.catchup": True,
                     "parallel.rebalance.group.chunk.records": o["chunk"]}  # fmt: skip
    spec = {"kind": "member", "consumer": kind, "bootstrap": bootstrap, "topic": topic,
            "group": group, "backlog": o["backlog"], "work_us": o["work_us"],
            "fast_conf": fast_conf, "conf": {"enable.auto.commit": False,
            "fetch.wait.max.ms": 10, "session.timeout.ms": 10000}}  # fmt: skip
    fresh = FreshProducer(bootstrap, [(topic, 0)], o["rate"])
    fresh.start()
    began = time.time()
    drained = False
    with member_processes(_WORKER_MODULE, [{**spec, "out": str(p)} for p in paths]) as workers:
        try:
            deadline = time.monotonic() + o["timeout"]
            while not drained and time.monotonic() < deadline:
                time.sleep(0.2)
                files.refresh()
                drained = files.covered.as_tuple() == ((0, o["backlog"]),)
            time.sleep(1.0)  # fresh records after the drain count too
            files.refresh()
        finally:
            fresh.stop()
            with contextlib.suppress(RuntimeError):  # a member that died: its file counts
                finish(workers, 30.0)
    # fresh records produced once the group reads (before, the group's join held them:
    # the same for every kind, and part of the backlog plan)
    first = files.first
    fresh_ms = sorted(lat for at, lat in files.fresh if first and at >= first)
    return GroupRun(
        kind=kind,
        members=members,
        drain_s=round(files.last - first, 2) if drained and first else None,
        start_s=round(first - began, 2) if first else None,
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
    o = {"backlog": backlog, "work_us": work_us, "rate": rate, "chunk": chunk,
         "timeout": timeout_s}  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory(prefix="gbench-") as tmp:
        workdir = Path(os.environ.get("GROUPBENCH_DIR") or tmp)
        for members, kind in itertools.product(member_counts, kinds):
            r = run_one(bootstrap, kind, members, o, workdir, create)
            out(
                f"{kind} x{members}: drain {r.drain_s}s (start {r.start_s}s), fresh "
                f"p50 {r.fresh_p50_ms} ms p99 {r.fresh_p99_ms} ms, shares {r.shares}"
            )
            runs.append(r)
    return runs


def format_table(runs: list[GroupRun], command: str) -> str:
    by = {(r.kind, r.members): r for r in runs}

    def ratio(r: GroupRun, base: str) -> str:
        b = by.get((base, r.members))
        if b is None or not b.drain_s or r.drain_s is None:
            return "-"
        return f"{r.drain_s / b.drain_s:.2f}x"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.2f}"

    lines = [
        f"Group-wide catch-up: `{command}`",
        "",
        "| members | kind | drain s | vs catchup | vs plain | fresh p50 ms | fresh p99 ms "
        "| backlog share per member |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r.members} | {r.kind} | {num(r.drain_s)} | {ratio(r, 'catchup')} "
        f"| {ratio(r, 'plain')} | {num(r.fresh_p50_ms)} | {num(r.fresh_p99_ms)} "
        f"| {', '.join(f'{s:,}' for s in r.shares)} |"
        for r in runs
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    """``python -m fastrebalance.tools.groupbench run``: the options ``fastrebalance bench
    --scenario group`` leaves at the defaults of the issue's proof."""
    p = a.command(commands, "run", "group-wide catch-up", [
        "One partition's backlog drained by 1, 2 and 3 member processes, three ways: plain "
        "confluent-kafka, per-member catch-up, group-wide catch-up (docs/benchmarks.md)."
    ])  # fmt: skip
    d = DEFAULTS
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one")
    a.option(p, "--backlog", d["backlog"], a.number(int, 1), "N", "backlog records (default: {})")
    a.option(p, "--work-us", d["work_us"], a.number(float, 0), "W",
             "waiting work per record, microseconds (default: {})")
    a.option(p, "--members", d["members"], a.number_list(int, 1), "N,...",
             "member processes, one run each (default: {})")
    a.option(p, "--kinds", KINDS, a.name_list(KINDS), "LIST", "kinds to run (default: {})")
    a.rate(p, 200, "fresh records per second (default: {})")
    a.option(p, "--chunk", d["chunk"], a.number(int, 1), "N",
             "parallel.rebalance.group.chunk.records (default: {})")
    a.timeout(p, 300.0, "give up on a drain after this long (default: {})")
    a.report_files(p)
    p.set_defaults(func=run_from_args)


def run_from_args(args: argparse.Namespace) -> int:
    """The ``run`` command, and ``fastrebalance bench --scenario group``: bench's own
    namespace gives ``rate``, ``timeout`` and the cluster, ``DEFAULTS`` the rest."""
    o = vars(args) if args.command == "run" else {**vars(args), **DEFAULTS}
    with Session("gbench", args.bootstrap_servers) as session:
        shown = ("backlog", "work_us", "members", "kinds", "rate", "chunk")
        words = [f"--{k.replace('_', '-')} {a.word(o[k])}" for k in shown]
        command = " ".join(["python -m fastrebalance.tools.groupbench run", *words])
        if args.bootstrap_servers:
            command += f" --bootstrap-servers {session.bootstrap}"
        print(f"fastrebalance group bench: {command}", flush=True)
        runs = run_group_bench(
            session.bootstrap, backlog=o["backlog"], work_us=float(o["work_us"]),
            member_counts=o["members"], kinds=o["kinds"], rate=o["rate"], chunk=o["chunk"],
            timeout_s=o["timeout"], out=lambda line: print(line, flush=True),
            create=session.cluster.create_topic,
        )  # fmt: skip
    a.write_report(args, format_table(runs, command), runs)
    return a.EXIT_OK if all(r.drain_s is not None for r in runs) else a.EXIT_CHECK_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrebalance.tools.groupbench")
    add_command(parser.add_subparsers(dest="command", required=True))
    return a.run(parser, argv)


if __name__ == "__main__":
    sys.exit(worker_main({"member": _worker_member}) if sys.argv[1:] == ["--worker"] else main())
