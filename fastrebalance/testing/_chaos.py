"""The chaos harness: real processes, random faults, and a proof that no record was lost.

``run_chaos(ChaosSettings(...))`` runs, against an embedded (or given) Kafka cluster:

* a producer writing uniquely numbered records (value ``str(i)``) at a steady rate;
* N consumer processes (``fastrebalance.testing._crashworker``: a ``fastrebalance.Consumer``
  with the mode on) in one group, each appending every record it is handed to its own log
  file, which it flushes and fsyncs *before* each commit. Each process is, at random (from
  the seed; each round of starts has every mode once), an *in-order* worker (consume,
  process, fsync, commit) or an *asynchronous pipeline* (batches held and processed out of
  order, commits made seconds late, often after the partition moved: every commit still
  true);
* a fault injector drawing from a seeded ``random.Random`` (the seed is printed first, so
  a failure replays): SIGKILL at random moments, SIGKILL while the child is mid-range (the
  worker kills itself halfway through a batch of backlog records), SIGKILL while a commit is
  in flight (the worker kills itself from a timer started just before its commit), SIGKILL
  of a young process (joining, planning), SIGSTOP/SIGCONT for longer than
  ``session.timeout.ms`` and ``max.poll.interval.ms`` (a zombie that wakes up fenced), clean
  restarts (SIGTERM), members added and removed, and the broker process itself paused
  (SIGSTOP, then SIGCONT: its data survives);
* a sampler reading the group's committed offsets with a plain ``confluent_kafka.Consumer``
  every ``sample_interval_s``, then the size of every worker log;
* optionally a CPU hog (``cpu_hog`` busy processes beside it all: a loaded machine).

At the end it drains (faults stop, everything resumes, the group catches up to the log
end) and checks:

* **at-least-once**: every produced record is in some worker log; a record missing from
  every log counts as *lost*, unless retention deleted it before anyone read it (then it is
  counted apart as *deleted by retention*, never as delivered);
* **duplicates** are counted and reported (at-least-once allows them);
* **the stored offset never ran ahead of processing**: at every sample, every offset the
  bare committed offset declares processed (what any tool sees), and every offset the range
  token plus the child's checkpoint declare processed (what the next owner restores), was
  already in a log at that moment;
* **latency**: produce-to-processing percentiles of each record's first delivery, for the
  records the primary delivered (fresh) and for all of them;
* **shutdown bounds**: every clean shutdown (SIGTERM) is timed step by step from the worker's
  events and held against the library's documented bounds (``documented_bounds``): the call
  under way when SIGTERM came, the final synchronous commit, ``close()``. A worker that does
  not exit in time is reported with the bound it broke and its thread stacks.

Why processes and signals: a crash of the Python process is the event whose consequences
the library's contract is about (two commit logs, checkpointed tokens). Threads cannot be
SIGKILLed, and an in-process broker would die with them.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Consumer as PlainConsumer

from fastrebalance._assigning import REVOKE_WAIT_S
from fastrebalance._planner import PLAN_BUDGET_S as _PLAN_BUDGET_S
from fastrebalance._planning import restore

__all__ = [
    "ALL_FAULTS",
    "ALL_WORKER_MODES",
    "KILL_FAULTS",
    "OWN_STEP",
    "WORKER_MODES",
    "ChaosResult",
    "ChaosSettings",
    "check_samples",
    "claimed_intervals",
    "close_limit",
    "documented_bounds",
    "format_line",
    "format_summary",
    "parse_duration",
    "parse_line",
    "read_logs",
    "run_chaos",
    "shutdown_report",
]

#: Every fault the injector knows, by name (the summary counts them by these names).
ALL_FAULTS: tuple[str, ...] = (
    "kill",  # SIGKILL at a random moment, restart
    "kill_catchup",  # the worker SIGKILLs itself halfway through a batch of backlog records
    "kill_commit",  # the worker SIGKILLs itself while its commit is in flight
    "kill_young",  # restart, then SIGKILL again while it joins / plans / starts its child
    "stop",  # SIGSTOP past session.timeout.ms and max.poll.interval.ms, then SIGCONT
    "restart",  # SIGTERM (clean close), start again
    "add",  # a new member joins
    "remove",  # a member leaves cleanly for good
    "broker_pause",  # SIGSTOP the broker process, SIGCONT a few seconds later
    "broker_restart",  # stop a real broker of the run's own, start it again on its data
)
#: Faults done to the broker, and what a cluster must offer for each (others skip them).
BROKER_FAULTS: dict[str, str] = {"broker_pause": "pause", "broker_restart": "restart"}
KILL_FAULTS: tuple[str, ...] = ("kill", "kill_catchup", "kill_commit", "kill_young")
#: The eos workers' output topic: the input topic's name with this suffix.
OUTPUT_SUFFIX = "-out"
#: The worker behaviours (``_crashworker --mode``), drawn at random per process.
WORKER_MODES: tuple[str, ...] = ("inorder", "async")
#: Every worker behaviour: ``eos`` (read-process-write in producer transactions, checked
#: exactly once in the output topic) runs alone, and only on a broker that stores
#: transactional offsets.
ALL_WORKER_MODES: tuple[str, ...] = (*WORKER_MODES, "eos")

_WORKER_MODULE = "fastrebalance.testing._crashworker"
#: The drain ends when it stalls for drain_timeout_s, and at the latest after this many.
DRAIN_CAP_FACTOR = 10
#: How long a worker armed to die mid-backlog may wait for one before it is killed anyway.
_ARMED_GRACE_S = 8.0
#: The worker's own steps (processing a batch, an fsync): not a library bound, a sanity one.
_OWN_STEP_S = 30.0
#: A step measured within this much of its bound is not reported (scheduling, a loaded CPU).
BOUND_SLACK_S = 5.0


def documented_bounds(
    socket_timeout_s: float = 60.0, call_timeout_s: float = 0.1
) -> dict[str, float]:
    """The library's documented time bounds (docs/design.md, "Time bounds")
    for a consumer with this ``socket.timeout.ms`` whose poll()/consume() calls use
    ``call_timeout_s``, even with the broker hung:

    * ``consume``: a poll()/consume() call: its timeout plus planning an assignment inside
      it (``fastrebalance._planner.PLAN_BUDGET_S``);
    * ``commit``: a synchronous commit(), or an asynchronous one of a partition no longer
      assigned (its group offset is read first): ``socket.timeout.ms``, shared by both logs
      (the group commit always gets at least 1 s: within ``BOUND_SLACK_S``);
    * ``close``: twice ``socket.timeout.ms`` for the handles, after up to
      ``fastrebalance._assigning.REVOKE_WAIT_S`` serving the revoke;
    * ``own``: the worker's own steps (no library call).
    """
    return {
        "consume": round(call_timeout_s + _PLAN_BUDGET_S, 3),
        "commit": socket_timeout_s,
        "close": 2 * socket_timeout_s + REVOKE_WAIT_S,
        "own": _OWN_STEP_S,
    }


def close_limit(bounds: dict[str, float]) -> float:
    """How long a worker may take from SIGTERM to exit: the one call under way when it
    came (a consume() or a commit), the final synchronous commit and close(), plus slack
    for the worker's own steps (280 s with the default ``socket.timeout.ms``). Longer means
    a bound was broken; ``shutdown_report`` says which."""
    return max(bounds["consume"], bounds["commit"]) + bounds["commit"] + bounds["close"] + 30.0


# ------------------------------------------------------------------------- settings
@dataclass
class ChaosSettings:
    """One chaos run. Times in seconds unless the name says ms."""

    duration_s: float = 120.0
    seed: int | None = None  #: None: a fresh random seed (printed)
    workers: int = 3  #: members at the start
    min_workers: int = 1  #: "remove" never goes below this
    max_workers: int = 5  #: "add" never goes above this
    partitions: int = 4
    rate: float = 1000.0  #: records produced per second
    protocol: str = "cooperative"  #: classic | cooperative | consumer (KIP-848)
    threshold: int = 20  #: parallel.rebalance.lag.threshold of the workers
    work_us: int = 250  #: simulated work per record, microseconds
    faults: tuple[str, ...] = ALL_FAULTS
    min_faults: int = 20  #: keep injecting past duration_s until this many (bounded)
    #: pause between two faults; a classic-protocol group needs seconds to settle after each
    fault_gap_s: tuple[float, float] = (2.5, 6.5)
    warmup_timeout_s: float = 60.0  #: wait for every partition's first commit before faults
    session_timeout_ms: int = 6000
    max_poll_interval_ms: int = 7000
    broker_pause_s: tuple[float, float] = (1.0, 6.0)
    sample_interval_s: float = 0.5
    drain_timeout_s: float = 180.0  #: a drain with no progress this long fails
    linger_ms: int = 5
    compression: str = "lz4"
    bootstrap_servers: str | None = None  #: None: start an embedded cluster
    #: with no bootstrap: a Kafka distribution (bin/kafka-up) to start a real broker of the
    #: run's own from, which it may pause and restart; None: the embedded cluster
    kafka_home: Path | None = None
    workdir: Path | None = None  #: None: a temporary directory (kept, its path is printed)
    modes: tuple[str, ...] = WORKER_MODES  #: worker behaviours, one drawn per process
    cpu_hog: int = 0  #: busy processes running beside the whole run (a loaded machine)
    #: keep injecting past duration_s until every fault kind was injected once (bounded)
    every_fault: bool = False
    socket_timeout_ms: int = 60000  #: the workers' socket.timeout.ms (their time bounds)
    worker_args: tuple[str, ...] = ()  #: more _crashworker arguments (tests of the harness)

    @property
    def eos(self) -> bool:
        return "eos" in self.modes

    def validate(self) -> None:
        unknown = sorted(set(self.faults) - set(ALL_FAULTS))
        if unknown:
            raise ValueError(f"unknown faults {unknown}: choose from {', '.join(ALL_FAULTS)}")
        bad = sorted(set(self.modes) - set(ALL_WORKER_MODES))
        if bad or not self.modes:
            raise ValueError(
                f"worker modes {bad or '()'}: choose from {', '.join(ALL_WORKER_MODES)}"
            )
        if "eos" in self.modes and set(self.modes) != {"eos"}:
            raise ValueError(
                "eos workers run alone: a record another kind of worker processes has no "
                "output, and the output is what the eos check reads"
            )
        if self.cpu_hog < 0:
            raise ValueError("cpu_hog must be >= 0")
        if not 1 <= self.min_workers <= self.workers <= self.max_workers:
            raise ValueError("need 1 <= min_workers <= workers <= max_workers")
        if self.protocol not in ("classic", "cooperative", "consumer"):
            raise ValueError(f"protocol {self.protocol!r}: classic, cooperative or consumer")
        if self.max_poll_interval_ms < self.session_timeout_ms:
            raise ValueError("max_poll_interval_ms must be >= session_timeout_ms (librdkafka)")


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h', '1h30m' -> seconds. Why not plain seconds: soaks are long."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


# ----------------------------------------------------------------------- log format
def format_line(partition: int, offset: int, value: str, latency_ms: float, stream: str) -> str:
    """One processed record in a worker log: ``stream`` is 'f' (primary) or 'b' (child)."""
    return f"{partition} {offset} {value} {latency_ms:.1f} {stream}\n"


@dataclass(slots=True)  # a soak reads a million of them
class LogRecord:
    partition: int
    offset: int
    value: int
    log: Path
    end: int  #: byte position just after its line: when it became visible to a sampler
    latency_ms: float
    stream: str


def parse_line(line: bytes) -> tuple[int, int, int, float, str]:
    p, o, v, lat, stream = line.split()
    return int(p), int(o), int(v), float(lat), stream.decode()


def read_logs(paths: Iterable[Path]) -> list[LogRecord]:
    out = []
    for path in paths:
        if not path.exists():
            continue
        pos = 0
        with open(path, "rb") as f:
            for line in f:
                pos += len(line)
                if not line.endswith(b"\n"):
                    continue  # torn by SIGKILL; the next incarnation writes a new file
                p, o, v, lat, stream = parse_line(line)
                out.append(LogRecord(p, o, v, path, pos, lat, stream))
    return out


# ------------------------------------------------------------------------- producer
class SteadyProducer:
    """Writes value=str(i), i = 0, 1, ..., round-robin over the partitions at a steady rate.

    Idempotent, so a broker pause or a retried request cannot reorder or duplicate records:
    the check maps each value to exactly one (partition, offset).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float,
        linger_ms: int = 5,
        compression: str = "none",
    ) -> None:
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": linger_ms,
                "enable.idempotence": True,
                "compression.type": compression,
                "message.timeout.ms": 600000,  # outlast any broker pause
            }
        )
        self.sent = 0
        self.delivered: dict[int, tuple[int, int]] = {}  #: value -> (partition, offset)
        self.failed: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        value = int(msg.value())
        if err is not None:
            self.failed[value] = str(err)
        else:
            self.delivered[value] = (msg.partition(), msg.offset())

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due and not self._stop.is_set():
                i = self.sent
                try:
                    self.producer.produce(
                        self.topic,
                        value=str(i).encode(),
                        partition=i % self.partitions,
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.005)

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_timeout: float = 120.0) -> int:
        """Stop producing and flush; returns how many records are still undelivered."""
        self._stop.set()
        self._thread.join()
        return int(self.producer.flush(flush_timeout))


