#!/usr/bin/env python3
"""Wall-clock recovery after a SIGKILL, per group protocol, with real processes.

Why: after a crash the restarted member (plain confluent-kafka or fastrebalance alike) gets
the partitions only once the group has noticed that the dead member is gone; whatever is
produced meanwhile becomes backlog. fastrebalance's catch-up shortens what comes *after*
that wait, not the wait itself. This script measures the wait, so that
docs/operations.md ("Recovery time after a crash") can say what decides it under each
group protocol and setting.

For each case (a fresh 1-partition topic and group each time): member A, a subprocess
running ``fastrebalance.Consumer`` with ``enable.parallel.rebalance``, is assigned and
consumes a few records; it is SIGKILLed; member B (same group, same config, its process
started beforehand so that interpreter start-up is not measured) subscribes at once. We
report the seconds from B's ``subscribe()`` to its first ``on_assign`` holding the
partition, and to its first record produced after the kill. A producer thread writes
about 200 records/s the whole time. If B's consumer hits a fatal error (static membership
under KIP-848: UNRELEASED_INSTANCE_ID), B makes a new one a second later, as a supervisor
would, and the clock keeps running. Bounded: B gives up ``--give-up`` seconds (120) after
subscribing and A must be ready within 60 s, so a run takes at most about 4 min per case
and repetition; all six cases, twice, took about 5 minutes on Apache Kafka 4.

    .venv/bin/python benchmarks/recovery_time.py --bootstrap 127.0.0.1:29292 [--reps 2]
        [--cases abcdef] [--give-up 120]

Needs a broker with KIP-848 (Apache Kafka 4) for cases d-f; cases a-c run on any broker.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLASSIC = {"partition.assignment.strategy": "cooperative-sticky"}
CONSUMER = {"group.protocol": "consumer"}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "a": ("classic, session.timeout.ms default (45000)", dict(CLASSIC)),
    "b": (
        "classic, session.timeout.ms=6000, heartbeat.interval.ms=1000",
        {**CLASSIC, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
    ),
    "c": ("classic, default session timeout, static group.instance.id", dict(CLASSIC)),
    "d": ("consumer (KIP-848), broker default group session timeout", dict(CONSUMER)),
    "e": ("consumer (KIP-848), group override consumer.session.timeout.ms=6000", dict(CONSUMER)),
    "f": ("consumer (KIP-848), static group.instance.id", dict(CONSUMER)),
}
STATIC_CASES = ("c", "f")
A_RECORDS = 20  # records member A consumes (and commits) before it is killed
A_START_LIMIT_S = 60.0  # member A must be assigned and have read records within this


# -- the member processes -----------------------------------------------------------------------
def emit(event: str, **fields: Any) -> None:
    """One JSON line to the parent, with this process's wall clock."""
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def run_member(args: argparse.Namespace) -> None:
    """Member A (``--role A``) or B (``--role B``): subscribe, report, read until killed."""
    from fastrebalance import Consumer, KafkaError

    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "enable.parallel.rebalance": True,
        "auto.offset.reset": "earliest",
        **json.loads(args.conf),
    }
    if args.role == "B":
        emit("waiting")
        kill_t = float(sys.stdin.readline())  # the parent's kill time: our go signal
    else:
        kill_t = float("inf")

    def on_assign(_consumer: Any, partitions: list[Any]) -> None:
        emit("assign", partitions=[p.partition for p in partitions])

    def start() -> Any:
        consumer = Consumer(conf)
        emit("subscribe")
        consumer.subscribe([args.topic], on_assign=on_assign)
        return consumer

    consumer = start()
    read = 0
    errors: set[str] = set()
    deadline = time.monotonic() + args.give_up
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if err := msg.error():
                if str(err) not in errors:  # once each: an error may repeat
                    errors.add(str(err))
                    emit("error", error=str(err))
                if err.code() == KafkaError._FATAL:
                    # The consumer is unusable: do what a supervisor restarting the
                    # application would, a new consumer a second later.
                    emit("fatal")
                    close_quietly(consumer)
                    time.sleep(1.0)
                    consumer = start()
                continue
            read += 1
            produced = float(msg.value() or b"0")
            if args.role == "A" and read == A_RECORDS:
                consumer.commit(asynchronous=False)
                emit("ready", offset=msg.offset())
            if args.role == "B" and produced > kill_t:
                emit("after_kill", offset=msg.offset(), produced=produced, read=read)
                break
    except Exception as exc:  # reported, not hidden: the parent prints it
        emit("error", error=f"{type(exc).__name__}: {exc}")
    finally:
        if args.role == "B":
            close_quietly(consumer)
            emit("closed")


def close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception as exc:  # a consumer after a fatal error may refuse; nothing to save
        emit("error", error=f"close: {type(exc).__name__}: {exc}")


# -- the parent -----------------------------------------------------------------------------------
@dataclass
class Member:
    """A member subprocess and a reader thread queueing its JSON lines."""

    proc: subprocess.Popen[str]
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                self.events.put({"event": "output", "t": time.time(), "line": line.rstrip()})
        self.events.put({"event": "exit", "t": time.time()})

    def wait_for(self, name: str, until: float, log: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The first ``name`` event before monotonic ``until``; every event goes to ``log``."""
        while (left := until - time.monotonic()) > 0:
            try:
                ev = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            log.append(ev)
            if ev["event"] == name:
                return ev
            if ev["event"] == "exit":
                return None
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(
    role: str, bootstrap: str, topic: str, group: str, conf: dict[str, Any], give_up: float
) -> Member:
    cmd = [
        sys.executable, "-u", __file__, "--member", "--role", role, "--bootstrap", bootstrap,
        "--topic", topic, "--group", group, "--conf", json.dumps(conf),
        "--give-up", str(give_up),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True
    )
    return Member(proc)


class Writer(threading.Thread):
    """Produces about ``rate`` records/s to ``topic``, each valued with its produce time."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.period = topic, 1.0 / rate
        self.done = threading.Event()

    def run(self) -> None:
        next_t = time.monotonic()
        while not self.done.is_set():
            self.producer.produce(self.topic, value=f"{time.time():.6f}".encode())
            self.producer.poll(0)
            next_t += self.period
            if (pause := next_t - time.monotonic()) > 0:
                time.sleep(pause)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.producer.flush(10)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)


