#!/usr/bin/env python3
"""Whose is the fresh-record p99 under ``group.protocol=consumer`` (KIP-848)?

Why: a catch-up on Apache Kafka 4 once measured a fresh-record p99 of 7.6 ms under the
classic protocol and 26.2 ms under the consumer protocol. This script tells librdkafka's
share from fastrebalance's: in one run, on one broker, it restarts the same kind of group
with plain confluent-kafka and with fastrebalance, under each protocol, with no backlog
(no catch-up: whatever differs is the protocol's) and with a backlog of B records (a
catch-up: the child reads it beside the primary), in turns whose order rotates, so that the
load of the rest of the machine falls on every case alike.

Each run is ``fastrebalance bench``'s recovery run (``tools.workload.measure_restart``,
the same loop, conf and fresh producer: 100-byte records at ``--rate`` per second over 4
partitions, ``fetch.wait.max.ms=10``), in a process of its own. On top of the bench's
numbers it reports *where* in the run the fresh tail lies: the p99 of the records produced
in the first ``--early`` seconds after the consumer's first assignment (``on_assign``)
against those produced later, and the worst records with their produce times. With
``--debug CONTEXTS`` each worker also counts librdkafka's log lines of the primary's
``cgrp`` context (heartbeats, assignments) and times its first fetch of each partition.

    .venv/bin/python benchmarks/protocol_latency.py --bootstrap 127.0.0.1:26192 \\
        [--reps 3] [--backlog 400000] [--window 10] [--cases all] [--debug cgrp,fetch]

Needs a broker that serves KIP-848 to librdkafka (Apache Kafka 4). Results and reading:
docs/benchmarks.md, "Apache Kafka 4: classic and consumer protocols".
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import queue
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrebalance.testing import _workload as wl
from fastrebalance.testing._chaos_check import percentile
from fastrebalance.tools import _runner
from fastrebalance.tools._runner import FAST, PLAIN, Session, alternate, median
from fastrebalance.tools.workload import RunResult, format_duration

#: (consumer, group protocol, backlog?) of every case; plain with a backlog replays it in
#: order (the bench's recovery table has that), which says nothing about the protocol.
CASES = {
    "pc0": (PLAIN, "classic", False),
    "pk0": (PLAIN, "consumer", False),
    "fc0": (FAST, "classic", False),
    "fk0": (FAST, "consumer", False),
    "fcB": (FAST, "classic", True),
    "fkB": (FAST, "consumer", True),
}
_MODULE = "benchmarks.protocol_latency"
#: suffix of a case run from ``--baseline``'s checkout
BASE = "-base"
_WORST = 12  # worst records kept per run
#: librdkafka's log lines counted per run (``--debug``): the group's life as the primary
#: sees it. A name each, then the pattern; a line counts for the first that matches.
_LOG_EVENTS = (
    ("heartbeat sent", re.compile(r"Sent ConsumerGroupHeartbeatRequest|Sent HeartbeatRequest")),
    ("assignment", re.compile(r"assignment|Assignment")),
    ("fetch start", re.compile(r"Fetch topic .* at offset|Partition .* start fetching")),
)


# ------------------------------------------------------------------------------ the worker
def _worker(spec: dict[str, Any], _commands: queue.Queue[str]) -> dict[str, Any]:
    from confluent_kafka import Consumer as PlainConsumer

    from fastrebalance.tools.bench import make_consumer
    from fastrebalance.tools.workload import measure_restart

    kind, args = spec["consumer"], spec["args"]
    samples: list[tuple[float, float]] = []
    extra: dict[str, Any] = {}
    events: dict[str, list[float]] = {}
    t0 = time.time()
    if spec["debug"] and spec.get("log_path"):
        # librdkafka's own lines on stderr carry the time they were logged; given a Python
        # logger they would carry the time a poll() served them (late by whatever kept the
        # application's thread busy). Our lines: the same clock, the same file.
        log = open(spec["log_path"], "w")  # noqa: SIM115
        os.dup2(log.fileno(), 2)
        extra = {"debug": spec["debug"]}
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(created).3f|%(name)s|%(message)s"))
        ours = logging.getLogger("fastrebalance")
        ours.addHandler(handler)
        ours.setLevel(logging.DEBUG)
        print(f"{time.time():.3f}|restart", file=sys.stderr, flush=True)
    elif spec["debug"]:

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = record.getMessage()
                for name, pattern in _LOG_EVENTS:
                    if pattern.search(text):
                        events.setdefault(name, []).append(time.time() - t0)
                        break

        logger = logging.getLogger("protocol_latency.rdkafka")
        logger.addHandler(Keep())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        extra = {"debug": spec["debug"], "logger": logger}
    probe = PlainConsumer({"bootstrap.servers": args["bootstrap"], "group.id": "protocol-probe"})
    made: list[Any] = []

    def make(conf: dict[str, Any]) -> Any:
        made.append(make_consumer(kind, {**conf, **extra}))
        return made[-1]

    try:
        t0 = time.time()
        result = measure_restart(
            make,
            probe=probe,
            on_fresh=lambda produced, latency: samples.append((produced, latency)),
            **args,
        )
    finally:
        probe.close()
    # fastrebalance: how long its rebalance callback planned and opened the assignment
    # (the user's thread is held meanwhile)
    snapshot = getattr(made[0], "metrics_snapshot", None) if made else None
    plan = (snapshot() or {}).get("last_plan") if snapshot is not None else None
    return {"result": dataclasses.asdict(result), "samples": samples, "events": events,
            "plan_s": plan.get("seconds") if plan else None}  # fmt: skip


# ------------------------------------------------------------------------------ the runs
@dataclasses.dataclass(frozen=True)
class Run:
    case: str
    rep: int
    result: RunResult
    samples: tuple[tuple[float, float], ...]
    events: dict[str, list[float]]
    plan_s: float | None = None  #: fastrebalance's last plan, callback included

    def split(self, early_s: float) -> tuple[int, float | None, float | None, int]:
        """The fresh records produced before the first assignment (how many), the p99 of
        those produced from it to ``early_s`` after, the p99 of the later ones, and how
        many of the worst 1 % were produced before ``early_s`` after the assignment."""
        joined = self.result.joined_s or 0.0
        before = sum(p < joined for p, _ in self.samples)
        early = sorted(lat for p, lat in self.samples if joined <= p < joined + early_s)
        late = sorted(lat for p, lat in self.samples if p >= joined + early_s)
        worst = sorted(self.samples, key=lambda s: s[1])[-max(1, len(self.samples) // 100) :]
        return (before, percentile(early, 99), percentile(late, 99),
                sum(p < joined + early_s for p, _ in worst))  # fmt: skip


def run_all(o: argparse.Namespace, out: _runner.Out = print) -> list[Run]:
    runs: list[Run] = []
    cases = list(CASES) if o.cases == "all" else o.cases.split(",")
    if o.baseline:  # every case with a backlog also from the baseline checkout
        cases += [c + BASE for c in cases if CASES[c][2]]
    with Session("protolat", o.bootstrap, None, out) as session:
        topic, bootstrap = session.topic("", o.partitions), session.bootstrap
        fresh = wl.FreshProducer(bootstrap, wl.partition_keys(topic, o.partitions), o.rate)
        fresh.start()
        session.later(fresh.stop)
        for rep in range(o.reps):
            for case in alternate(cases, rep):
                kind, protocol, backlog = CASES[case.removesuffix(BASE)]
                asked = o.backlog if backlog else 0
                if asked:
                    wl.produce_backlog(bootstrap, topic, o.partitions, asked)
                marks = wl.watermarks(session.probe, topic, o.partitions)
                share = [asked // o.partitions + (p < asked % o.partitions)
                         for p in range(o.partitions)]  # fmt: skip
                start = [max(lo, hi - n) for (lo, hi), n in zip(marks, share, strict=True)]
                group = session.group(f"{case}-{rep}")
                wl.set_group_offsets(bootstrap, topic, group, start)
                args = {"bootstrap": bootstrap, "topic": topic, "group": group, "start": start,
                        "work_us": o.work_us, "tail_s": 0.3, "run_timeout_s": 300.0,
                        "window_s": o.window, "group_protocol": protocol}  # fmt: skip
                spec = {"kind": "run", "consumer": kind, "args": args, "debug": o.debug,
                        "log_path": f"{o.log_dir}/{case}-{rep}.log" if o.log_dir else None}
                # a worker imports the package from _runner's root (a baseline: that one)
                root = _runner._PACKAGE_ROOT
                if case.endswith(BASE):
                    _runner._PACKAGE_ROOT = o.baseline
                try:
                    got = _runner.run_worker(_MODULE, spec, 360.0)
                finally:
                    _runner._PACKAGE_ROOT = root
                result = _runner.revive(RunResult, got["result"])
                samples = tuple((p, lat) for p, lat in got["samples"])
                run = Run(case, rep, result, samples, got["events"], got.get("plan_s"))
                runs.append(run)
                before, early, late, worst_early = run.split(o.early)
                d = format_duration
                out(f"[{rep + 1}/{o.reps}] {case} {kind} {protocol} B={asked:,}: joined"
                    f" {d(result.joined_s)}, first fresh {d(result.first_fresh_s)}, p50"
                    f" {d(result.fresh_p50_s)}, p99 {d(result.fresh_p99_s)} ({before} produced"
                    f" before the assignment; p99 of the first {o.early:g} s after it"
                    f" {d(early)}, later {d(late)}; {worst_early} of the worst 1 % before"
                    f" or in the first {o.early:g} s),"
                    f" max {d(result.fresh_max_s)}, via child {result.fresh_out_of_order},"
                    f" plan {d(run.plan_s)},"
                    f" backlog {d(result.backlog_done_s)}, lost {result.lost}")  # fmt: skip
                if o.verbose:
                    worst = sorted(samples, key=lambda s: s[1])[-_WORST:]
                    out("    worst (produced s after restart, latency ms): " + ", ".join(
                        f"{p:.2f}:{lat * 1000:.0f}" for p, lat in reversed(worst)))
                    for name, times in sorted(run.events.items()):
                        out(f"    {name}: {len(times)} lines, first at "
                            + ", ".join(f"{t:.3f}" for t in times[:6]) + " s")
        fresh.stop()
    return runs


def report(runs: list[Run], o: argparse.Namespace) -> str:
    header = ["case", "consumer", "protocol", "B", "joined", "first fresh", "fresh p50",
              "fresh p99", "produced before assign", f"p99, first {o.early:g} s after",
              "p99, later", "worst 1 % before or early",
              "fresh max", "via child", "backlog delivered", "plan (in on_assign)",
              "first fresh - joined", "p99 ÷ classic p99"]  # fmt: skip
    rows = []
    d = format_duration
    names = [n for c in CASES for n in (c, c + BASE)]
    for case in names:
        kind, protocol, backlog = CASES[case.removesuffix(BASE)]
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        twin = case.replace("k", "c", 1) if protocol == "consumer" else case
        classic = {r.rep: r.result.fresh_p99_s for r in runs if r.case == twin}

        def med(name: str, mine: list[Run] = mine) -> Any:
            return median(getattr(r.result, name) for r in mine)

        paired = median(_runner.div(r.result.fresh_p99_s, classic.get(r.rep)) for r in mine)
        rows.append([case, kind, protocol, f"{o.backlog:,}" if backlog else "0",
                     d(med("joined_s")), d(med("first_fresh_s")), d(med("fresh_p50_s")),
                     d(med("fresh_p99_s")), f"{median(r.split(o.early)[0] for r in mine):.0f}",
                     d(median(r.split(o.early)[1] for r in mine)),
                     d(median(r.split(o.early)[2] for r in mine)),
                     f"{median(r.split(o.early)[3] for r in mine):.0f}",
                     d(med("fresh_max_s")),
                     f"{med('fresh_out_of_order'):.0f}",
                     d(med("backlog_done_s")) if backlog else "-",
                     d(median(r.plan_s for r in mine)),
                     d(median((r.result.first_fresh_s or 0)
                              - (r.result.joined_s or 0) for r in mine)),
                     _runner.ratio(paired)])  # fmt: skip
    lost = sum(r.result.lost for r in runs)
    return "\n".join([*_runner.md_table(header, rows, left=3), "",
                      f"Medians of {o.reps} repetition(s); ratios paired within a repetition."
                      f" {lost:,} records lost."])  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backlog", type=int, default=400_000)
    p.add_argument("--window", type=float, default=10.0, help="fresh-latency window, s")
    p.add_argument("--early", type=float, default=1.0,
                   help="seconds after the first assignment that count as early")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--work-us", type=float, default=0.0)
    p.add_argument("--cases", default="all", help=f"comma-separated of {', '.join(CASES)}")
    p.add_argument("--baseline", metavar="DIR", help="a checkout of the library (its own "
                   "benchmarks/protocol_latency.py too) whose catch-up runs beside this one's,"
                   " in the same turns: cases with a backlog, again as CASE-base")
    p.add_argument("--debug", default="", help="librdkafka debug contexts, e.g. cgrp,fetch")
    p.add_argument("--log-dir", help="with --debug: every librdkafka and fastrebalance log"
                   " line of each run (unix time) in DIR/CASE-REP.log, instead of the counts")
    p.add_argument("-v", "--verbose", action="store_true", help="worst records, log events")
    o = p.parse_args()
    began = time.monotonic()
    print(f"command: {' '.join(sys.argv)}", flush=True)
    print(_runner.machine_line({**_runner.machine_info(), "loadavg_start": _runner.loadavg()},
                               o.bootstrap), flush=True)  # fmt: skip
    runs = run_all(o, lambda line: print(line, flush=True))
    print()
    print(report(runs, o))
    print(f"wall {time.monotonic() - began:.0f} s; load average now {_runner.loadavg()}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(_runner.worker_main({"run": _worker}))
    sys.exit(main())
