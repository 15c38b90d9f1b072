"""``fastrebalance bench --scenario crash``: recovery measured from the SIGKILL, as a user
measures it, on a real broker: plain confluent-kafka against fastrebalance with the
removal of dead members off and on, under each group protocol asked for.

Why from the kill: a SIGKILLed member never leaves its group, and the group waits for its
session to expire (45 s by default under either protocol) before anyone gets its
partitions; catch-up only shortens what comes after that wait, the removal of dead members
at start (docs/operations.md, "Recovery time after a crash") shortens the wait itself. Run
it on a broker at Kafka's real group defaults, or the numbers say nothing about production.

Each run, on a fresh topic (6 partitions) and group: a writer produces ``rate`` records/s,
each valued with its produce time; member A, a process of its own, processes them
(``work_us`` of CPU per record, offsets stored after processing, the client's auto-commit
every 5 s) for ``warmup_s`` and is SIGKILLed; a new process B, the same program with the
same config, starts at once, as a supervisor would, so interpreter start-up and imports
count. From the kill: B's assignment of all 6 partitions, B's first processed record
produced after the kill, B's first *fresh* record (produced after the kill and processed
less than 1 s after it was produced: B is back at the live end of the log), and the moment
every record produced before the kill had been processed (backlog done). The writer then
stops; once A and B together processed every record, or ``give_up_s`` after the kill, B
stops: ``lost`` counts records no one processed, ``duplicates`` records processed twice.

The member runs this file as a script (``python crashbench.py --member ...``): its imports
at the top are the standard library's only, so the plain member never imports
fastrebalance and each client pays only its own start-up.

Thread ownership: the writer's producer belongs to its thread; the admin and watermark
handles to the thread that calls ``run_crash()``; each member's consumer to its process's
main thread.
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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTITIONS = 6
#: A record is fresh when processed less than this long after it was produced: the
#: consumer is back at the live end of the log (a record produced just after the kill and
#: read 45 s later is not)
FRESH_LAG_S = 1.0
#: plain confluent-kafka, fastrebalance with parallel.rebalance.remove.dead.members off, on
CLIENTS = {"plain": "confluent-kafka", "off": "fastrebalance, removal off",
           "on": "fastrebalance, removal on"}  # fmt: skip
#: The columns of the table: (key in a run's result, header)
COLUMNS = (
    ("assigned", "kill -> assigned, s"),
    ("after_kill", "kill -> first record produced after the kill, s"),
    ("fresh", "kill -> first fresh record, s"),
    ("backlog_done", "kill -> backlog done, s"),
)


@dataclass(frozen=True)
class CrashSettings:
    """What to run. ``bootstrap``: a real broker (kafka-python, which sends the admin
    LeaveGroup, cannot talk to the embedded cluster); ``protocols``: ``classic`` and/or
    ``consumer`` (Apache Kafka 4.0 or later)."""

    bootstrap: str
    reps: int = 3
    protocols: tuple[str, ...] = ("classic",)
    clients: tuple[str, ...] = ("on", "off", "plain")
    rate: float = 1000.0
    work_us: float = 200.0
    warmup_s: float = 8.0
    give_up_s: float = 150.0


@dataclass
class CrashRun:
    protocol: str
    client: str
    work_us: float
    rep: int
    measured: dict[str, float] = field(default_factory=dict)
    lost: int | None = None
    duplicates: int | None = None
    records: int = 0


# -- the member process (A and B alike) ------------------------------------------------------
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
        from fastrebalance import Consumer  # type: ignore[assignment]

        conf["enable.parallel.rebalance"] = True
        conf["parallel.rebalance.state.dir"] = args.state_dir
        conf["parallel.rebalance.remove.dead.members"] = args.client == "on"
    _emit("imported", since_start=time.time() - started)
    consumer = Consumer(conf)
    held: set[int] = set()

    def on_assign(_c: Any, partitions: list[Any]) -> None:
        held.update(p.partition for p in partitions)
        _emit("assign", partitions=sorted(held))

    def on_revoke(_c: Any, partitions: list[Any]) -> None:
        held.difference_update(p.partition for p in partitions)

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    kill_t, work_s = args.kill_t, args.work_us / 1e6
    fresh_said = after_said = False
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        msgs = [m for m in consumer.consume(500, 0.1) if not m.error()]
        lines = []
        for msg in msgs:
            until = time.perf_counter() + work_s
            while time.perf_counter() < until:
                pass
            now = time.time()
            lines.append(f"{msg.partition()} {msg.offset()} {now:.6f}\n")
            produced = float(msg.value() or b"0")
            if kill_t and produced > kill_t:
                if not after_said:
                    after_said = True
                    _emit("after_kill", partition=msg.partition(), offset=msg.offset())
                if not fresh_said and now - produced < FRESH_LAG_S:
                    fresh_said = True
                    _emit("fresh", partition=msg.partition(), offset=msg.offset())
        if lines:
            os.write(fd, "".join(lines).encode())  # logged before its offset is stored
            for msg in msgs:
                consumer.store_offsets(message=msg)
    os.close(fd)
    consumer.close()


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


# -- the parent ------------------------------------------------------------------------------
class _Writer(threading.Thread):
    """``rate`` records/s round-robin over the partitions, each valued with its send time."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True, name="crashbench-writer")
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

    def stop(self) -> int:
        """Stop writing; the records still unsent after 30 s."""
        self.done.set()
        self.join()
        return int(self.producer.flush(30))


