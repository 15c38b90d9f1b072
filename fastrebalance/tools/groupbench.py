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
from dataclasses import dataclass, field
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
#: The issue's proof: what ``fastrebalance bench --scenario group`` runs. Two layouts: one
#: partition's backlog (the members split it or not at all), and uneven backlogs over four
#: partitions (issue 45: small partitions beside big ones, chunks of 500).
DEFAULT_BACKLOGS: tuple[tuple[int, ...], ...] = ((40_000, 20_000, 500, 1_500), (60_000,))
DEFAULTS = {"backlogs": DEFAULT_BACKLOGS, "work_us": 400.0,
            "members": (1, 2, 3, 4), "kinds": KINDS, "chunk": 500, "reps": 1}  # fmt: skip
#: The targets (issue 45): group-wide catch-up never slower than per-member catch-up, the
#: small partitions never done later, and at most this much of plain's drain at 3 members.
TARGET_VS_PLAIN = 0.40
TARGET_MEMBERS = 3
#: A partition is *small* if its backlog is at most this share of the layout's largest.
SMALL_SHARE = 0.1


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
    backlogs: tuple[int, ...] = (0,)
    #: per partition: when its last backlog record was processed, from the run's first
    #: processed record (None: not drained)
    done_s: list[float | None] = field(default_factory=list)


def layout_name(backlogs: Sequence[int]) -> str:
    return "/".join(f"{b:,}" for b in backlogs)


def small_partitions(backlogs: Sequence[int]) -> list[int]:
    """The partitions whose finish the target watches: the small ones beside a big one."""
    if len(backlogs) < 2:
        return []
    return [p for p, b in enumerate(backlogs) if b <= SMALL_SHARE * max(backlogs)]


class _Processed:
    """What the members processed, merged from their ``processed`` events."""

    def __init__(self, members: int, backlogs: Sequence[int]) -> None:
        self.shares = [0] * members
        self.covered = [RangeSet() for _ in backlogs]
        self.whole = [((0, b),) if b else () for b in backlogs]
        self.first: float | None = None
        self.last = [0.0] * len(backlogs)
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
        for partition, start, end in event["backlog"]:
            self.covered[partition].add(start, end)
            self.shares[member] += end - start
            self.last[partition] = max(self.last[partition], t)
        self.fresh += [(t - ms / 1000.0, ms) for ms in event["fresh_ms"]]

    def drained(self, partition: int | None = None) -> bool:
        parts = range(len(self.covered)) if partition is None else [partition]
        return all(self.covered[p].as_tuple() == self.whole[p] for p in parts)


def _prepare(bootstrap: str, topic: str, group: str, backlogs: Sequence[int]) -> None:
    """The group at offset 0 of every partition, then the backlogs: one-byte records, as
    docs/benchmarks.md's results were measured (the per-record cost is the members' W, not
    the fetch)."""
    set_group_offsets(bootstrap, topic, group, [0] * len(backlogs))
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for partition, backlog in enumerate(backlogs):
        for i in range(backlog):
            while True:
                try:
                    p.produce(topic, value=b"0", partition=partition)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 20000 == 0:
                p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("backlog not delivered")


