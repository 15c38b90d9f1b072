#!/usr/bin/env python3
"""Recovery after a SIGKILL, measured from the kill: plain confluent-kafka against
fastrebalance with the removal of dead members off and on, under both group protocols.

Why: a user measures a crash from the crash. A SIGKILLed member never leaves its group,
and the group waits for its session to expire (45 s by default under either protocol)
before anyone gets its partitions; fastrebalance's catch-up only shortens what comes
after that wait, and the removal of dead members at start (docs/operations.md, "Recovery
time after a crash") shortens the wait itself. Run it on a broker at Kafka's real group
defaults (``group.min.session.timeout.ms``, ``group.consumer.min.session.timeout.ms``,
``group.initial.rebalance.delay.ms`` and ``group.consumer.min.heartbeat.interval.ms`` not
lowered), or the numbers say nothing about production.

Each run, on a fresh topic (6 partitions) and group: a writer produces ``--rate`` records/s
(each valued with its produce time); member A, a subprocess, processes them (``--work-us``
of CPU per record, offsets stored after processing, the client's auto-commit every 5 s)
for ``--warmup`` seconds and is SIGKILLed; a new process B, the same program with the
same config, is started at once, as a supervisor would (so interpreter start-up and
imports are counted). From the kill: B's first assignment of all 6 partitions, B's first
processed record produced after the kill, B's first fresh record (produced after the kill
and processed less than 1 s after it was produced: B is back at the live end of the log),
and the moment every record produced before the
kill had been processed by A or B (backlog done). Then the writer stops, and once A and B
together have processed every record, or ``--give-up`` seconds after the kill, B stops:
``lost`` counts records no one processed, ``duplicates`` records processed more than once.

    .venv/bin/python benchmarks/recovery_time.py --bootstrap 127.0.0.1:9092 [--reps 3]
        [--protocols classic,consumer] [--clients plain,off,on]

Cases: ``plain`` (confluent_kafka.Consumer), ``off`` (fastrebalance,
``parallel.rebalance.remove.dead.members=false``), ``on`` (fastrebalance, its default).
The consumer protocol needs Apache Kafka 4.0 or later.
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
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTITIONS = 6
#: A record is fresh when processed less than this long after it was produced: the
#: consumer is back at the live end of the log (a record produced just after the kill and
#: read 45 s later is not)
FRESH_LAG_S = 1.0
CLIENTS = {
    "plain": "confluent-kafka",
    "off": "fastrebalance, removal off",
    "on": "fastrebalance, removal on",
}


# -- the member process (A and B alike) ----------------------------------------------------------
def run_member(args: argparse.Namespace) -> None:
    """Consume, burn ``work_us`` per record, log each processed record, store its offset."""
    started = time.time()
    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
    }
    if args.protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf["partition.assignment.strategy"] = "cooperative-sticky"
    if args.client == "plain":
        from confluent_kafka import Consumer
    else:
        from fastrebalance import Consumer

        conf["enable.parallel.rebalance"] = True
        conf["parallel.rebalance.state.dir"] = args.state_dir
        conf["parallel.rebalance.remove.dead.members"] = args.client == "on"
    emit("imported", since_start=time.time() - started)
    consumer = Consumer(conf)
    held: set[int] = set()

    def on_assign(_c: Any, partitions: list[Any]) -> None:
        held.update(p.partition for p in partitions)
        emit("assign", partitions=sorted(held))

    def on_revoke(_c: Any, partitions: list[Any]) -> None:
        held.difference_update(p.partition for p in partitions)

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    kill_t = args.kill_t
    fresh_said = after_said = False
    work_s = args.work_us / 1e6
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        msgs = consumer.consume(500, 0.1)
        lines = []
        for msg in msgs:
            if msg.error():
                continue
            until = time.perf_counter() + work_s
            while time.perf_counter() < until:
                pass
            now = time.time()
            lines.append(f"{msg.partition()} {msg.offset()} {now:.6f}\n")
            produced = float(msg.value() or b"0")
            if kill_t and produced > kill_t:
                if not after_said:
                    after_said = True
                    emit("after_kill", partition=msg.partition(), offset=msg.offset())
                if not fresh_said and now - produced < FRESH_LAG_S:
                    fresh_said = True
                    emit("fresh", partition=msg.partition(), offset=msg.offset())
        if lines:
            os.write(fd, "".join(lines).encode())  # logged before its offset is stored
            for msg in msgs:
                if not msg.error():
                    consumer.store_offsets(message=msg)
    os.close(fd)
    consumer.close()


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


# -- the parent ----------------------------------------------------------------------------------
class Writer(threading.Thread):
    """``rate`` records/s round-robin over the partitions, each valued with its send time."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.period = topic, 1.0 / rate
        self.done = threading.Event()

    def run(self) -> None:
        next_t, i = time.monotonic(), 0
        while not self.done.is_set():
            self.producer.produce(
                self.topic, value=f"{time.time():.6f}".encode(), partition=i % PARTITIONS
            )
            self.producer.poll(0)
            i += 1
            next_t += self.period
            if (pause := next_t - time.monotonic()) > 0:
                time.sleep(pause)

    def stop(self) -> None:
        self.done.set()
        self.join()
        assert self.producer.flush(30) == 0


