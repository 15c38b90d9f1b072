"""The chaos run's consumer processes (``_crashworker``), seen from the harness: start them,
read their events, signal, restart and stop them, and time each clean shutdown against the
library's documented bounds.

Thread ownership: each worker's events are read by a thread of its own, which touches no
Kafka handle; ``Fleet.lock`` guards what those threads update.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastrebalance._assigning import REVOKE_WAIT_S
from fastrebalance._planner import PLAN_BUDGET_S as _PLAN_BUDGET_S
from fastrebalance.testing._chaos_settings import OUTPUT_SUFFIX, ChaosSettings

__all__ = [
    "BOUND_SLACK_S",
    "OWN_STEP",
    "Fleet",
    "WorkerRun",
    "close_limit",
    "documented_bounds",
    "shutdown_report",
]

_WORKER_MODULE = "fastrebalance.testing._crashworker"
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