def _run_one(
    bootstrap: str,
    kind: str,
    members: int,
    backlogs: Sequence[int],
    o: dict[str, Any],
    create: Callable[[str, int], None],
) -> GroupRun:
    """One run; ``o``: ``run_group_bench``'s options."""
    topic = group = f"gbench-{uuid.uuid4().hex[:8]}"
    create(topic, len(backlogs))
    _prepare(bootstrap, topic, group, backlogs)
    fast_conf = {}
    if kind == "group":
        fast_conf = {"parallel.rebalance.group.catchup": True,
                     "parallel.rebalance.group.chunk.records": o["chunk"]}  # fmt: skip
    spec = {"kind": "member", "consumer": kind, "bootstrap": bootstrap, "topics": [topic],
            "group": group, "backlogs": list(backlogs), "work_us": o["work_us"],
            "consume_s": 0.1, "fast_conf": fast_conf,
            # a 6 s session, not librdkafka's 45 s: a join that overlapped another member's
            # first poll (2 s in the claims log's start on the embedded cluster, whose
            # controller never answers CreateTopics) had the coordinator wait out a whole
            # session: 42-44 s before a run's first backlog record, in 1 run of 3 per-member
            # and 8 of 9 group runs (the code before issue 48 too), which is not what the
            # kinds are compared on
            "conf": {"enable.auto.commit": False, "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500}}  # fmt: skip
    done = _Processed(members, backlogs)
    fresh = FreshProducer(bootstrap, [(topic, p) for p in range(len(backlogs))], o["rate"])
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
                drained = done.drained()
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
    done_s = [
        round(done.last[p] - first, 2) if first and backlogs[p] and done.drained(p) else None
        for p in range(len(backlogs))
    ]
    return GroupRun(
        kind=kind,
        members=members,
        drain_s=round(max(done.last) - first, 2) if drained and first else None,
        start_s=round(first - began, 2) if first else None,
        fresh_p50_ms=percentile(fresh_ms, 50),
        fresh_p99_ms=percentile(fresh_ms, 99),
        fresh=len(fresh_ms),
        shares=done.shares,
        backlogs=tuple(backlogs),
        done_s=done_s,
    )


def run_group_bench(
    bootstrap: str,
    backlogs: Sequence[Sequence[int]] = DEFAULT_BACKLOGS,
    work_us: float = 400.0,
    member_counts: Sequence[int] = (1, 2, 3),
    kinds: Sequence[str] = KINDS,
    rate: float = 200,
    chunk: int = 500,
    timeout_s: float = 300.0,
    out: Callable[[str], None] = print,
    *,
    create: Callable[[str, int], None],
    reps: int = 1,
) -> list[GroupRun]:
    """Every (layout, members, kind) run, ``reps`` times (each repetition runs the kinds
    of a member count one after the other, so that what the machine does meanwhile falls
    on them alike); ``backlogs``: the layouts, each a backlog per partition; ``create``
    makes a topic (the cluster's own). The defaults are the issue's proof, what
    ``fastrebalance bench --scenario group`` runs."""
    o = {"work_us": work_us, "rate": rate, "chunk": chunk, "timeout": timeout_s}
    runs = []
    for layout, members, i, kind in itertools.product(
        backlogs, member_counts, range(reps), kinds
    ):
        r = _run_one(bootstrap, kind, members, tuple(layout), o, create)
        r.rep = i
        out(
            f"{layout_name(layout)} {kind} x{members} (repetition {i + 1}): drain {r.drain_s}s "
            f"(start {r.start_s}s), partitions done {r.done_s} s, fresh p50 "
            f"{r.fresh_p50_ms} ms p99 {r.fresh_p99_ms} ms, shares {r.shares}"
        )
        runs.append(r)
    return runs


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _small_done(r: GroupRun) -> float | None:
    """When the last small partition was done (None: no small one, or not drained)."""
    small = small_partitions(r.backlogs)
    times = [r.done_s[p] for p in small] if small and r.done_s else []
    return None if not times or None in times else max(t for t in times if t is not None)


class _Runs:
    """The runs of one layout, by (kind, members, repetition)."""

    def __init__(self, runs: Sequence[GroupRun]) -> None:
        self.by = {(r.kind, r.members, r.rep): r for r in runs}
        self.reps = sorted({r.rep for r in runs})

    def of(self, members: int, kind: str) -> list[GroupRun]:
        return [self.by[(kind, members, i)] for i in self.reps if (kind, members, i) in self.by]

    def vs(self, members: int, kind: str, base: str,
           value: Callable[[GroupRun], float | None]) -> float | None:  # fmt: skip
        """The median of each repetition's own ratio."""
        return _median([
            div(value(r), value(self.by[(base, members, r.rep)]))
            for r in self.of(members, kind) if (base, members, r.rep) in self.by
        ])  # fmt: skip


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "not measured"
    return "**met**" if round(value, 2) <= limit else "**not met**"


def format_table(runs: list[GroupRun], command: str) -> str:
    """Per layout, one row per (members, kind): the medians over the repetitions, and the
    ratios as the median of each repetition's own ratio (machines are noisy: the kinds of
    one repetition ran minutes apart at most); then the targets, met or not."""
    layouts = list({r.backlogs: None for r in runs})
    reps = len({r.rep for r in runs})
    lines = [
        f"Group-wide catch-up: `{command}`",
        "",
        f"{reps} repetition(s); drain, partition finishes and latencies: medians; ratios: "
        "the median of each repetition's own ratio; shares: the first repetition's. "
        "plain: confluent-kafka (no catch-up at all); catchup: per-member catch-up; group: "
        "group-wide catch-up. *small done*: when the last partition whose backlog is at "
        f"most {SMALL_SHARE:.0%} of the largest finished, from the run's first processed record.",
    ]
    for layout in layouts:
        lines += _layout_table(layout, [r for r in runs if r.backlogs == layout])
    return "\n".join(lines) + "\n"


def _layout_table(layout: tuple[int, ...], runs: list[GroupRun]) -> list[str]:
    g = _Runs(runs)
    rows = list({(r.members, r.kind): None for r in runs})
    small = small_partitions(layout)
    kinds = {r.kind for r in runs}

    def med(members: int, kind: str, value: Callable[[GroupRun], float | None]) -> str:
        return _num(_median([value(r) for r in g.of(members, kind)]))

    def drain(r: GroupRun) -> float | None:
        return r.drain_s

    lines = [
        "",
        f"Backlogs per partition: {layout_name(layout)}"
        + (f" (small: partition {', '.join(map(str, small))})" if small else ""),
        "",
        "| members | kind | drain s | vs catchup | vs plain | small done s | small vs catchup "
        "| owner's fresh p50 ms | owner's fresh p99 ms | backlog share per member |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {m} | {k} | {med(m, k, drain)} | {ratio(g.vs(m, k, 'catchup', drain))} "
        f"| {ratio(g.vs(m, k, 'plain', drain))} | {med(m, k, _small_done)} "
        f"| {ratio(g.vs(m, k, 'catchup', _small_done))} "
        f"| {med(m, k, lambda r: r.fresh_p50_ms)} | {med(m, k, lambda r: r.fresh_p99_ms)} "
        f"| {', '.join(f'{s:,}' for s in g.of(m, k)[0].shares)} |"
        for m, k in rows
    ]
    if "group" not in kinds:
        return lines
    lines += ["", "| target | members | measured | verdict |", "|---|---:|---:|---|"]
    for m in sorted({r.members for r in runs}):
        if "catchup" in kinds:
            v = g.vs(m, "group", "catchup", drain)
            lines.append(f"| group drain <= per-member's | {m} | {ratio(v)} | {_verdict(v, 1.0)} |")
            if small:
                v = g.vs(m, "group", "catchup", _small_done)
                lines.append(
                    f"| small partitions done no later than per-member | {m} | {ratio(v)} "
                    f"| {_verdict(v, 1.0)} |"
                )
        if m == TARGET_MEMBERS and "plain" in kinds:
            v = g.vs(m, "group", "plain", drain)
            lines.append(
                f"| group drain <= {TARGET_VS_PLAIN:.2f}x plain's | {m} | {ratio(v)} "
                f"| {_verdict(v, TARGET_VS_PLAIN)} |"
            )
    return lines


# ------------------------------------------------------------------ the command
def layouts(text: str) -> tuple[tuple[int, ...], ...]:
    """An argparse ``type=`` for ``40000,20000,500,1500/60000``: layouts separated by
    ``/``, each a backlog per partition."""
    one = a.number_list(int, 0)
    got = tuple(tuple(int(b) for b in one(part)) for part in text.split("/"))
    if any(not any(layout) for layout in got):
        raise argparse.ArgumentTypeError(f"{text!r}: a layout with no backlog")
    return got


def add_command(commands: a.Commands) -> None:
    """``python -m fastrebalance.tools.groupbench run``: the options ``fastrebalance bench
    --scenario group`` leaves at the defaults of the issue's proof."""
    p = a.command(commands, "run", "group-wide catch-up", [
        "Backlogs drained by 1-4 member processes, three ways: plain confluent-kafka, "
        "per-member catch-up, group-wide catch-up; the targets of issue 45 marked met or "
        "not (docs/benchmarks.md)."
    ])  # fmt: skip
    d = DEFAULTS
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one")
    p.add_argument("--backlogs", default=d["backlogs"], type=layouts, metavar="N,.../...",
                   help="layouts, separated by /: the backlog of each partition (default: "
                   f"{'/'.join(a.word(x) for x in DEFAULT_BACKLOGS)})")
    a.option(p, "--work-us", d["work_us"], a.number(float, 0), "W",
             "waiting work per record, microseconds (default: {})")
    a.option(p, "--members", d["members"], a.number_list(int, 1), "N,...",
             "member processes, one run each (default: {})")
    a.option(p, "--kinds", KINDS, a.name_list(KINDS), "LIST", "kinds to run (default: {})")
    a.rate(p, 200, "fresh records per second over all partitions (default: {})")
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
    shown = ("work_us", "members", "kinds", "rate", "chunk", "reps", "timeout")
    words = [f"--backlogs {'/'.join(a.word(x) for x in o['backlogs'])}"]
    words += [f"--{k.replace('_', '-')} {a.word(o[k])}" for k in shown]
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
            session.bootstrap, backlogs=o["backlogs"], work_us=float(o["work_us"]),
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
