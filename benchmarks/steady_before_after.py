#!/usr/bin/env python3
"""Steady-state poll()/consume() cost of two versions of fastrebalance, in one run.

A refactor that claims "no behaviour change" must also not have made the hot path slower.
Run one after the other, the same loop measured minutes apart differs by more than the
overhead being looked for (see ``fastrebalance.tools.bench._worker_throughput``), so here
every consumer lives in one process and they read in short turns, in alternating order:
plain ``confluent_kafka.Consumer`` (the reference), the *before* tree's ``Consumer`` and this
tree's, each with ``enable.parallel.rebalance`` on (``--modes``: off, or both). The
*before* tree is imported under another package name, so both versions run side by side.

    git worktree add /tmp/before <commit>
    python benchmarks/steady_before_after.py --before /tmp/before [--bootstrap-servers B] \
        [--modes on,off]

Prints records/s per loop and version, and each version's ratio to plain.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer as PlainConsumer

from fastrebalance import Consumer as AfterConsumer
from fastrebalance.testing import EmbeddedKafka
from fastrebalance.testing._workload import produce_backlog, watermarks

BLOCK = 10_000
CONF = {
    "auto.offset.reset": "earliest",
    "fetch.queue.backoff.ms": 10,
    "queued.max.messages.kbytes": 1_000_000,
    "queued.min.messages": 10_000_000,
    "enable.auto.commit": False,
}


def load_before(tree: Path) -> Any:
    """The ``fastrebalance`` package of another checkout, as module ``fastrebalance_before``."""
    init = tree / "fastrebalance" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "fastrebalance_before", init, submodule_search_locations=[str(init.parent)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"no fastrebalance package under {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fastrebalance_before"] = module
    spec.loader.exec_module(module)
    return module


def read_block(consumer: Any, loop: str, want: int, deadline: float) -> int:
    n = 0
    if loop == "poll":
        poll = consumer.poll
        while n < want and time.monotonic() < deadline:
            m = poll(1.0)
            if m is not None and m.error() is None:
                n += 1
    else:
        consume = consumer.consume
        while n < want and time.monotonic() < deadline:
            for m in consume(min(1000, want - n), 1.0):
                if m.error() is None:
                    n += 1
    return n


def run_loop(
    makers: dict[str, Any], bootstrap: str, topic: str, loop: str, records: int
) -> dict[str, float]:
    """Records/s of each consumer over the whole topic, read in alternating turns."""
    consumers = {}
    for name, make in makers.items():
        c = make({**CONF, "bootstrap.servers": bootstrap, "group.id": f"ba-{uuid.uuid4().hex}"})
        c.subscribe([topic])
        consumers[name] = c
    deadline = time.monotonic() + 300
    try:
        for c in consumers.values():  # the join and the first fetch are not timed
            while read_block(c, "poll", 1, deadline) < 1:
                pass
        time.sleep(3.0 * len(consumers))  # librdkafka prefetches the topic into each queue
        want = records - 1
        read = dict.fromkeys(consumers, 0)
        seconds = dict.fromkeys(consumers, 0.0)
        turn = 0
        while any(read[n] < want for n in consumers) and time.monotonic() < deadline:
            order = list(consumers) if turn % 2 == 0 else list(reversed(consumers))
            for name in order:
                n = min(BLOCK, want - read[name])
                if n > 0:
                    began = time.perf_counter()
                    read[name] += read_block(consumers[name], loop, n, deadline)
                    seconds[name] += time.perf_counter() - began
            turn += 1
        if any(read[n] < want for n in consumers):
            raise SystemExit(f"{loop}: not every consumer read the topic: {read}")
        return {n: read[n] / seconds[n] for n in consumers}
    finally:
        for c in consumers.values():
            c.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the older version")
    parser.add_argument("--bootstrap-servers", help="a Kafka cluster (default: an embedded one)")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--modes",
        default="on",
        help="enable.parallel.rebalance of both versions: on, off, or on,off (all side by side)",
    )
    args = parser.parse_args()
    before = load_before(args.before)
    modes = [m.strip() for m in args.modes.split(",")]
    makers: dict[str, Any] = {"plain": PlainConsumer}
    for mode in modes:
        on = mode == "on"
        suffix = "" if len(modes) == 1 else f"-{mode}"
        makers[f"before{suffix}"] = lambda conf, on=on: before.Consumer(
            {**conf, "enable.parallel.rebalance": on}
        )
        # the steady state: a fresh group's partitions read in order (with earliest, this
        # version would catch up on a never-committed log: parallel.rebalance.catchup.
        # uncommitted; the tree before knows no such key, and reads it in order)
        makers[f"after{suffix}"] = lambda conf, on=on: AfterConsumer(
            {**conf, "enable.parallel.rebalance": on,
             **({"parallel.rebalance.catchup.uncommitted": False} if on else {})}
        )  # fmt: skip
    cluster = None
    bootstrap = args.bootstrap_servers
    if bootstrap is None:
        cluster = EmbeddedKafka()
        bootstrap = cluster.bootstrap_servers
    try:
        topic = f"before-after-{uuid.uuid4().hex[:8]}"
        admin_probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": "ba-probe"})
        if cluster is not None:
            cluster.create_topic(topic, 1)
        else:
            from confluent_kafka.admin import AdminClient, NewTopic

            AdminClient({"bootstrap.servers": bootstrap}).create_topics([NewTopic(topic, 1)])[
                topic
            ].result()
            time.sleep(2)
        if produce_backlog(bootstrap, topic, 1, args.records):
            raise SystemExit("producing the topic failed")
        records = sum(hi - lo for lo, hi in watermarks(admin_probe, topic, 1))
        admin_probe.close()
        print(
            f"{records:,} records in {topic}; before: {args.before};"
            f" after: {Path(__file__).parents[1]}"
        )
        rows: dict[str, dict[str, list[float]]] = {}
        for rep in range(args.reps):
            for loop in ("poll", "consume"):
                got = run_loop(makers, bootstrap, topic, loop, records)
                for name, per_s in got.items():
                    rows.setdefault(loop, {}).setdefault(name, []).append(per_s)
                print(
                    f"[{rep + 1}/{args.reps}] {loop:7} "
                    + "  ".join(f"{n} {v:,.0f}/s" for n, v in got.items())
                )
        pairs = [(n, n.replace("before", "after")) for n in makers if n.startswith("before")]
        heads = ["plain"]
        for b, a in pairs:
            heads += [b, a, f"{b}/plain", f"{a}/plain", f"{a}/{b}"]
        print("\n" + f"{'loop':8}" + "".join(f" {h:>17}" for h in heads))
        for loop, by in rows.items():
            med = {n: statistics.median(v) for n, v in by.items()}
            cells = [f"{med['plain']:>17,.0f}"]
            for b, a in pairs:
                cells += [f"{med[b]:>17,.0f}", f"{med[a]:>17,.0f}"]
                cells += [f"{med[b] / med['plain']:>17.2f}", f"{med[a] / med['plain']:>17.2f}"]
                cells.append(f"{med[a] / med[b]:>17.2f}")
            print(f"{loop:8} " + " ".join(cells))
        print("(records/s, median of the repetitions; ratios above 1: faster)")
        # The ratio within each repetition (its consumers read in the same minutes), then
        # the median over the repetitions: what the machine does meanwhile cancels out.
        print("\nmedian over the repetitions of the ratio within each:")
        for loop, by in rows.items():
            cells = []
            for b, a in pairs:
                for num, den in ((b, "plain"), (a, "plain"), (a, b)):
                    within = [x / y for x, y in zip(by[num], by[den], strict=True)]
                    cells.append(f"{num}/{den} {statistics.median(within):.2f}")
            print(f"{loop:8} " + "  ".join(cells))
    finally:
        if cluster is not None:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
