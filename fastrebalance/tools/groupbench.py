"""``fastrebalance bench --scenario group``: one partition's backlog drained by 1, 2 and 3 member
processes (bench-scale's members, ``scale.member_processes``), three kinds side by side:
``plain`` (confluent-kafka), ``catchup`` (per-member catch-up) and ``group``
(``parallel.rebalance.group.catchup=true``). docs/benchmarks.md ("Group-wide catch-up")
says what is measured.

Every record costs W microseconds of *waiting* (``scale._work``), so members overlap on a
2-core machine. A member reports what it processed (backlog offset ranges, fresh
latencies) in ``processed`` events; the parent merges them.

Thread ownership: each consumer handle belongs to the main thread of its worker process,
the fresh producer's to its own thread, every other one to the thread that made it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from .._config import default_claims_topic
from .._ranges import RangeSet
from ..testing._chaos_check import percentile
from ..testing._workload import FreshProducer, set_group_offsets
from . import _args as a
from ._runner import Session, Worker, div, ratio
from .scale import finish, member_processes

__all__ = ["GroupRun", "add_command", "format_table", "main", "run_from_args", "run_group_bench"]

KINDS = ("plain", "catchup", "group")
#: The issue's proof: what ``fastrebalance bench --scenario group`` runs.
DEFAULTS = {"backlog": 300_000, "work_us": 50.0, "members": (1, 2, 3, 4), "kinds": KINDS,
            "chunk": 10_000, "reps": 1}  # fmt: skip


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
    rep: int = 0


class _Processed:
    """What the members processed, merged from their ``processed`` events."""

    def __init__(self, members: int) -> None:
        self.shares = [0] * members
        self.covered = RangeSet()
        self.first: float | None = None
        self.last = 0.0
        self.fresh: list[tuple[float, float]] = []  # (produced at, latency ms)

    def take(self, workers: Sequence[Worker]) -> None:
        """Every event the members sent so far."""
        for i, worker in enumerate(workers):
            with contextlib.suppress(RuntimeError):  # a member that died: its events count
                while (event := worker.next_event(0.0)) is not None:
                    if event["event"] == "processed":
                        self._add(i, event)

    def _add(self, member: int, event: dict[str, Any]) -> None:
        t = event["t"]
        self.first = t if self.first is None else min(self.first, t)
        for start, end in event["backlog"]:
            self.covered.add(start, end)
            self.shares[member] += end - start
            self.last = max(self.last, t)
        self.fresh += [(t - ms / 1000.0, ms) for ms in event["fresh_ms"]]


def _prepare(bootstrap: str, topic: str, group: str, backlog: int) -> None:
    """The group at offset 0, then the backlog: one-byte records, as docs/benchmarks.md's
    results were measured (the per-record cost is the members' W, not the fetch)."""
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


def _run_one(
    bootstrap: str, kind: str, members: int, o: dict[str, Any], create: Callable[[str, int], None]
) -> GroupRun:
    """One run; ``o``: ``run_group_bench``'s options."""
    topic = group = f"gbench-{uuid.uuid4().hex[:8]}"
    create(topic, 1)
    _prepare(bootstrap, topic, group, o["backlog"])
    fast_conf = {}
    if kind == "group":
        fast_conf = {"parallel.rebalance.group.catchup": True,
                     "parallel.rebalance.group.chunk.records": o["chunk"]}  # fmt: skip
    spec = {"kind": "member", "consumer": kind, "bootstrap": bootstrap, "topics": [topic],
            "group": group, "backlog": o["backlog"], "work_us": o["work_us"], "consume_s": 0.1,
            "fast_conf": fast_conf,
            # a 6 s session, not librdkafka's 45 s: a join that overlapped another member's
            # first poll (2 s in the claims log's start on the embedded cluster, whose
            # controller never answers CreateTopics) had the coordinator wait out a whole
            # session: 42-44 s before a run's first backlog record, in 1 run of 3 per-member
            # and 8 of 9 group runs (the code before issue 48 too), which is not what the
            # kinds are compared on
            "conf": {"enable.auto.commit": False, "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500}}  # fmt: skip
    done = _Processed(members)
    fresh = FreshProducer(bootstrap, [(topic, 0)], o["rate"])
    fresh.start()
    began = time.time()
    drained = False
    with member_processes([spec] * members) as workers:
        try:
            for worker in workers:
                worker.send("go")  # each subscribes as soon as it is up
            deadline = time.monotonic() + o["timeout"]
            while not drained and time.monotonic() < deadline:
                time.sleep(0.2)
                done.take(workers)
                drained = done.covered.as_tuple() == ((0, o["backlog"]),)
            time.sleep(1.0)  # fresh records after the drain count too
            done.take(workers)
        finally:
            fresh.stop()
            with contextlib.suppress(RuntimeError):  # a member that died: its events count
                finish(workers, 30.0)
    # fresh records produced once the group reads (before, the group's join held them:
    # the same for every kind, and part of the backlog plan)
    first = done.first
    fresh_ms = sorted(round(lat, 1) for at, lat in done.fresh if first and at >= first)
    return GroupRun(
        kind=kind,
        members=members,
        drain_s=round(done.last - first, 2) if drained and first else None,
        start_s=round(first - began, 2) if first else None,
        fresh_p50_ms=percentile(fresh_ms, 50),
        fresh_p99_ms=percentile(fresh_ms, 99),
        fresh=len(fresh_ms),
        shares=done.shares,
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
    reps: int = 1,
) -> list[GroupRun]:
    """Every (members, kind) run, ``reps`` times (each repetition runs the kinds of a
    member count one after the other, so that what the machine does meanwhile falls on
    them alike); ``create`` makes a topic (the cluster's own). The defaults are the
    issue's proof, what ``fastrebalance bench --scenario group`` runs."""
    o = {"backlog": backlog, "work_us": work_us, "rate": rate, "chunk": chunk,
         "timeout": timeout_s}  # fmt: skip
    runs = []
    for members, i, kind in itertools.product(member_counts, range(reps), kinds):
        r = _run_one(bootstrap, kind, members, o, create)
        r.rep = i
        out(
            f"{kind} x{members} (repetition {i + 1}): drain {r.drain_s}s (start {r.start_s}s), "
            f"fresh p50 {r.fresh_p50_ms} ms p99 {r.fresh_p99_ms} ms, shares {r.shares}"
        )
        runs.append(r)
    return runs


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def format_table(runs: list[GroupRun], command: str) -> str:
    """One row per (members, kind): the medians over the repetitions, and the ratios as
    the median of each repetition's own ratio (machines are noisy: the kinds of one
    repetition ran minutes apart at most). The owner's fresh latency: the partition's
    fresh records are the owner's primary's alone."""
    by = {(r.kind, r.members, r.rep): r for r in runs}
    rows = list({(r.members, r.kind): None for r in runs})
    reps = sorted({r.rep for r in runs})

    def of(members: int, kind: str) -> list[GroupRun]:
        return [by[(kind, members, i)] for i in reps if (kind, members, i) in by]

    def vs(members: int, kind: str, base: str) -> str:
        return ratio(_median([
            div(r.drain_s, by[(base, members, r.rep)].drain_s)
            for r in of(members, kind) if (base, members, r.rep) in by
        ]))  # fmt: skip

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.2f}"

    def med(members: int, kind: str, field: str) -> str:
        return num(_median([getattr(r, field) for r in of(members, kind)]))

    lines = [
        f"Group-wide catch-up: `{command}`",
        "",
        f"{len(reps)} repetition(s); drain and latencies: medians; ratios: the median of each "
        "repetition's own ratio; shares: the first repetition's.",
        "",
        "| members | kind | drain s | vs catchup | vs plain | owner's fresh p50 ms "
        "| owner's fresh p99 ms | backlog share per member |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {m} | {k} | {med(m, k, 'drain_s')} | {vs(m, k, 'catchup')} | {vs(m, k, 'plain')} "
        f"| {med(m, k, 'fresh_p50_ms')} | {med(m, k, 'fresh_p99_ms')} "
        f"| {', '.join(f'{s:,}' for s in of(m, k)[0].shares)} |"
        for m, k in rows
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
    a.option(p, "--reps", d["reps"], a.number(int, 1), "N",
             "repetitions of each member count (default: {})")
    a.timeout(p, 300.0, "give up on a drain after this long (default: {})")
    a.report_files(p)
    p.set_defaults(func=run_from_args)


def run_from_args(args: argparse.Namespace) -> int:
    """The ``run`` command, and ``fastrebalance bench --scenario group``: bench's own
    namespace gives ``rate``, ``timeout`` and the cluster, ``DEFAULTS`` the rest. The
    printed command names every value used, so that either one is reproduced."""
    # bench's --reps (repetitions of every run) counts here too; its defaults the rest
    o = vars(args) if args.command == "run" else {**vars(args), **DEFAULTS, "reps": args.reps}
    shown = ("backlog", "work_us", "members", "kinds", "rate", "chunk", "reps", "timeout")
    words = [f"--{k.replace('_', '-')} {a.word(o[k])}" for k in shown]
    with Session("gbench", args.bootstrap_servers) as session:
        command = " ".join(["python -m fastrebalance.tools.groupbench run", *words])
        if args.bootstrap_servers:
            command += f" --bootstrap-servers {session.bootstrap}"
        print(f"fastrebalance group bench: {command}", flush=True)

        def create(topic: str, partitions: int) -> None:
            """The cluster's own, registered for the session's cleanup with what the
            members make of it (topic and group share the name)."""
            session.cluster.create_topic(topic, partitions)
            session.topics += [topic, default_claims_topic(topic)]
            session.groups += [topic, f"{topic}.catchup"]

        runs = run_group_bench(
            session.bootstrap, backlog=o["backlog"], work_us=float(o["work_us"]),
            member_counts=o["members"], kinds=o["kinds"], rate=o["rate"], chunk=o["chunk"],
            timeout_s=o["timeout"], out=lambda line: print(line, flush=True), create=create,
            reps=o["reps"],
        )  # fmt: skip
    a.write_report(args, format_table(runs, command), runs)
    return a.EXIT_OK if all(r.drain_s is not None for r in runs) else a.EXIT_CHECK_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrebalance.tools.groupbench")
    add_command(parser.add_subparsers(dest="command", required=True))
    return a.run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