# ------------------------------------------------------------------------ shutdowns
#: The events a worker writes around a clean shutdown (see _crashworker): "sigterm" and
#: "phase" by its watchdog thread (the call under way: ``phase``, since ``phase_t``, within
#: ``bound``), the others by its main thread.
_SHUTDOWN_EVENTS = frozenset(
    {"sigterm", "phase", "stopping", "final_commit_begin", "final_commit_done", "close_begin",
     "closed"}
)  # fmt: skip
#: What a worker's watchdog names the time between library calls.
OWN_STEP = "the worker's own code"


def _steps(
    events: list[dict[str, Any]], bounds: dict[str, float]
) -> list[tuple[str, float, float]]:
    """The steps of a shutdown, in order: (what, started (wall clock), bound)."""
    own = bounds.get("own", _OWN_STEP_S)
    steps: list[tuple[str, float, float]] = []
    for e in events:
        kind = e.get("ev")
        t = float(e.get("t", 0.0))
        if kind in ("sigterm", "phase"):
            steps.append((str(e.get("phase")), float(e.get("phase_t", t)), float(e["bound"])))
        elif kind == "stopping":
            steps.append(("finishing the held records", t, own))
        elif kind == "final_commit_begin":
            steps.append(("final commit", t, bounds["commit"]))
        elif kind == "final_commit_done":
            steps.append((OWN_STEP, t, own))
        elif kind == "close_begin":
            steps.append(("close()", t, bounds["close"]))
        elif kind == "closed":
            steps.append(("the interpreter's exit after close() returned", t, own))
    steps.sort(key=lambda step: step[1])
    out: list[tuple[str, float, float]] = []
    for step in steps:
        # the watchdog reports the final commit and close() too, a moment after the main
        # thread announced them: one step
        if out and out[-1][0] == step[0] and step[1] - out[-1][1] < 1.0:
            continue
        out.append(step)
    return out


