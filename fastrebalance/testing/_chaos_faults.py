"""The chaos run's faults: which one, when, and to whom, drawn from the run's seeded random
stream, so that a seed replays the schedule; and the CPU hog that loads the machine.

A fault that lasts (a stopped worker, a paused broker, a killed worker awaiting its
restart) schedules its own end, so faults overlap as they would in production.
"""

from __future__ import annotations

import heapq
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastrebalance.testing._chaos_settings import BROKER_FAULTS, ChaosSettings
from fastrebalance.testing._chaos_workers import Fleet, WorkerRun

__all__ = ["FaultInjector", "start_cpu_hog", "stop_cpu_hog"]

#: How long a worker armed to die mid-backlog may wait for one before it is killed anyway.
_ARMED_GRACE_S = 8.0


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