class Member:
    def __init__(self, args: argparse.Namespace, role: str, run: dict[str, Any], kill_t: float):
        self.log = Path(run["dir"]) / f"{role}.log"
        cmd = [
            sys.executable, __file__, "--member", "--bootstrap", args.bootstrap,
            "--topic", run["topic"], "--group", run["group"], "--protocol", run["protocol"],
            "--client", run["client"], "--state-dir", str(Path(run["dir"]) / "state"),
            "--log", str(self.log), "--work-us", str(args.work_us), "--kill-t", str(kill_t),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def first(self, name: str, pred: Any = None) -> dict[str, Any] | None:
        for ev in list(self.events):
            if ev["event"] == name and (pred is None or pred(ev)):
                return ev
        return None

    def processed(self) -> list[tuple[int, int, float]]:
        out = []
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                p, o, t = line.split()
                out.append((int(p), int(o), float(t)))
        return out


def watermarks(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "recovery-time-watermarks"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(PARTITIONS)]
    finally:
        c.close()


def measure(args: argparse.Namespace, protocol: str, client: str) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    run_id = uuid.uuid4().hex[:8]
    run = {
        "topic": f"recovery-{run_id}",
        "group": f"recovery-{run_id}",
        "protocol": protocol,
        "client": client,
        "dir": tempfile.mkdtemp(prefix="recovery-"),
    }
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for f in admin.create_topics([NewTopic(run["topic"], PARTITIONS, 1)]).values():
        f.result(30)
    writer = Writer(args.bootstrap, run["topic"], args.rate)
    writer.start()
    a = Member(args, "A", run, 0.0)
    b: Member | None = None
    result: dict[str, Any] = {"protocol": protocol, "client": client}
    try:
        deadline = time.monotonic() + 90
        while len(a.processed()) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(args.warmup)
        kill_t = time.time()
        os.kill(a.proc.pid, signal.SIGKILL)
        b = Member(args, "B", run, kill_t)
        a.proc.wait()
        at_kill = watermarks(args.bootstrap, run["topic"])  # a few ms after: an upper bound
        give_up = time.monotonic() + args.give_up
        while time.monotonic() < give_up and b.first("fresh") is None:
            time.sleep(0.2)
        time.sleep(2.0)
        writer.stop()
        final = watermarks(args.bootstrap, run["topic"])
        total = sum(final)
        while time.monotonic() < give_up:
            seen = {(p, o) for p, o, _ in a.processed() + b.processed()}
            if len(seen) >= total:
                break
            time.sleep(1.0)
        a_done = a.processed()
        b_done = b.processed()
        counts = Counter((p, o) for p, o, _ in a_done + b_done)
        result["lost"] = sum(1 for p in range(PARTITIONS) for o in range(final[p])
                             if (p, o) not in counts)  # fmt: skip
        result["duplicates"] = sum(n - 1 for n in counts.values() if n > 1)
        result["records"] = total
        full = b.first("assign", lambda ev: len(ev["partitions"]) == PARTITIONS)
        if full:
            result["assigned"] = full["t"] - kill_t
        fresh = b.first("fresh")
        if fresh:
            result["fresh"] = fresh["t"] - kill_t
        after = b.first("after_kill")
        if after:
            result["after_kill"] = after["t"] - kill_t
        if args.verbose:
            result["events"] = [{**ev, "t": round(ev["t"] - kill_t, 3)} for ev in b.events]
        imported = b.first("imported")
        if imported:
            result["startup"] = imported["t"] - kill_t
        by_a = {(p, o) for p, o, _ in a_done}
        backlog = [t for p, o, t in b_done if o < at_kill[p] and (p, o) not in by_a]
        missing = any((p, o) not in counts for p in range(PARTITIONS) for o in range(at_kill[p]))
        if backlog and not missing:
            result["backlog_done"] = max(backlog) - kill_t
            result["backlog"] = len({(p, o) for p, o, t in b_done if o < at_kill[p]} - by_a)
        return result
    finally:
        for m in (a, b):
            if m is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)
                try:
                    m.proc.wait(30)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait()
        if not writer.done.is_set():
            writer.stop()


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--protocols", default="classic,consumer")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s")
    parser.add_argument("--work-us", type=float, default=200.0, help="CPU per record, us")
    parser.add_argument("--warmup", type=float, default=8.0, help="A's seconds before the kill")
    parser.add_argument("--give-up", type=float, default=150.0, help="seconds after the kill")
    parser.add_argument("--verbose", action="store_true", help="B's events in each result")
    parser.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    for name in ("topic", "group", "protocol", "client", "state-dir", "log"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    parser.add_argument("--kill-t", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member:
        run_member(args)
        return
    rows = []
    for protocol in args.protocols.split(","):
        for client in args.clients.split(","):
            runs = []
            for rep in range(args.reps):
                r = measure(args, protocol, client)
                print(f"# {protocol} {client} rep {rep + 1}: {json.dumps(r)}", flush=True)
                runs.append(r)
            rows.append((protocol, client, runs))
    print()
    print("| protocol | client | kill -> assigned, s | kill -> first record produced after "
          "the kill, s | kill -> first fresh record, s | kill -> backlog done, s | lost "
          "| duplicates |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for protocol, client, runs in rows:
        keys = ("assigned", "after_kill", "fresh", "backlog_done")
        cols = [fmt([r[k] for r in runs if k in r]) for k in keys]
        lost = ", ".join(str(r.get("lost", "-")) for r in runs)
        dups = ", ".join(str(r.get("duplicates", "-")) for r in runs)
        print(f"| {protocol} | {CLIENTS[client]} | {' | '.join(cols)} | {lost} | {dups} |")


if __name__ == "__main__":
    main()