def shutdown_report(
    name: str,
    events: list[dict[str, Any]],
    sigterm_t: float,
    now: float,
    bounds: dict[str, float],
    resumed_t: float | None = None,
    exited: bool = True,
) -> list[str]:
    """Which documented bound (``documented_bounds``) a worker's clean shutdown broke, from
    its shutdown events: each step that took longer than its bound (beyond
    ``BOUND_SLACK_S``), e.g. "w3.0: final commit took 75 s (bound 60 s)"; and for a worker
    still running at ``now`` (``exited`` False) the step it is stuck in, e.g. "w3.0: close()
    still running after 251 s (bound 130 s)", with every step's duration. Times are wall
    clock; a step under way while the worker was SIGSTOPped is timed from ``resumed_t``."""
    steps = _steps(events, bounds)
    out = []
    timeline = []

    def took(start: float, end: float) -> float:
        if resumed_t is not None and start < resumed_t <= end:
            start = resumed_t  # stopped meanwhile: not the step's own time
        return end - start

    for i, (what, start, bound) in enumerate(steps):
        last = i == len(steps) - 1
        if last and exited:
            continue  # ended with the process: its exit is not timed here
        d = took(start, now if last else steps[i + 1][1])
        timeline.append(f"{what} {d:.1f} s" + (" (still running)" if last else ""))
        if what == OWN_STEP or d <= bound + BOUND_SLACK_S:
            continue
        if last:
            out.append(f"{name}: {what} still running after {d:.0f} s (bound {bound:g} s)")
        else:
            out.append(f"{name}: {what} took {d:.0f} s (bound {bound:g} s)")
    if not exited:
        if not steps:
            out.append(
                f"{name}: no event since SIGTERM {now - sigterm_t:.0f} s ago (its watchdog "
                "thread never reported the call under way)"
            )
        elif not out:
            out.append(f"{name}: no single step broke its bound, yet it did not exit")
        out.append(f"{name}'s steps since SIGTERM: " + ", ".join(timeline))
    return out


# -------------------------------------------------------------------------- workers
@dataclass
class WorkerRun:
    """One process (incarnation) of a worker slot."""

    slot: int
    incarnation: int
    log: Path
    stderr: Path
    proc: subprocess.Popen[str]
    mode: str = "inorder"
    started: float = field(default_factory=time.monotonic)
    commits: int = 0
    catchup: bool = False
    assigned: set[int] = field(default_factory=set)
    stopped: bool = False  #: SIGSTOPped, SIGCONT pending
    ending: str | None = None  #: why we ended it (None: it is meant to be running)
    armed: str | None = None  #: a self-kill the worker was asked for
    armed_at: float = 0.0
    dying: bool = False  #: the worker announced its own SIGKILL
    up: bool = False  #: it announced it was started (its signal handlers are installed)
    sigterm_sent: bool = False
    sigterm_t: float | None = None  #: wall clock when SIGTERM was sent
    resumed_t: float | None = None  #: wall clock of its last SIGCONT
    bounds: dict[str, float] = field(default_factory=documented_bounds)  #: as it announced
    shutdown: list[dict[str, Any]] = field(default_factory=list)  #: its shutdown events
    commit_kinds: Counter[str] = field(default_factory=Counter)  #: async: kind of commit
    commit_whens: Counter[str] = field(default_factory=Counter)  #: async: current/late
    reader: threading.Thread | None = None  #: reads its events until its stdout closes

    @property
    def name(self) -> str:
        return f"w{self.slot}.{self.incarnation}"


