#!/usr/bin/env python3
"""What group-wide catch-up costs a member alone in its group, against per-member catch-up.

One member drains the uneven layout of ``fastrebalance bench --scenario group`` (40,000 /
20,000 / 500 / 1,500 records, chunks of 500, 100 fresh records/s) with the bench's loop:
``consume(500, 0.1)``, 400 µs of waiting work per record, a bare asynchronous commit. Both
kinds do the same reading, so the drain is the application's work plus what the library
adds on its thread. Printed per kind (medians over ``--reps``, the kinds alternating):

* drain: from the first backlog record to the last, and its ratio to per-member's;
* time inside ``consume()`` over the drain, and how much of it was the claims log's tick
  (read the log, claim, absorb the done chunks: ``GroupCatchup.tick``, timed around it);
* calls that handed out no backlog record (the application waited on the library);
  ``--trace`` prints when each came.

    python benchmarks/group_alone_cost.py --reps 3 [--bootstrap-servers B]

Thread ownership: the consumer (and its child and claims log handles) belongs to the main
thread, the fresh producer's to its own thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrebalance import Consumer
from fastrebalance._groupcatchup import GroupCatchup
from fastrebalance.testing._workload import FreshProducer
from fastrebalance.tools._runner import Session
from fastrebalance.tools.groupbench import _prepare

BACKLOGS = (40_000, 20_000, 500, 1_500)
WORK_S = 400e-6
KINDS = ("catchup", "group")


class _TickClock:
    """Seconds spent in ``GroupCatchup.tick`` (wrapped for the run, restored after)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._orig = GroupCatchup.tick

    def __enter__(self) -> _TickClock:
        orig = self._orig

        def timed(catchup: GroupCatchup, now: float) -> None:
            began = time.perf_counter()
            try:
                orig(catchup, now)
            finally:
                self.seconds += time.perf_counter() - began

        GroupCatchup.tick = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_exc: object) -> None:
        GroupCatchup.tick = self._orig  # type: ignore[method-assign]


def drain(session: Session, kind: str, chunk: int) -> dict[str, Any]:
    topic = f"fastrebalance-alone-{session.run_id}-{kind}-{time.monotonic_ns()}"
    session.cluster.create_topic(topic, len(BACKLOGS))
    session.topics.append(topic)
    session.groups.append(topic)
    _prepare(session.bootstrap, topic, topic, BACKLOGS)
    conf: dict[str, Any] = {
        "bootstrap.servers": session.bootstrap, "group.id": topic,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "enable.parallel.rebalance": True,
    }  # fmt: skip
    if kind == "group":
        conf["parallel.rebalance.group.catchup"] = True
        conf["parallel.rebalance.group.chunk.records"] = chunk
    left = {p: set(range(n)) for p, n in enumerate(BACKLOGS)}
    fresh = FreshProducer(session.bootstrap, [(topic, p) for p in range(len(BACKLOGS))], 100)
    fresh.start()
    consumer = Consumer(conf)
    first = inside = 0.0
    idle_calls: list[tuple[float, float]] = []  # (seconds into the drain, the call's)
    try:
        with _TickClock() as ticks:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 300
            tick_at_first = 0.0
            while any(left.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: not drained in 300 s")
                began = time.monotonic()
                msgs = [m for m in consumer.consume(500, 0.1) if m.error() is None]
                took = time.monotonic() - began
                backlog = 0
                for m in msgs:
                    pending = left[m.partition() or 0]
                    if m.offset() in pending:
                        pending.discard(m.offset())
                        backlog += 1
                if first:
                    inside += took
                    if not backlog:
                        idle_calls.append((began - first, took))
                elif backlog:
                    first, tick_at_first = began, ticks.seconds
                time.sleep(len(msgs) * WORK_S)
                if msgs:
                    consumer.commit(asynchronous=True)
            ended = time.monotonic()
            tick_s = ticks.seconds - tick_at_first
    finally:
        consumer.close()
        fresh.stop()
    return {"kind": kind, "drain": ended - first, "inside": inside, "tick": tick_s,
            "idle_calls": len(idle_calls), "idle": idle_calls}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", help="a real broker (default: an embedded cluster)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk", type=int, default=500)
    p.add_argument("--trace", action="store_true", help="print when each call without a "
                   "backlog record came, and how long it took")  # fmt: skip
    a = p.parse_args()
    load_start = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with Session("alone", a.bootstrap_servers) as session:
        for rep in range(a.reps):
            for kind in KINDS if rep % 2 == 0 else reversed(KINDS):
                r = drain(session, kind, a.chunk)
                runs.append(r)
                print(f"repetition {rep + 1}: {kind}: drain {r['drain']:.2f} s, inside "
                      f"consume() {r['inside']:.3f} s (tick {r['tick']:.3f} s), calls "
                      f"without a backlog record {r['idle_calls']}", flush=True)  # fmt: skip
                if a.trace:
                    print("  " + ", ".join(f"{at:.3f}s+{took * 1e3:.0f}ms" for at, took
                                           in r["idle"]), flush=True)  # fmt: skip
        where = session.bootstrap if a.bootstrap_servers else "embedded cluster"

    def med(kind: str, field: str) -> float:
        return float(statistics.median(r[field] for r in runs if r["kind"] == kind))

    base = med("catchup", "drain")
    print(f"\none member, backlogs {'/'.join(map(str, BACKLOGS))}, chunks of {a.chunk}, "
          f"{a.reps} repetition(s), medians; {where}; load average "
          f"{load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| kind | drain s | vs per-member | inside consume() s | claims-log tick s "
          "| calls without a backlog record |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for kind, name in (("catchup", "per-member"), ("group", "group-wide")):
        print(f"| {name} | {med(kind, 'drain'):.2f} | {med(kind, 'drain') / base:.3f}x | "
              f"{med(kind, 'inside'):.3f} | {med(kind, 'tick'):.3f} | "
              f"{med(kind, 'idle_calls'):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
