#!/usr/bin/env python3
"""Backlog drain after a crash, plain confluent-kafka against fastrebalance, on a quiet
and on a loaded CPU.

The ``crash`` scenario of ``fastrebalance bench`` in small: a writer produces ``--rate``
records/s (each valued with its produce time) to 6 partitions; member A processes them
(``--work-us`` of CPU per record, offsets stored after processing, auto-commit every
5 s) and is SIGKILLed; member B, the same program, starts at once and is given all 6
partitions once A's session (``--session-ms``) expires. Measured from that assignment
(the rejoin): to the last record produced before the kill that B processed, and to the
last record below the log end at the rejoin (the whole backlog fastrebalance's child
reads; plain reads the same records first), with ``--load`` busy-loop processes running
from the kill to the end, or none. Dead-member
removal is off, so fastrebalance's child reads the backlog while its primary reads the
fresh records. Runs on a real broker (``--bootstrap-servers``) or on the embedded
cluster.

With ``--trace`` member B also prints, per client, how many records its consume() calls
handed out from each stream while the backlog drained (fastrebalance: the child's
counter), and how long the calls took.

    python benchmarks/drain_under_load.py --loads 0,3 --reps 3 [--bootstrap-servers B]
    python benchmarks/drain_under_load.py --clients plain,before,fastrebalance \
        --before /path/to/older/checkout

Thread ownership: the writer's producer belongs to its thread, every other handle of
the parent to the main thread; each member's consumer to its process's main thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PARTITIONS = 6


# -- the member process ------------------------------------------------------------------
def member(args: argparse.Namespace) -> None:
    """Consume, burn ``work_us`` per record, log each record, store its offset."""
    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
        "session.timeout.ms": args.session_ms,
        "heartbeat.interval.ms": max(args.session_ms // 10, 100),
        "partition.assignment.strategy": "cooperative-sticky",
    }
    if args.client == "plain":
        from confluent_kafka import Consumer
    else:
        sys.path.insert(0, args.root)
        from fastrebalance import Consumer  # type: ignore[assignment]

        assert Path(sys.modules["fastrebalance"].__file__ or "").is_relative_to(args.root)

        conf["enable.parallel.rebalance"] = True
        conf["parallel.rebalance.state.dir"] = args.state_dir
        conf["parallel.rebalance.remove.dead.members"] = False
    consumer = Consumer(conf)
    held: set[int] = set()

    def on_assign(_c: Any, partitions: list[Any]) -> None:
        held.update(p.partition for p in partitions)
        _emit("assign", partitions=sorted(held))

    consumer.subscribe([args.topic], on_assign=on_assign)
    child = getattr(consumer, "_child", None)
    if args.trace and child is not None:
        _trace_calls(consumer, child, args.log + ".calls")
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    work_s = args.work_us / 1e6
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    calls = fresh = backlog = 0
    in_call = in_store = 0.0
    while not stop.is_set():
        before = child.records_delivered if child is not None else 0
        t0 = time.perf_counter()
        if args.loop == "poll":
            m = consumer.poll(0.1)
            msgs = [m] if m is not None and not m.error() else []
        else:
            msgs = [m for m in consumer.consume(500, 0.1) if not m.error()]
        in_call += time.perf_counter() - t0
        from_child = (child.records_delivered - before) if child is not None else 0
        calls += 1
        backlog += from_child
        fresh += len(msgs) - from_child
        lines = []
        for msg in msgs:
            until = time.perf_counter() + work_s
            while time.perf_counter() < until:
                pass
            lines.append(f"{msg.partition()} {msg.offset()} {time.time():.6f}\n")
        if lines:
            os.write(fd, "".join(lines).encode())
            t0 = time.perf_counter()
            for msg in msgs:
                consumer.store_offsets(message=msg)
            in_store += time.perf_counter() - t0
        if args.trace and calls % (50 if args.loop == "consume" else 5000) == 0:
            _emit(
                "trace",
                calls=calls,
                primary=fresh,
                child=backlog,
                in_call_s=in_call,
                in_store_s=in_store,
            )
    os.close(fd)
    consumer.close()


def _trace_calls(consumer: Any, child: Any, path: str) -> None:
    """Log each call on either stream inside fastrebalance's consume(): which, asked,
    got, seconds (the facade's own attributes, shadowed on the instances)."""
    out = open(path, "w")  # noqa: SIM115 - open for the process's life
    delivery = consumer._hot
    batch, child_consume = delivery._batch, child.consume

    def traced_batch(num: int, timeout: float) -> Any:
        t0 = time.perf_counter()
        msgs = batch(num, timeout)
        out.write(f"{t0:.6f} P {num} {timeout} {len(msgs)} {time.perf_counter() - t0:.6f}\n")
        return msgs

    def traced_child(num: int, timeout: float = 0.0) -> Any:
        t0 = time.perf_counter()
        msgs = child_consume(num, timeout)
        if num == 1:  # poll(): too many lines
            return msgs
        out.write(f"{t0:.6f} C {num} {timeout} {len(msgs)} {time.perf_counter() - t0:.6f}\n")
        return msgs

    delivery._batch, child.consume = traced_batch, traced_child


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


# -- the parent --------------------------------------------------------------------------
class _Member:
    def __init__(self, a: argparse.Namespace, role: str, run: dict[str, Any], client: str):
        self.log = Path(run["dir"]) / f"{role}.log"
        cmd = [
            sys.executable, __file__, "--member", "--bootstrap", run["bootstrap"],
            "--topic", run["topic"], "--group", run["group"], "--client", client,
            "--state-dir", str(Path(run["dir"]) / "state"), "--log", str(self.log),
            "--work-us", str(a.work_us), "--session-ms", str(a.session_ms), "--loop", a.loop,
            "--root", a.before if client == "before" else str(Path(__file__).resolve().parents[1]),
        ] + (["--trace"] if a.trace else [])  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                continue

    def processed(self) -> list[tuple[int, int, float]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().split("\n")[:-1]:
            p, o, t = line.split()
            out.append((int(p), int(o), float(t)))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(
    a: argparse.Namespace, bootstrap: str, client: str, load: int, cluster: Any = None
) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastrebalance.tools.crashbench import _watermarks, _Writer

    rid = uuid.uuid4().hex[:8]
    run = {"bootstrap": bootstrap, "topic": f"drain-{rid}", "group": f"drain-{rid}",
           "dir": tempfile.mkdtemp(prefix="drain-under-load-")}  # fmt: skip
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if cluster is not None:  # the mock cluster has no CreateTopics: its server creates it
        cluster.create_topic(run["topic"], PARTITIONS)
    else:
        for f in admin.create_topics([NewTopic(run["topic"], PARTITIONS, 1)]).values():
            f.result(30)
    time.sleep(1.0)
    writer = _Writer(bootstrap, run["topic"], a.rate)
    writer.start()
    first = _Member(a, "A", run, client)
    second: _Member | None = None
    burners: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {"client": client, "load": load}
    try:
        deadline = time.monotonic() + 60
        while not first.processed() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(a.warmup_s)
        burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(load)]
        kill_t = time.time()
        os.kill(first.proc.pid, signal.SIGKILL)
        second = _Member(a, "B", run, client)
        first.proc.wait()
        at_kill = _watermarks(bootstrap, run["topic"])
        by_a = {(p, o) for p, o, _ in first.processed()}
        need = {(p, o) for p in range(PARTITIONS) for o in range(at_kill[p])} - by_a
        give_up = time.monotonic() + a.give_up_s
        done_t = None
        at_rejoin: list[int] | None = None
        while time.monotonic() < give_up:
            if at_rejoin is None and any(
                e["event"] == "assign" and len(e["partitions"]) == PARTITIONS
                for e in list(second.events)
            ):
                at_rejoin = _watermarks(bootstrap, run["topic"])  # a few ms late: an upper bound
            got = {(p, o): t for p, o, t in second.processed()}
            if need <= got.keys() and at_rejoin is not None:
                rest = {(p, o) for p in range(PARTITIONS) for o in range(at_rejoin[p])} - by_a
                if rest <= got.keys():
                    done_t = max(got[k] for k in need)
                    out["rejoin_backlog"] = len(rest)
                    out["all_done_t"] = max(got[k] for k in rest)
                    break
            time.sleep(0.5)
        full = [e for e in second.events
                if e["event"] == "assign" and len(e["partitions"]) == PARTITIONS]  # fmt: skip
        out["backlog"] = len(need)
        if full:
            out["assigned_s"] = full[0]["t"] - kill_t
            if done_t is not None:
                out["drain_s"] = done_t - full[0]["t"]
                out["drain_all_s"] = out.pop("all_done_t") - full[0]["t"]
        traces = [e for e in second.events if e["event"] == "trace"]
        if traces and done_t is not None:
            upto = [e for e in traces if e["t"] <= done_t] or traces[:1]
            last = upto[-1]
            out["trace"] = {
                k: last[k] for k in ("calls", "primary", "child", "in_call_s", "in_store_s")
            }
        return out
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for m in (first, second):
            if m is not None:
                m.stop()
        writer.stop()
        with contextlib.suppress(Exception):
            if cluster is None:
                admin.delete_topics([run["topic"]])[run["topic"]].result(30)
        if a.keep:
            print(f"kept {run['dir']}", flush=True)
        else:
            shutil.rmtree(run["dir"], ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    for name in ("bootstrap", "topic", "group", "client", "state-dir", "log", "root"):
        p.add_argument(f"--{name}", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap-servers", help="a real broker (default: an embedded cluster)")
    p.add_argument(
        "--clients",
        default="plain,fastrebalance",
        help="plain, fastrebalance (this tree), before (the tree at --before)",
    )
    p.add_argument("--before", help="another checkout of fastrebalance, run as client 'before'")
    p.add_argument("--loads", default="0,3", help="busy-loop processes during each measure")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--work-us", type=float, default=200.0)
    p.add_argument("--session-ms", type=int, default=10000)
    p.add_argument("--warmup-s", type=float, default=4.0)
    p.add_argument("--give-up-s", type=float, default=240.0)
    p.add_argument(
        "--loop", choices=("consume", "poll"), default="consume", help="consume(500) or poll()"
    )
    p.add_argument("--trace", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep each run's logs")
    a = p.parse_args()
    if a.member:
        member(a)
        return
    cluster = None
    bootstrap = a.bootstrap_servers
    if bootstrap is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from fastrebalance.testing import EmbeddedKafka

        cluster = EmbeddedKafka()
        bootstrap = cluster.bootstrap_servers
    results: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    try:
        for rep in range(a.reps):
            for load in (int(x) for x in a.loads.split(",")):
                clients = a.clients.split(",")
                if rep % 2:
                    clients.reverse()
                for client in clients:
                    r = measure(a, bootstrap, client, load, cluster)
                    r["rep"] = rep
                    results.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    print(
        f"\n{'embedded cluster' if cluster is not None else bootstrap}; load average (1, 5,"
        f" 15 min) {', '.join(f'{x:.1f}' for x in load_start)} -> "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        "\n| load | client | records produced before the kill: drain s | all records below"
        " the log end at the rejoin: drain s | those records |"
    )
    print("|--:|---|---|---|--:|")
    for load in (int(x) for x in a.loads.split(",")):
        for client in a.clients.split(","):
            mine = [r for r in results if r["load"] == load and r["client"] == client]
            n = [r["rejoin_backlog"] for r in mine if "rejoin_backlog" in r]
            print(
                f"| {load} | {client} | {_cell([r.get('drain_s') for r in mine])} | "
                f"{_cell([r.get('drain_all_s') for r in mine])} | "
                f"{statistics.median(n) if n else 0:.0f} |"
            )


def _cell(values: list[float | None]) -> str:
    """Median (each run); a run that never finished within --give-up-s is a dash."""
    done = [v for v in values if v is not None]
    runs = ", ".join("-" if v is None else f"{v:.1f}" for v in values)
    return f"{statistics.median(done):.1f} ({runs})" if done else f"- ({runs})"


if __name__ == "__main__":
    main()