class Fleet:
    """The worker processes: start, read their events, signal, restart, stop."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        settings: ChaosSettings,
        workdir: Path,
        seed: int = 0,
    ) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.settings = settings
        self.workdir = workdir
        self.runs: list[WorkerRun] = []  # every incarnation, in start order
        self.paths: list[Path] = []  # every log, listed before its worker starts
        self.current: dict[int, WorkerRun] = {}  # slot -> the incarnation meant to run
        self.lock = threading.Lock()
        self.deaths: list[str] = []  # workers that exited without being told to
        self.slow: list[str] = []  # clean shutdowns that broke a documented bound
        self.shutdown_s: list[float] = []  # SIGTERM to exit, of every clean shutdown
        # each process's behaviour and own seed: from the chaos seed, apart from the fault
        # schedule's generator (a seed replays both)
        self.worker_rng = random.Random(f"chaos-workers:{seed}")
        self._modes_left: list[str] = []
        self._next_slot = 0

    def log_paths(self) -> list[Path]:
        with self.lock:
            return list(self.paths)

    def add(self) -> WorkerRun:
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        return self.start(slot)

    def start(self, slot: int) -> WorkerRun:
        incarnation = sum(1 for r in self.runs if r.slot == slot)
        log = self.workdir / f"w{slot}.{incarnation}.log"
        err = self.workdir / f"w{slot}.{incarnation}.stderr"
        with self.lock:
            self.paths.append(log)  # before any sample could miss a line of it
        s = self.settings
        if not self._modes_left:  # every mode once in each round, in a random order
            self._modes_left = list(s.modes)
            self.worker_rng.shuffle(self._modes_left)
        mode = self._modes_left.pop()
        worker_seed = self.worker_rng.getrandbits(32)
        args = [
            sys.executable, "-m", _WORKER_MODULE,
            "--bootstrap", self.bootstrap, "--topic", self.topic, "--group", self.group,
            "--log", str(log), "--mode", mode, "--seed", str(worker_seed),
            "--threshold", str(s.threshold), "--protocol", s.protocol,
            "--work-us", str(s.work_us), "--session-timeout-ms", str(s.session_timeout_ms),
            "--max-poll-interval-ms", str(s.max_poll_interval_ms),
            "--socket-timeout-ms", str(s.socket_timeout_ms), *s.worker_args,
        ]  # fmt: skip
        if mode == "eos":
            # one transactional.id per slot: a restarted incarnation fences the one it
            # replaces, and its open transaction is aborted at once
            args += ["--output-topic", self.topic + OUTPUT_SUFFIX,
                     "--transactional-id", f"{self.group}-w{slot}"]  # fmt: skip
        with open(err, "w") as err_file:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err_file, text=True)
        run = WorkerRun(slot, incarnation, log, err, proc, mode)
        run.bounds = documented_bounds(s.socket_timeout_ms / 1000.0)
        with self.lock:
            self.runs.append(run)
            self.current[slot] = run
        run.reader = threading.Thread(target=self._read, args=(run,), daemon=True)
        run.reader.start()
        return run

    def _read(self, run: WorkerRun) -> None:
        assert run.proc.stdout is not None
        with open(run.log.with_suffix(".events"), "w") as keep:
            for line in run.proc.stdout:
                keep.write(line)
                self._note(run, line)

    def _note(self, run: WorkerRun, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        with self.lock:
            kind = event.get("ev")
            if kind == "commit":
                run.commits += 1
                if "when" in event:  # the async pipeline's
                    run.commit_whens[event["when"]] += 1
                    run.commit_kinds[event.get("kind", "?")] += 1
                elif run.mode == "async":
                    run.commit_kinds[event.get("kind", "?")] += 1
            elif kind in _SHUTDOWN_EVENTS:
                run.shutdown.append(event)
            elif kind == "catchup":
                run.catchup = bool(event["active"])
            elif kind == "assigned":
                run.assigned |= set(event["partitions"])
            elif kind in ("revoked", "lost"):
                run.assigned -= set(event["partitions"])
            elif kind == "dying":
                run.dying = True
            elif kind == "started":
                run.up = True
                if isinstance(event.get("bounds"), dict):
                    run.bounds = event["bounds"]
                if event.get("mode") not in (None, run.mode):
                    self.deaths.append(f"{run.name} runs {event['mode']}, not {run.mode}")

    def running(self) -> list[WorkerRun]:
        """Incarnations meant to run, up (their signal handlers are installed: SIGUSR1
        would kill a worker still importing), alive, and not stopped."""
        with self.lock:
            runs = list(self.current.values())
        return [
            r for r in runs if r.up and not r.stopped and r.armed is None and r.proc.poll() is None
        ]

    def check_alive(self) -> None:
        """Record workers that died although nobody told them to."""
        with self.lock:
            runs = list(self.current.values())
        for r in runs:
            if r.ending is None and r.armed is None and r.proc.poll() is not None:
                r.ending = "died"
                tail = r.stderr.read_text()[-3000:]
                self.deaths.append(
                    f"{r.name} exited by itself with code {r.proc.returncode}: {tail}"
                )

    def kill(self, run: WorkerRun, why: str) -> None:
        run.ending = why
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGKILL)
        run.proc.wait()
        run.stopped = False

    def cont(self, run: WorkerRun) -> None:
        """SIGCONT a SIGSTOPped worker (the time it was stopped is not its own)."""
        if run.stopped and run.proc.poll() is None:
            run.proc.send_signal(signal.SIGCONT)
            run.resumed_t = time.time()
        run.stopped = False

    def arm(self, run: WorkerRun, kind: str) -> None:
        """Ask the worker to kill itself at a precise moment it alone can see."""
        run.armed = kind
        run.proc.send_signal(signal.SIGUSR1 if kind == "kill_commit" else signal.SIGUSR2)

    def sigterm(self, run: WorkerRun) -> None:
        """SIGTERM, once; the moment is what its shutdown is timed from."""
        if run.proc.poll() is None and not run.sigterm_sent:
            # once: a second SIGTERM could land after Python restored the default action
            # during interpreter shutdown, and kill a worker that closed cleanly
            run.sigterm_sent = True
            run.sigterm_t = time.time()
            run.proc.send_signal(signal.SIGTERM)

    def terminate(self, run: WorkerRun, why: str, timeout: float | None = None) -> bool:
        """SIGTERM (a clean close); False if it had to be SIGKILLed or failed. ``timeout``:
        by default ``close_limit`` of the bounds the worker announced."""
        run.ending = why
        self.cont(run)
        self.sigterm(run)
        limit = close_limit(run.bounds) if timeout is None else timeout
        left = limit - (time.time() - (run.sigterm_t or time.time()))
        try:
            run.proc.wait(max(left, 0.0))
        except subprocess.TimeoutExpired:
            if run.reader is not None:
                run.reader.join(timeout=0.5)  # its last events, if any are in the pipe
            with self.lock:
                events = list(run.shutdown)
            report = shutdown_report(
                run.name, events, run.sigterm_t or 0.0, time.time(), run.bounds,
                resumed_t=run.resumed_t, exited=False,
            )  # fmt: skip
            run.proc.send_signal(signal.SIGQUIT)  # the worker dumps its threads' stacks
            time.sleep(2)
            run.proc.kill()
            run.proc.wait()
            tail = run.stderr.read_text()[-6000:]
            self.deaths.append(
                f"{run.name} did not exit within {limit:.0f} s of SIGTERM: "
                + "; ".join(report)
                + f"\n{run.name}'s stack dump and stderr:\n{tail}"
            )
            return False
        if run.proc.returncode == -signal.SIGTERM and not run.up:
            return True  # still importing, no consumer yet: the default action is fine
        if run.proc.returncode != 0:
            tail = run.stderr.read_text()[-3000:]
            self.deaths.append(f"{run.name} exited with {run.proc.returncode} on SIGTERM: {tail}")
            return False
        if run.reader is not None:
            run.reader.join(timeout=5.0)  # its stdout is closed: the reader ends
        with self.lock:
            events = list(run.shutdown)
        now = time.time()
        if run.sigterm_t is not None:
            self.shutdown_s.append(now - run.sigterm_t)
        report = shutdown_report(
            run.name, events, run.sigterm_t or now, now, run.bounds, resumed_t=run.resumed_t
        )
        self.slow += report
        return True

    def retire(self, slot: int) -> None:
        with self.lock:
            self.current.pop(slot, None)

    def terminate_all(self) -> None:
        with self.lock:
            runs = list(self.current.values())
        for r in runs:
            self.cont(r)
        for r in runs:
            if r.proc.poll() is None:
                r.ending = "end of run"
                self.sigterm(r)  # all at once: they leave in parallel
        for r in runs:
            self.terminate(r, "end of run")

    def kill_everything(self) -> None:
        for r in self.runs:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


# ---------------------------------------------------------------------------- faults
@dataclass(order=True)
class _Pending:
    due: float
    seq: int
    action: Callable[[], None] = field(compare=False)
    #: True: it ends a fault (SIGCONT, broker resume, restart), so finish() runs it early;
    #: False: it is a fault itself, which finish() drops.
    ends_fault: bool = field(compare=False, default=True)


class FaultInjector:
    """Injects the faults in ``settings.faults`` at random moments drawn from ``rng``.

    A fault that lasts (a stopped worker, a paused broker, a killed worker awaiting its
    restart) schedules its own end, so faults overlap as they would in production.
    """

    def __init__(
        self,
        fleet: Fleet,
        rng: random.Random,
        settings: ChaosSettings,
        cluster: Any,
        out: Callable[[str], None],
    ) -> None:
        self.fleet, self.rng, self.settings, self.out = fleet, rng, settings, out
        self.cluster = cluster if hasattr(cluster, "pause") else None
        # the broker faults this cluster allows
        self.broker_faults = {k for k, m in BROKER_FAULTS.items() if hasattr(cluster, m)}
        self.counts: Counter[str] = Counter()
        self.log: list[str] = []
        self._pending: list[_Pending] = []
        self._seq = 0
        self.broker_paused = False
        self.t0 = time.monotonic()

    def _later(self, delay: float, action: Callable[[], None], ends_fault: bool = True) -> None:
        self._seq += 1
        heapq.heappush(
            self._pending, _Pending(time.monotonic() + delay, self._seq, action, ends_fault)
        )

    def _note(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        line = f"[{time.monotonic() - self.t0:7.1f}s] #{sum(self.counts.values())} {kind}: {text}"
        self.log.append(line)
        self.out(line)

    def _describe(self, run: WorkerRun) -> str:
        with self.fleet.lock:
            return (
                f"{run.name} (age {time.monotonic() - run.started:.1f}s, {run.commits} "
                f"commits, catch-up {'ACTIVE' if run.catchup else 'idle'}, "
                f"partitions {sorted(run.assigned)})"
            )

    def _restart_later(self, run: WorkerRun) -> None:
        def restart() -> None:
            # only if nothing else replaced or retired it meanwhile
            if self.fleet.current.get(run.slot) is run:
                self.fleet.start(run.slot)

        self._later(self.rng.uniform(0.0, 1.0), restart)

    def run_due(self) -> None:
        now = time.monotonic()
        while self._pending and self._pending[0].due <= now:
            heapq.heappop(self._pending).action()
        self._reap_armed()

    def _reap_armed(self) -> None:
        """Armed workers that killed themselves get restarted; stale ones are killed."""
        with self.fleet.lock:
            runs = list(self.fleet.current.values())
        for r in runs:
            if r.armed is None:
                continue
            if r.proc.poll() is not None:
                if r.ending is not None:
                    # another fault picked it and ended it: that fault restarts it
                    r.armed = None
                    continue
                if r.reader is not None:
                    # its last events (the "dying" announcement) may still be in the pipe
                    r.reader.join(timeout=5.0)
                if not (r.dying and r.proc.returncode == -signal.SIGKILL):
                    tail = r.stderr.read_text()[-3000:]
                    self.fleet.deaths.append(
                        f"{r.name} armed for {r.armed} exited with {r.proc.returncode}: {tail}"
                    )
                r.ending, r.armed = f"{r.armed} (self)", None
                self._restart_later(r)
            elif time.monotonic() - r.armed_at > _ARMED_GRACE_S:
                self.out(f"    {r.name} never reached the armed moment: SIGKILL instead")
                self.fleet.kill(r, f"{r.armed} (timeout)")
                r.armed = None
                self._restart_later(r)

    def inject(self) -> bool:
        """Inject one fault; False when none of the configured faults had a target."""
        choices = list(self.settings.faults)
        self.rng.shuffle(choices)
        if self.settings.every_fault:
            choices.sort(key=lambda kind: self.counts[kind] > 0)  # the missing ones first
        return any(getattr(self, "_" + kind)() for kind in choices)  # first with a target

    def missing(self) -> list[str]:
        """Fault kinds not injected yet (of those this cluster allows)."""
        kinds = [
            k for k in self.settings.faults if k not in BROKER_FAULTS or k in self.broker_faults
        ]
        return [k for k in kinds if not self.counts[k]]

    def _target(self, prefer: str = "owner") -> WorkerRun | None:
        """A running worker; mostly one that owns partitions (or is catching up, for
        ``prefer="catchup"``), since a fault on an idle member exercises little."""
        running = self.fleet.running()
        if not running:
            return None
        with self.fleet.lock:
            owners = [r for r in running if r.assigned]
            catching = [r for r in running if r.catchup]
        if prefer == "catchup" and catching:
            return self.rng.choice(catching)
        if owners and self.rng.random() < 0.8:
            return self.rng.choice(owners)
        return self.rng.choice(running)

    # -- the faults; each returns False when it has no target right now
    def _kill(self) -> bool:
        run = self._target()
        if run is None:
            return False
        self._note("kill", "SIGKILL " + self._describe(run))
        self.fleet.kill(run, "kill")
        self._restart_later(run)
        return True

    def _kill_catchup(self) -> bool:
        return self._arm(
            "kill_catchup", "SIGUSR2: die halfway through a batch of backlog", "catchup"
        )

    def _kill_commit(self) -> bool:
        return self._arm("kill_commit", "SIGUSR1: die while the next commit is in flight")

    def _arm(self, kind: str, text: str, prefer: str = "owner") -> bool:
        run = self._target(prefer)
        if run is None:
            return False
        self._note(kind, f"{text}: " + self._describe(run))
        run.armed_at = time.monotonic()
        self.fleet.arm(run, kind)
        return True

    def _kill_young(self) -> bool:
        run = self._target()
        if run is None:
            return False
        self._note("kill_young", "SIGKILL, restart, SIGKILL again soon: " + self._describe(run))
        self.fleet.kill(run, "kill_young")
        young = self.fleet.start(run.slot)

        def again() -> None:
            if self.fleet.current.get(young.slot) is young and young.ending is None:
                age = time.monotonic() - young.started
                self.out(f"    SIGKILL {young.name} young, at {age:.1f}s")
                self.fleet.kill(young, "young")
                self._restart_later(young)

        self._later(self.rng.uniform(0.2, 4.0), again, ends_fault=False)
        return True

    def _stop(self) -> bool:
        run = self._target()
        if run is None:
            return False
        s = self.settings
        longest = max(s.session_timeout_ms, s.max_poll_interval_ms) / 1000.0
        seconds = self.rng.uniform(longest + 1.5, longest + 5.0)
        self._note("stop", f"SIGSTOP for {seconds:.1f}s " + self._describe(run))
        run.stopped = True
        run.proc.send_signal(signal.SIGSTOP)

        self._later(seconds, lambda: self.fleet.cont(run))
        return True

    def _restart(self) -> bool:
        if self.broker_paused:
            return False  # a clean close would wait for the broker
        run = self._target()
        if run is None:
            return False
        self._note("restart", "SIGTERM (clean close), restart " + self._describe(run))
        self.fleet.terminate(run, "restart")
        self._restart_later(run)
        return True

    def _add(self) -> bool:
        if len(self.fleet.current) >= self.settings.max_workers:
            return False
        run = self.fleet.add()
        self._note("add", f"new member {run.name}")
        return True

    def _remove(self) -> bool:
        if self.broker_paused or len(self.fleet.current) <= self.settings.min_workers:
            return False
        run = self._target()
        if run is None:
            return False
        self._note("remove", "SIGTERM, not restarted: " + self._describe(run))
        self.fleet.retire(run.slot)
        self.fleet.terminate(run, "remove")
        return True

    def _broker_pause(self) -> bool:
        if self.cluster is None or self.broker_paused:
            return False
        seconds = self.rng.uniform(*self.settings.broker_pause_s)
        self._note("broker_pause", f"SIGSTOP the broker process for {seconds:.1f}s")
        self.cluster.pause()
        self.broker_paused = True

        cluster = self.cluster
        assert cluster is not None  # broker_pause is offered for an embedded cluster only

        def resume() -> None:
            cluster.resume()
            self.broker_paused = False

        self._later(seconds, resume)
        return True

    def _broker_restart(self) -> bool:
        if "broker_restart" not in self.broker_faults or self.broker_paused:
            return False
        seconds = self.rng.uniform(*self.settings.broker_pause_s)
        self._note("broker_restart", f"broker stopped, started again in {seconds:.1f}s")
        cluster = self.cluster
        assert cluster is not None
        cluster.broker_down()
        self.broker_paused = True  # no other broker fault, no clean close meanwhile

        def start() -> None:
            cluster.broker_up()
            self.broker_paused = False

        self._later(seconds, start)
        return True

    def finish(self) -> None:
        """End every lasting fault now: resume the broker and stopped workers, restart."""
        pending, self._pending = sorted(self._pending), []
        for p in pending:
            if p.ends_fault:
                p.action()
        if self.broker_paused and self.cluster is not None:
            self.cluster.resume()
            self.broker_paused = False
        if "broker_restart" in self.broker_faults and self.cluster is not None:
            self.cluster.broker_up()  # a no-op unless a restart's start is still due
        with self.fleet.lock:
            runs = list(self.fleet.current.values())
        for r in runs:
            self.fleet.cont(r)
            if r.armed is not None:  # disarm by killing: the fault was announced
                self.fleet.kill(r, f"{r.armed} (end of chaos)")
                r.armed = None
            if r.proc.poll() is not None and self.fleet.current.get(r.slot) is r:
                self.fleet.start(r.slot)


# -------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    t: float
    group: dict[int, tuple[int, str | None]]  #: partition -> (offset, metadata)
    child: dict[int, tuple[int, str | None]]
    sizes: dict[Path, int]  #: log sizes read AFTER the offsets


class OffsetSampler:
    """Samples the group's committed offsets (and the child's log), then the log sizes.

    Plain confluent-kafka consumers that never subscribe and never commit: ``committed()``
    only, the way a lag monitor or ``kafka-consumer-groups`` reads a group.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        partitions: int,
        fleet: Fleet,
        interval_s: float,
    ) -> None:
        base = {"bootstrap.servers": bootstrap, "enable.auto.commit": False, "log_level": 2}
        self.group = PlainConsumer({**base, "group.id": group})
        self.child = PlainConsumer({**base, "group.id": group + ".catchup"})
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.fleet = fleet
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._lock = threading.Lock()  # the sampler thread and the drain share the consumers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def read_group(self, timeout: float = 10) -> dict[int, tuple[int, str | None]]:
        with self._lock:
            got = self.group.committed(self.tps, timeout)
        return {tp.partition: (tp.offset, tp.metadata) for tp in got}

    def sample(self) -> None:
        t = time.monotonic()
        group = self.read_group()
        with self._lock:
            got = self.child.committed(self.tps, 10)
        child = {tp.partition: (tp.offset, tp.metadata) for tp in got}
        sizes = {}
        for path in self.fleet.log_paths():
            try:
                sizes[path] = path.stat().st_size
            except FileNotFoundError:
                sizes[path] = 0
        self.samples.append(Sample(t, group, child, sizes))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except KafkaException:
                self.errors += 1  # broker paused: this moment is simply not sampled

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def close(self) -> None:
        self.group.close()
        self.child.close()


