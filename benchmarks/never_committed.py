#!/usr/bin/env python3
"""First fresh record after a restart into a group that never committed, with
``auto.offset.reset=earliest``: plain confluent-kafka against fastrebalance with the
never-committed catch-up (``parallel.rebalance.catchup.uncommitted``) off and on.

Why: a brand-new service whose first consumer crashes before its first commit restarts with
no committed offset; with ``earliest`` its whole log is unprocessed. Read in order, every
fresh record waits behind that log (issue 47 measured 18.9 s / 27.5 s to the first fresh
record). With the key on, ``[log start, log end)`` is a backlog like any other: the primary
starts at the log end and the child reads the log in parallel.

Each run, on a topic of its own (4 partitions): ``--backlog`` records are written, then a
producer writes fresh timestamped records at ``--rate``/s while a new consumer, in a group
that never committed, processes every record (``--work-us`` of CPU each) until it has
delivered the whole log and ``--duration`` seconds of fresh records
(``fastrebalance.tools.workload.measure_restart``, the measurement of ``fastrebalance
bench``). The consumer runs in a process of its own; the three variants take turns, the
first one rotating.

    .venv/bin/python benchmarks/never_committed.py [--bootstrap-servers B] [--backlog 200000]
        [--reps 5] [--work-us 20] [--rate 100] [--duration 10]

Prints, per variant, the time to the first fresh record (every run, p50 and max over the
runs), the p50/p99 produce-to-delivery latency of the fresh records of the first
``--duration`` seconds (median over the runs), when the log was all delivered, and losses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrebalance.testing._chaos_check import percentile
from fastrebalance.testing._workload import (
    FreshProducer,
    partition_keys,
    produce_backlog,
    watermarks,
)
from fastrebalance.tools._runner import Session, alternate
from fastrebalance.tools.workload import format_duration, measure_restart

PARTITIONS = 4
PLAIN, OFF, ON = "plain", "uncommitted=false", "uncommitted=true"
VARIANTS = (PLAIN, OFF, ON)


def make(variant: str, conf: dict[str, Any]) -> Any:
    if variant == PLAIN:
        from confluent_kafka import Consumer as PlainConsumer

        return PlainConsumer(conf)
    from fastrebalance import Consumer

    return Consumer({**conf, "enable.parallel.rebalance": True,
                     "parallel.rebalance.catchup.uncommitted": variant == ON})  # fmt: skip


def worker(spec: dict[str, Any]) -> None:
    """One restart, in this process: its RunResult as JSON on stdout."""
    from confluent_kafka import Consumer as PlainConsumer

    probe = PlainConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": "nc-probe"})
    try:
        result = measure_restart(
            lambda conf: make(spec["variant"], conf),
            bootstrap=spec["bootstrap"], topic=spec["topic"], group=spec["group"],
            start=spec["start"], probe=probe, work_us=spec["work_us"], tail_s=2.0,
            run_timeout_s=spec["run_timeout_s"], window_s=spec["duration"],
        )  # fmt: skip
    finally:
        probe.close()
    print(json.dumps(dataclasses.asdict(result)), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", help="a cluster (default: an embedded one)")
    p.add_argument("--backlog", type=int, default=200_000, help="records in the log")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--work-us", type=float, default=20.0, help="CPU per record (µs)")
    p.add_argument("--rate", type=float, default=100.0, help="fresh records/s")
    p.add_argument("--duration", type=float, default=10.0, help="fresh window (s)")
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with Session("nevercommitted", args.bootstrap_servers) as session:
        print(f"{session.description}; log {args.backlog:,} records, {PARTITIONS} partitions, "
              f"fresh {args.rate:g}/s, {args.work_us:g} µs/record", flush=True)  # fmt: skip
        for rep in range(args.reps):
            for variant in alternate(VARIANTS, rep):
                topic = session.topic(f"-{rep}-{VARIANTS.index(variant)}", PARTITIONS)
                produce_backlog(session.bootstrap, topic, PARTITIONS, args.backlog)
                start = [low for low, _high in watermarks(session.probe, topic, PARTITIONS)]
                fresh = FreshProducer(session.bootstrap, partition_keys(topic, PARTITIONS),
                                      args.rate)  # fmt: skip
                fresh.start()
                spec = {"bootstrap": session.bootstrap, "topic": topic, "variant": variant,
                        "group": session.group(f"{rep}-{VARIANTS.index(variant)}"),
                        "start": start, "work_us": args.work_us, "duration": args.duration,
                        "run_timeout_s": args.run_timeout}  # fmt: skip
                try:
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", json.dumps(spec)],
                        capture_output=True, text=True, timeout=args.run_timeout + 60,
                        check=True,
                    )  # fmt: skip
                finally:
                    fresh.stop()
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results[variant].append(r)
                print(f"[{rep + 1}/{args.reps}] {variant}: first fresh "
                      f"{format_duration(r['first_fresh_s'])}, fresh p99 "
                      f"{format_duration(r['fresh_p99_s'])}, log delivered "
                      f"{format_duration(r['backlog_done_s'])}, lost {r['lost']}",
                      flush=True)  # fmt: skip
    print()
    print("| consumer | first fresh, each run | first fresh p50 / max | fresh p50 / p99 "
          "(median of runs) | log delivered (median) | lost |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for variant in VARIANTS:
        rs = results[variant]
        first = sorted(r["first_fresh_s"] for r in rs if r["first_fresh_s"] is not None)

        def med(field: str, rs: list[dict[str, Any]] = rs) -> float | None:
            return percentile(sorted(r[field] for r in rs if r[field] is not None), 50)

        print(f"| {variant} | {', '.join(format_duration(x) for x in first)} | "
              f"{format_duration(percentile(first, 50))} / "
              f"{format_duration(first[-1] if first else None)} | "
              f"{format_duration(med('fresh_p50_s'))} / {format_duration(med('fresh_p99_s'))} | "
              f"{format_duration(med('backlog_done_s'))} | "
              f"{sum(r['lost'] for r in rs)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