class _Member:
    """One member process; its stdout events are read on a thread of their own."""

    def __init__(self, s: CrashSettings, role: str, run: dict[str, Any], kill_t: float):
        self.log = Path(run["dir"]) / f"{role}.log"
        cmd = [
            sys.executable, __file__, "--member", "--bootstrap", s.bootstrap,
            "--topic", run["topic"], "--group", run["group"], "--protocol", run["protocol"],
            "--client", run["client"], "--state-dir", str(Path(run["dir"]) / "state"),
            "--log", str(self.log), "--work-us", str(s.work_us), "--kill-t", str(kill_t),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def first(self, name: str, pred: Callable[[dict[str, Any]], bool] | None = None
              ) -> dict[str, Any] | None:  # fmt: skip
        for ev in list(self.events):
            if ev["event"] == name and (pred is None or pred(ev)):
                return ev
        return None

    def processed(self) -> list[tuple[int, int, float]]:
        out = []
        if self.log.exists():
            # the member may be mid-write: the last line counts once its newline is there
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


def _watermarks(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fastrebalance-crashbench-marks"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(PARTITIONS)]
    finally:
        c.close()


def measure(s: CrashSettings, protocol: str, client: str, rep: int) -> CrashRun:
    """One kill and restart on a topic and group of its own, deleted afterwards."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    run_id = uuid.uuid4().hex[:8]
    run = {"topic": f"fastrebalance-crash-{run_id}", "group": f"fastrebalance-crash-{run_id}",
           "protocol": protocol, "client": client,
           "dir": tempfile.mkdtemp(prefix="fastrebalance-crash-")}  # fmt: skip
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    for f in admin.create_topics([NewTopic(run["topic"], PARTITIONS, 1)]).values():
        f.result(30)
    result = CrashRun(protocol, client, s.work_us, rep)
    writer = _Writer(s.bootstrap, run["topic"], s.rate)
    writer.start()
    a = _Member(s, "A", run, 0.0)
    b: _Member | None = None
    try:
        deadline = time.monotonic() + 90
        while not a.processed() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(s.warmup_s)
        kill_t = time.time()
        os.kill(a.proc.pid, signal.SIGKILL)
        b = _Member(s, "B", run, kill_t)
        a.proc.wait()
        at_kill = _watermarks(s.bootstrap, run["topic"])  # a few ms after: an upper bound
        give_up = time.monotonic() + s.give_up_s
        while time.monotonic() < give_up and b.first("fresh") is None:
            time.sleep(0.2)
        time.sleep(2.0)
        writer.stop()
        final = _watermarks(s.bootstrap, run["topic"])
        while time.monotonic() < give_up:
            if len({(p, o) for p, o, _ in a.processed() + b.processed()}) >= sum(final):
                break
            time.sleep(1.0)
        a_done, b_done = a.processed(), b.processed()
        counts = Counter((p, o) for p, o, _ in a_done + b_done)
        result.records = sum(final)
        result.lost = sum(1 for p in range(PARTITIONS) for o in range(final[p])
                          if (p, o) not in counts)  # fmt: skip
        result.duplicates = sum(n - 1 for n in counts.values() if n > 1)
        got = result.measured
        if full := b.first("assign", lambda ev: len(ev["partitions"]) == PARTITIONS):
            got["assigned"] = full["t"] - kill_t
        for key in ("after_kill", "fresh"):
            if ev := b.first(key):
                got[key] = ev["t"] - kill_t
        if imported := b.first("imported"):
            got["startup"] = imported["t"] - kill_t
        by_a = {(p, o) for p, o, _ in a_done}
        backlog = [t for p, o, t in b_done if o < at_kill[p] and (p, o) not in by_a]
        missing = any((p, o) not in counts for p in range(PARTITIONS) for o in range(at_kill[p]))
        if backlog and not missing:
            got["backlog_done"] = max(backlog) - kill_t
        return result
    finally:
        for m in (a, b):
            if m is not None:
                m.stop()
        if not writer.done.is_set():
            writer.stop()
        with contextlib.suppress(Exception):
            admin.delete_consumer_groups([run["group"]])[run["group"]].result(30)
        with contextlib.suppress(Exception):
            admin.delete_topics([run["topic"]])[run["topic"]].result(30)
        shutil.rmtree(run["dir"], ignore_errors=True)


def run_crash(s: CrashSettings, out: Callable[[str], None] = print) -> list[CrashRun]:
    """Every protocol x client x repetition; the clients alternate which goes first."""
    runs: list[CrashRun] = []
    for protocol in s.protocols:
        for rep in range(s.reps):
            order = s.clients[rep % len(s.clients):] + s.clients[:rep % len(s.clients)]
            for client in order:
                r = measure(s, protocol, client, rep)
                runs.append(r)
                cells = ", ".join(f"{k} {v:.2f} s" for k, v in r.measured.items())
                out(f"[crash {protocol} {rep + 1}/{s.reps}] {CLIENTS[client]}: {cells}; "
                    f"lost {r.lost}, duplicates {r.duplicates}")  # fmt: skip
    return runs


def _cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})"


def format_markdown(s: CrashSettings, runs: Sequence[CrashRun], command: str, machine: str
                    ) -> str:  # fmt: skip
    lines = [
        f"Command: `{command}`", "", machine, "",
        f"### Recovery from the kill: {PARTITIONS} partitions, {s.rate:g} records/s, "
        f"{s.work_us:g} us of work per record, median of {s.reps} (each run in brackets)", "",
        "| protocol | client | " + " | ".join(h for _, h in COLUMNS) + " | lost | duplicates |",
        "|---|---|" + "--:|" * (len(COLUMNS) + 2),
    ]  # fmt: skip
    for protocol in s.protocols:
        for client in s.clients:
            mine = [r for r in runs if r.protocol == protocol and r.client == client]
            cols = [_cell([r.measured[k] for r in mine if k in r.measured]) for k, _ in COLUMNS]
            lost = ", ".join(str(r.lost) for r in mine)
            dups = ", ".join(str(r.duplicates) for r in mine)
            lines.append(f"| {protocol} | {CLIENTS[client]} | {' | '.join(cols)} | {lost} "
                         f"| {dups} |")  # fmt: skip
    lines += ["", "Ratios, median of the per-repetition ratios (plain ÷ fastrebalance with the "
              "removal on, same protocol and repetition):", "",
              "| protocol | kill -> first fresh record | kill -> backlog done |", "|---|--:|--:|"]
    for protocol in s.protocols:
        cells = []
        for key in ("fresh", "backlog_done"):
            ratios = []
            for rep in range(s.reps):
                mine = [r for r in runs if r.protocol == protocol and r.rep == rep]
                pair = {r.client: r.measured[key] for r in mine if key in r.measured}
                if "plain" in pair and pair.get("on"):
                    ratios.append(pair["plain"] / pair["on"])
            cells.append(f"{statistics.median(ratios):.1f}x" if ratios else "-")
        lines.append(f"| {protocol} | {' | '.join(cells)} |")
    lines += ["", f"*fresh*: produced after the kill and processed less than {FRESH_LAG_S:g} s "
              "after it was produced. *backlog done*: every record produced before the kill "
              "processed. Each run starts a new process right after the SIGKILL (interpreter "
              "start-up and imports count). lost: produced, never processed (must be 0); "
              "duplicates: processed twice (the killed member's records processed after its "
              "last auto-commit, as with any client)."]  # fmt: skip
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    """``fastrebalance bench --scenario crash``."""
    from . import _args as a
    from ._runner import loadavg, machine_info, machine_line

    if not args.bootstrap_servers:
        print("fastrebalance bench: --scenario crash needs --bootstrap-servers: a real broker "
              "(the dead member is removed with kafka-python's admin client, which cannot talk "
              "to the embedded cluster), ideally at Kafka's default group settings",
              file=sys.stderr)  # fmt: skip
        return a.EXIT_USAGE
    from .bench import BenchSettings

    protocols = (("classic", "consumer") if args.group_protocol == "both"
                 else (args.group_protocol,))  # fmt: skip
    bench = BenchSettings()
    # the other scenarios' defaults (no work, 100 records/s) make a backlog too small to
    # say anything after a 45 s wait: left at those, the crash scenario takes its own
    work_us = CrashSettings.work_us if tuple(args.work_us) == bench.work_us else args.work_us
    rate = CrashSettings.rate if args.rate == bench.rate else args.rate
    if isinstance(work_us, (list, tuple)):
        if len(work_us) != 1:
            print("fastrebalance bench: --scenario crash takes one --work-us value",
                  file=sys.stderr)  # fmt: skip
            return a.EXIT_USAGE
        work_us = work_us[0]
    s = CrashSettings(bootstrap=args.bootstrap_servers, reps=args.reps, protocols=protocols,
                      rate=rate, work_us=work_us)  # fmt: skip
    command = (f"fastrebalance bench --scenario crash --work-us {s.work_us:g} --reps {s.reps} "
               f"--rate {s.rate:g} --group-protocol {args.group_protocol} "
               f"--bootstrap-servers {s.bootstrap}")
    print(f"fastrebalance bench: {command}\n", flush=True)
    load_start = loadavg()
    runs = run_crash(s, out=lambda line: print(line, flush=True))
    machine = machine_line({**machine_info(), "loadavg_start": load_start,
                            "loadavg_end": loadavg()}, s.bootstrap)  # fmt: skip
    a.write_report(args, format_markdown(s, runs, command, machine), runs)
    clean = all(r.lost == 0 for r in runs)
    return a.EXIT_OK if clean else a.EXIT_CHECK_FAILED


def _member_main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--member", action="store_true")
    for name in ("bootstrap", "topic", "group", "protocol", "client", "state-dir", "log"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--work-us", type=float, default=0.0)
    p.add_argument("--kill-t", type=float, default=0.0)
    run_member(p.parse_args())


if __name__ == "__main__":
    # run as a script: its own directory (fastrebalance/tools) must not shadow a module
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)
    _member_main()