# ---------------------------------------------------------------------------- checks
class _RangeMax:
    """Maximum of ``values[a:b]`` in O(1) after O(n log n) setup (a sparse table):
    a soak samples thousands of moments over hundreds of thousands of offsets."""

    def __init__(self, values: Sequence[int]) -> None:
        self.levels = [list(values)]
        k = 1
        while 2 * k <= len(values):
            prev = self.levels[-1]
            self.levels.append([max(prev[i], prev[i + k]) for i in range(len(prev) - k)])
            k *= 2

    def __call__(self, a: int, b: int) -> int:
        level = (b - a).bit_length() - 1
        row = self.levels[level]
        return max(row[a], row[b - (1 << level)])


def availability(
    records: list[LogRecord], samples: list[Sample], produced: dict[int, int]
) -> dict[int, list[int]]:
    """Per partition and produced offset: the index of the first sample that saw it in a
    log (``len(samples)`` when none did)."""
    never = len(samples)
    sizes: dict[Path, list[int]] = {}
    for path in {r.log for r in records}:
        sizes[path] = [s.sizes.get(path, 0) for s in samples]
    avail = {p: [never] * n for p, n in produced.items()}
    for r in records:
        row = avail.get(r.partition)
        if row is None or r.offset >= len(row):
            continue
        idx = bisect.bisect_left(sizes[r.log], r.end)  # sizes only grow
        if idx < row[r.offset]:
            row[r.offset] = idx
    return avail