def measure(case: str, bootstrap: str, give_up: float) -> dict[str, Any]:
    """One repetition of one case: kill A, time B. Returns what happened."""
    run_id = uuid.uuid4().hex[:8]
    topic, group = f"recovery-{case}-{run_id}", f"recovery-{case}-{run_id}"
    conf = dict(CASES[case][1])
    if case in STATIC_CASES:
        conf["group.instance.id"] = f"member-{run_id}"
    result: dict[str, Any] = {"case": case, "group": group}
    create_topic(bootstrap, topic)
    if case == "e":
        from fastrebalance.testing import set_consumer_group_timeouts

        took, why = set_consumer_group_timeouts(bootstrap, group, 6000)
        if not took:
            result["failure"] = f"group config not set: {why}"
            return result
    writer = Writer(bootstrap, topic, 200.0)
    writer.start()
    a_log: list[dict[str, Any]] = []
    b_log: list[dict[str, Any]] = []
    a = spawn("A", bootstrap, topic, group, conf, give_up + A_START_LIMIT_S)
    b: Member | None = None
    try:
        if a.wait_for("ready", time.monotonic() + A_START_LIMIT_S, a_log) is None:
            result["failure"] = f"member A never got ready: {a_log[-3:]}"
            return result
        b = spawn("B", bootstrap, topic, group, conf, give_up)
        if b.wait_for("waiting", time.monotonic() + A_START_LIMIT_S, b_log) is None:
            result["failure"] = f"member B did not start: {b_log[-3:]}"
            return result
        kill_t = time.time()
        os.kill(a.proc.pid, signal.SIGKILL)
        assert b.proc.stdin is not None
        b.proc.stdin.write(f"{kill_t!r}\n")
        b.proc.stdin.flush()
        a.proc.wait()
        until = time.monotonic() + give_up + 15  # B gives up by itself after give_up
        sub = b.wait_for("subscribe", until, b_log)  # the first one: B's clock starts
        after = b.wait_for("after_kill", until, b_log) if sub else None
        b.wait_for("closed", time.monotonic() + 30, b_log)
        if sub is None:
            result["failure"] = f"member B never subscribed: {b_log[-3:]}"
            return result
        result["kill_to_subscribe"] = sub["t"] - kill_t
        assigns = [ev for ev in b_log if ev["event"] == "assign" and ev["partitions"]]
        if assigns:
            result["assign"] = assigns[0]["t"] - sub["t"]
        if after is not None:
            result["first_after_kill"] = after["t"] - sub["t"]
        fatals = [ev["t"] - sub["t"] for ev in b_log if ev["event"] == "fatal"]
        if fatals:
            result["fatal_errors"] = len(fatals)
            result["first_fatal"] = fatals[0]
            result["last_fatal"] = fatals[-1]
        errors = sorted({ev["error"] for ev in b_log if ev["event"] == "error"})
        if errors:
            result["errors"] = errors
        if after is None:
            result["failure"] = f"no record after the kill within {give_up:.0f} s"
        return result
    finally:
        for m in (a, b):
            if m is not None:
                m.stop()
        writer.stop()


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    both = ", ".join(f"{v:.1f}" for v in values)
    return f"{statistics.median(values):.1f} ({both})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:29292")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--cases", default="".join(CASES))
    parser.add_argument("--give-up", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("A", "B"), help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--conf", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member:
        run_member(args)
        return
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for case in args.cases:
        runs = []
        for rep in range(args.reps):
            r = measure(case, args.bootstrap, args.give_up)
            print(f"# {case} rep {rep + 1}: {json.dumps(r)}", flush=True)
            runs.append(r)
        rows.append((case, runs))
    print()
    print("| case | setting | subscribe -> on_assign, s | subscribe -> first record "
          "produced after the kill, s | notes |")  # fmt: skip
    print("|---|---|---|---|---|")
    for case, runs in rows:
        assign = [r["assign"] for r in runs if "assign" in r]
        after = [r["first_after_kill"] for r in runs if "first_after_kill" in r]
        notes = sorted({r["failure"] for r in runs if "failure" in r})
        notes += [
            f"rep {i + 1}: {r['fatal_errors']} fatal errors, first {r['first_fatal']:.1f} s, "
            f"last {r['last_fatal']:.1f} s after subscribe (consumer recreated 1 s after each)"
            for i, r in enumerate(runs)
            if "fatal_errors" in r
        ]
        print(f"| {case} | {CASES[case][0]} | {fmt(assign)} | {fmt(after)} | "
              f"{'; '.join(notes)} |")  # fmt: skip
    errors = sorted({e for _, runs in rows for r in runs for e in r.get("errors", [])})
    for error in errors:
        print(f"\nerror seen by member B: {error}")
    gaps = [r["kill_to_subscribe"] for _, runs in rows for r in runs if "kill_to_subscribe" in r]
    if gaps:
        print(f"\nkill -> B's subscribe(): at most {max(gaps):.2f} s (B was started beforehand)")


if __name__ == "__main__":
    main()