def claimed_intervals(sample: Sample, partition: int) -> tuple[int, list[tuple[int, int]]]:
    """(bare committed offset, intervals the full token + checkpoint claim processed)."""
    offset, metadata = sample.group.get(partition, (-1, None))
    child_offset, child_metadata = sample.child.get(partition, (-1, None))
    restored = restore(offset, metadata, child_offset, child_metadata)
    if restored.position is None:
        return offset, []
    intervals, cursor = [], 0
    for s, e in restored.ranges:
        if s > cursor:
            intervals.append((cursor, min(s, restored.position)))
        cursor = max(cursor, e)
    if cursor < restored.position:
        intervals.append((cursor, restored.position))
    return offset, [(a, b) for a, b in intervals if a < b]


def check_samples(
    samples: list[Sample],
    records: list[LogRecord],
    produced: dict[int, int],
    deleted: dict[int, int] | None = None,
) -> list[str]:
    """Every offset a sample declared processed must have been in a log at that sample.

    Args:
        produced: partition -> log end (every offset below it was produced).
        deleted: partition -> low watermark at the end; offsets below it that no log holds
            were deleted by retention (reported apart), so claiming them is no violation.
    """
    avail = availability(records, samples, produced)
    for p, low in (deleted or {}).items():
        row = avail.get(p, [])
        for o in range(min(low, len(row))):
            if row[o] == len(samples):
                row[o] = -1
    problems = []
    for p in sorted(produced):
        row = avail[p]
        if not row:
            continue
        rmax = _RangeMax(row)
        for idx, sample in enumerate(samples):
            bare, claimed = claimed_intervals(sample, p)
            checks = [("committed offset", [(0, bare)] if bare > 0 else [])]
            checks.append(("token+checkpoint claim", claimed))
            for what, intervals in checks:
                for a, b in intervals:
                    if b > len(row):
                        problems.append(f"sample {idx} partition {p}: {what} {b} > log end")
                        b = len(row)
                    if a >= b or rmax(a, b) <= idx:
                        continue
                    late = [o for o in range(a, b) if row[o] > idx]
                    problems.append(
                        f"sample {idx} (t={sample.t:.1f}) partition {p}: {what} covers "
                        f"[{a}, {b}) but {len(late)} offsets were not in any log yet, first "
                        f"{late[:10]} (group {sample.group.get(p)}, child {sample.child.get(p)})"
                    )
    return problems


def percentiles(
    values: list[float], points: Sequence[float] = (50, 90, 99, 99.9)
) -> dict[str, float]:
    """Nearest-rank percentiles plus max; empty input gives NaNs."""
    if not values:
        return {**{f"p{q:g}": math.nan for q in points}, "max": math.nan, "n": 0}
    ordered = sorted(values)
    out: dict[str, float] = {}
    for q in points:
        rank = max(1, math.ceil(q * len(ordered) / 100 - 1e-9))  # 99.9% of 1000: 999th
        out[f"p{q:g}"] = ordered[rank - 1]
    out["max"] = ordered[-1]
    out["n"] = len(ordered)
    return out


# ---------------------------------------------------------------------------- result
@dataclass
class ChaosResult:
    seed: int
    settings: ChaosSettings
    workdir: Path
    topic: str = ""
    group: str = ""
    chaos_seconds: float = 0.0
    drain_seconds: float = 0.0
    total_seconds: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[str] = field(default_factory=list)
    processes: int = 0
    produced: int = 0
    produce_failed: int = 0
    delivered_unique: int = 0
    logged: int = 0
    lost: list[int] = field(default_factory=list)  #: values in no log, not deleted
    deleted_by_retention: int = 0  #: values in no log, below the low watermark
    duplicated_values: int = 0
    extra_copies: int = 0
    samples: int = 0
    sample_errors: int = 0
    token_samples: int = 0  #: partition samples whose group commit carried a range token
    checkpoint_samples: int = 0
    violations: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  #: log lines that disagree with the producer
    deaths: list[str] = field(default_factory=list)
    #: clean shutdowns that broke a documented bound (``shutdown_report``)
    bounds_exceeded: list[str] = field(default_factory=list)
    shutdown_seconds: list[float] = field(default_factory=list)  #: SIGTERM to exit
    modes: Counter[str] = field(default_factory=Counter)  #: worker processes per mode
    async_commit_kinds: Counter[str] = field(default_factory=Counter)
    #: the async pipeline's commits by when they landed: "current" (the assignment that
    #: handed the record out), "reassigned" (a later one), "revoked" (not assigned then)
    async_commit_whens: Counter[str] = field(default_factory=Counter)
    drained: bool = False
    low_watermarks: dict[int, int] = field(default_factory=dict)
    log_ends: dict[int, int] = field(default_factory=dict)
    latency_fresh: dict[str, float] = field(default_factory=dict)
    latency_all: dict[str, float] = field(default_factory=dict)
    backlog_first_deliveries: int = 0
    #: eos: records read committed from the output topic, input values with no output
    #: (not deleted by retention), and values with more than one output
    output_records: int = 0
    output_missing: list[int] = field(default_factory=list)
    output_duplicated: list[int] = field(default_factory=list)

    @property
    def fault_total(self) -> int:
        return sum(self.faults.values())

    @property
    def ok(self) -> bool:
        return (
            not (
                self.lost
                or self.violations
                or self.wrong
                or self.deaths
                or self.bounds_exceeded
                or self.produce_failed
                or self.output_missing
                or self.output_duplicated
            )
            and self.drained
            and self.produced > 0
        )

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} records lost, first values {self.lost[:20]}")
        if self.produce_failed:
            out.append(f"{self.produce_failed} records failed to produce")
        if not self.drained:
            out.append(f"committed offsets never reached the log ends {self.log_ends}")
        if self.output_missing:
            out.append(
                f"{len(self.output_missing)} input records have no committed output, first "
                f"values {self.output_missing[:20]}"
            )
        if self.output_duplicated:
            out.append(
                f"{len(self.output_duplicated)} input records have more than one committed "
                f"output, first values {self.output_duplicated[:20]}"
            )
        out += self.wrong[:10] + self.violations[:20] + self.deaths[:10]
        out += self.bounds_exceeded[:10]
        return out


def _ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value / 1000:.2f} s" if value >= 10000 else f"{value:.1f} ms"


def format_summary(r: ChaosResult, command: str | None = None) -> str:
    """The summary table (docs/reliability.md quotes one)."""
    s = r.settings
    faults = ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items()))
    modes = ", ".join(f"{m} {r.modes[m]}" for m in ALL_WORKER_MODES if m in s.modes)
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(r.async_commit_kinds.items()))
    whens = r.async_commit_whens
    slowest = max(r.shutdown_seconds, default=math.nan)
    rows = [
        ("command", command or "-"),
        ("seed", str(r.seed)),
        ("result", "PASS" if r.ok else "FAIL"),
        ("chaos / drain / total", f"{r.chaos_seconds:.0f} s / {r.drain_seconds:.0f} s / "
                                  f"{r.total_seconds:.0f} s"),
        ("setup", f"{s.partitions} partitions, {s.workers} workers ({s.min_workers}-"
                  f"{s.max_workers}), {s.protocol} protocol, threshold {s.threshold}, "
                  f"{s.rate:g} records/s, {s.work_us} us/record"
                  + (f", CPU hog of {s.cpu_hog} busy processes" if s.cpu_hog else "")),
        ("faults injected", f"{r.fault_total} ({faults})"),
        ("worker processes", f"{r.processes} ({modes})"),
        ("async commits", f"{sum(whens.values()):,} ({whens['revoked']:,} after the partition "
                          f"left the member, {whens['reassigned']:,} in a later assignment of "
                          f"it; {kinds or 'none'})"),
        ("clean shutdowns", f"{len(r.shutdown_seconds)}, slowest {_s(slowest)} from SIGTERM "
                            f"to exit; {len(r.bounds_exceeded)} documented bounds exceeded"),
        ("records produced", f"{r.produced:,}"),
        ("delivered (unique)", f"{r.delivered_unique:,} ({r.logged:,} log lines)"),
        ("lost", str(len(r.lost))),
        ("deleted by retention", str(r.deleted_by_retention)),
        ("duplicates", f"{r.duplicated_values:,} records delivered more than once "
                       f"({r.extra_copies:,} extra copies)"),
        ("offset samples", f"{r.samples} ({r.sample_errors} failed while the broker was "
                           f"paused); {r.token_samples} with a range token, "
                           f"{r.checkpoint_samples} with a child checkpoint"),
        ("offset ran ahead", f"{len(r.violations)} violations"),
        ("latency, fresh", _lat(r.latency_fresh)),
        ("latency, all", _lat(r.latency_all) + f" ({r.backlog_first_deliveries:,} first "
                                                "delivered by the child)"),
        ("logs", str(r.workdir)),
    ]  # fmt: skip
    if s.eos:
        rows.insert(-1, (
            "exactly once (output)",
            f"{r.output_records:,} committed outputs read; {len(r.output_missing)} inputs "
            f"without one, {len(r.output_duplicated)} with more than one",
        ))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 72
    out = [line]
    out += [f"| {k:<{width}} | {v}" for k, v in rows]
    out.append(line)
    return "\n".join(out)


def _s(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.1f} s"


def _lat(p: dict[str, float]) -> str:
    if not p or not p.get("n"):
        return "-"
    return (
        f"p50 {_ms(p['p50'])}, p90 {_ms(p['p90'])}, p99 {_ms(p['p99'])}, "
        f"p99.9 {_ms(p['p99.9'])}, max {_ms(p['max'])} (n={p['n']:,})"
    )


# ---------------------------------------------------------------------------- the run
def _default_seed() -> int:
    return random.SystemRandom().randrange(1 << 32)


def run_chaos(
    settings: ChaosSettings,
    cluster: Any = None,
    out: Callable[[str], None] = print,
) -> ChaosResult:
    """Run one chaos experiment and check it; see the module docstring.

    Args:
        settings: what to run; ``settings.seed`` replays a previous run's fault schedule.
        cluster: a running cluster (``EmbeddedKafka`` enables the broker-pause fault); None
            starts an embedded one, or uses ``settings.bootstrap_servers``.
        out: where progress lines go (the seed first).
    """
    settings.validate()
    seed = settings.seed if settings.seed is not None else _default_seed()
    rng = random.Random(seed)
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="fastrebalance-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = ChaosResult(seed, settings, workdir)
    out(f"chaos: seed={seed} (replay with --seed {seed}); logs in {workdir}")
    hogs = start_cpu_hog(settings.cpu_hog)
    if hogs:
        out(f"chaos: CPU hog: {len(hogs)} busy processes (pids {[h.pid for h in hogs]})")
    own_cluster: Any = None
    try:
        if cluster is None:
            if settings.bootstrap_servers:
                from fastrebalance.testing._clusters import ExternalKafka

                own_cluster = cluster = ExternalKafka(settings.bootstrap_servers)
            elif settings.kafka_home is not None:
                from fastrebalance.testing._apache import ApacheKafka

                own_cluster = cluster = ApacheKafka(settings.kafka_home)
                out(f"chaos: Apache Kafka of its own at {cluster.bootstrap_servers}")
            else:
                from fastrebalance.testing._embedded import EmbeddedKafka

                own_cluster = cluster = EmbeddedKafka()
        return _run(settings, cluster, rng, result, out)
    finally:
        stop_cpu_hog(hogs)
        if own_cluster is not None:
            own_cluster.close()


#: A busy loop that ends by itself when its parent (argv[1]) is gone, even SIGKILLed: it
#: checks every ~20 ms of spinning.
_HOG = """\
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(300000):
        pass
"""


def start_cpu_hog(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that keep a core busy each: a loaded machine beside the run."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", _HOG, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def stop_cpu_hog(hogs: list[subprocess.Popen[bytes]]) -> None:
    for h in hogs:
        if h.poll() is None:
            h.kill()
    for h in hogs:
        h.wait()


def _run(
    settings: ChaosSettings,
    cluster: Any,
    rng: random.Random,
    result: ChaosResult,
    out: Callable[[str], None],
) -> ChaosResult:
    s = settings
    t0 = time.monotonic()
    bootstrap = cluster.bootstrap_servers
    result.topic = topic = f"chaos-{uuid4().hex[:8]}"
    result.group = group = f"chaos-{uuid4().hex[:8]}"
    if s.eos:
        from fastrebalance.testing._clusters import transactions_supported

        supported, why = transactions_supported(cluster)
        if not supported:
            raise RuntimeError(f"eos workers need transactions: {why}")
        cluster.create_topic(topic + OUTPUT_SUFFIX, s.partitions)
    cluster.create_topic(topic, s.partitions)
    for kind, method in BROKER_FAULTS.items():
        if kind in s.faults and not hasattr(cluster, method):
            out(f"chaos: {kind} needs a broker of the run's own; skipped on this one")
    producer = SteadyProducer(bootstrap, topic, s.partitions, s.rate, s.linger_ms, s.compression)
    fleet = Fleet(bootstrap, topic, group, s, result.workdir, result.seed)
    injector = FaultInjector(fleet, rng, s, cluster, out)
    sampler = OffsetSampler(bootstrap, topic, group, s.partitions, fleet, s.sample_interval_s)
    probe = PlainConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group + ".probe", "log_level": 2}
    )
    try:
        for _ in range(s.workers):
            fleet.add()
        producer.start()
        sampler.start()
        _warm_up(sampler, s.warmup_timeout_s, out)
        out(
            f"chaos: {s.workers} workers, {s.partitions} partitions, {s.rate:g} records/s, "
            f"faults for {s.duration_s:g}s"
        )
        chaos_start = time.monotonic()
        end = chaos_start + s.duration_s
        hard_end = end + max(60.0, s.duration_s * 0.5)  # room to reach min_faults
        next_fault = time.monotonic() + rng.uniform(*s.fault_gap_s)
        while True:
            now = time.monotonic()
            total = sum(injector.counts.values())
            enough = total >= s.min_faults and not (s.every_fault and injector.missing())
            if now >= hard_end or (now >= end and enough):
                break
            injector.run_due()
            fleet.check_alive()
            if now >= next_fault:
                injector.inject()
                next_fault = time.monotonic() + rng.uniform(*s.fault_gap_s)
            time.sleep(0.05)
        injector.finish()
        chaos_end = time.monotonic()
        result.chaos_seconds = chaos_end - chaos_start
        undelivered = producer.stop()
        out(
            f"chaos: faults over after {result.chaos_seconds:.0f}s: {injector.counts.total()} "
            f"faults, {producer.sent:,} records produced ({undelivered} undelivered); draining"
        )
        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(s.partitions)
        }
        high = {p: h for p, (_, h) in marks.items()}

        def committed() -> list[int]:
            """The group's committed offset per partition (-1: unknown or unreadable)."""
            try:
                got = sampler.read_group()
            except KafkaException:
                return [-1] * len(high)
            return [got.get(p, (-1, None))[0] for p in high]

        # The drain fails when it stalls: no committed offset moved for drain_timeout_s.
        # A loaded machine drains slowly, not wrongly; a hard cap still ends a crawl.
        started = time.monotonic()
        stalled_at, seen = started + s.drain_timeout_s, -1
        while True:
            offsets = committed()
            if ok := all(o >= high[p] for p, o in zip(high, offsets, strict=True)):
                break
            now, total = time.monotonic(), sum(max(o, 0) for o in offsets)
            if total > seen:
                seen, stalled_at = total, now + s.drain_timeout_s
            if now >= stalled_at or now >= started + DRAIN_CAP_FACTOR * s.drain_timeout_s:
                break
            fleet.check_alive()
            time.sleep(0.5)
        result.drained = ok
        result.drain_seconds = time.monotonic() - chaos_end
        out(f"chaos: drain {'done' if ok else 'TIMED OUT'} after {result.drain_seconds:.0f}s")
        fleet.check_alive()
        fleet.terminate_all()
        sampler.stop()
        sampler.sample()  # a last one, with every worker stopped
        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(s.partitions)
        }
        result.low_watermarks = {p: low for p, (low, _) in marks.items()}
        result.log_ends = {p: h for p, (_, h) in marks.items()}
    finally:
        if injector.broker_paused and injector.cluster is not None:
            # an error mid-run must not leave the broker stopped
            injector.cluster.resume()
            injector.broker_paused = False
        fleet.kill_everything()
        sampler.stop()
        sampler.close()
        probe.close()

    result.faults = injector.counts
    result.fault_log = injector.log
    result.processes = len(fleet.runs)
    result.deaths = list(fleet.deaths)
    result.bounds_exceeded = list(fleet.slow)
    result.shutdown_seconds = list(fleet.shutdown_s)
    for r in fleet.runs:
        result.modes[r.mode] += 1
        if r.mode == "async":
            result.async_commit_kinds.update(r.commit_kinds)
            result.async_commit_whens.update(r.commit_whens)
    result.samples, result.sample_errors = len(sampler.samples), sampler.errors
    _check(result, producer, fleet, sampler)
    if s.eos:
        _check_output(result, producer, bootstrap, topic + OUTPUT_SUFFIX, s.partitions)
    result.total_seconds = time.monotonic() - t0
    return result


def _warm_up(sampler: OffsetSampler, timeout: float, out: Callable[[str], None]) -> None:
    """Wait until every partition has a committed offset: a partition without one follows
    auto.offset.reset with no catch-up, so faults before that test nothing of ours and
    only inflate the latency figures."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            got = sampler.read_group()
        except KafkaException:
            got = {}
        if got and all(offset >= 0 for offset, _ in got.values()):
            out(f"chaos: group warmed up in {time.monotonic() - started:.0f}s")
            return
        time.sleep(0.5)
    out(f"chaos: not every partition had a commit after {timeout:g}s; injecting faults anyway")


def _check(
    result: ChaosResult, producer: SteadyProducer, fleet: Fleet, sampler: OffsetSampler
) -> None:
    result.produced = producer.sent
    result.produce_failed = len(producer.failed)
    delivered = producer.delivered
    records = read_logs(fleet.log_paths())
    result.logged = len(records)
    counts = Counter(r.value for r in records)
    result.delivered_unique = len(counts)
    result.wrong = [
        f"log {r.log.name}: value {r.value} at {r.partition}/{r.offset}, produced at "
        f"{delivered.get(r.value)}"
        for r in records
        if delivered.get(r.value) != (r.partition, r.offset)
    ][:20]
    low = result.low_watermarks
    missing = sorted(set(delivered) - set(counts))
    deleted = [v for v in missing if delivered[v][1] < low.get(delivered[v][0], 0)]
    result.deleted_by_retention = len(deleted)
    result.lost = sorted(set(missing) - set(deleted))
    dups = [n for n in counts.values() if n > 1]
    result.duplicated_values = len(dups)
    result.extra_copies = sum(dups) - len(dups)

    first: dict[int, LogRecord] = {}
    for r in records:
        seen = first.get(r.value)
        if seen is None or r.latency_ms < seen.latency_ms:
            first[r.value] = r
    result.latency_all = percentiles([r.latency_ms for r in first.values()])
    result.latency_fresh = percentiles([r.latency_ms for r in first.values() if r.stream == "f"])
    result.backlog_first_deliveries = sum(1 for r in first.values() if r.stream == "b")

    samples = sampler.samples
    result.token_samples = sum(
        1 for smp in samples for _, md in smp.group.values() if md and md.startswith("~fr")
    )
    result.checkpoint_samples = sum(
        1 for smp in samples for off, _ in smp.child.values() if off >= 0
    )
    result.violations = check_samples(samples, records, result.log_ends, low)


def read_committed_output(
    bootstrap: str, topic: str, partitions: int, timeout: float = 120.0
) -> Counter[int]:
    """Every value in ``topic`` as a downstream ``read_committed`` consumer sees it.

    Reads until every partition reports its end; a transaction still open holds its
    partition's last stable offset back until it ends (``transaction.timeout.ms``)."""
    reader = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-checker",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    counts: Counter[int] = Counter()
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions and time.monotonic() < deadline:
            for m in reader.consume(1000, 0.5):
                err = m.error()
                partition, value = m.partition(), m.value()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and partition is not None:
                        at_end.add(partition)
                    continue
                at_end.discard(partition or 0)
                counts[int(value or b"-1")] += 1
        if len(at_end) < partitions:
            raise RuntimeError(f"the output topic {topic} was not read to its end in {timeout}s")
    finally:
        reader.close()
    return counts


def _check_output(
    result: ChaosResult, producer: SteadyProducer, bootstrap: str, topic: str, partitions: int
) -> None:
    """Exactly once: each input value has one committed output record, no more."""
    counts = read_committed_output(bootstrap, topic, partitions)
    result.output_records = sum(counts.values())
    delivered = producer.delivered
    low = result.low_watermarks
    gone = {v for v, (p, o) in delivered.items() if o < low.get(p, 0) and v not in counts}
    result.output_missing = sorted(set(delivered) - set(counts) - gone)
    result.output_duplicated = sorted(v for v, n in counts.items() if n > 1)
