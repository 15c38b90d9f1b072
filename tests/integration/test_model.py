"""A stateful, model-based test of fastrebalance.Consumer's commit safety (S1) and
at-least-once redelivery (S2), against the embedded cluster.

The REAL ``fastrebalance.Consumer`` runs in subprocesses (``fastrebalance.testing._modeldriver``,
driven over a pipe), so that a crash is a real SIGKILL (no commit, no leave-group) and a second
member is a real second process. Hypothesis interleaves: produce; poll()/consume() (the records
are *held* by the application and processed later, out of order); commit(message=),
commit(offsets=) (rewinds and offsets from earlier assignments included), bare commit(),
store_offsets() (examples with enable.auto.offset.store=false); assign / incremental_assign /
unassign / incremental_unassign; pause / resume; seek; crash-and-restart of the whole consumer;
and (subscribe scenario) a second member joining, leaving, crashing. enable.auto.commit=false:
the application commits.

The oracle knows which records the application has PROCESSED (a record is processed when the
application processes a batch it holds, not when it is delivered) and which it DISMISSED (skipped
by a forward seek). Records held by a process when it is killed are never processed by it.
Checks:

  S1  after every step: the offset Kafka stores for the group (read by a plain AdminClient) never
      passes a produced record that is neither processed nor dismissed, nor the log end;
  R   (assign scenario) right after a successful synchronous commit(offsets=[n]) the stored
      offset is <= n (at or past F the primary's position becomes n; below F it is a rewind,
      unless n follows a record handed out below F: a commit of that record);
  S2  at the end every driver is SIGKILLed, a fresh fastrebalance.Consumer (mode on) assigns the
      topic, and every produced record neither processed nor dismissed must be delivered;
  and every delivered record must be the one produced at that offset.

The application only makes TRUTHFUL claims (otherwise a violation would be the application's
fault), as /work/notes/semantics.md defines them:

* commit(message=m) / store_offsets(message=m): only when m's offset and the offset of every
  record this process delivered BEFORE m on that partition (any stream, any assignment, in
  delivery order) are processed or dismissed: more than the semantics let the library claim
  (m and what the stream that delivered m delivered before it, in that assignment).
* commit(offsets=[n]) / store_offsets(offsets=[n]) claim [F, n) when n >= F, nothing when n < F,
  F being where the primary started in the partition's current (or last) assignment in this
  process, except when a child handed out the record at n - 1: then n claims what
  commit(message=) of that record would, and is no rewind. The test does not see F; it keeps a
  lower bound L <= F per assignment (see ``_lower_bound_of_start``) and commits n only when
  [L, n) is processed or dismissed. So any n <= L (a rewind, the primary's start, an offset of a
  record from an earlier assignment) is allowed, even above records it holds unprocessed
  (``OFFSETS_BELOW_START_CLAIM_NOTHING``). And if the process was handed the record at n - 1,
  that record must be eligible as for commit(message=). Never for a partition this process
  never had.
* bare commit() with enable.auto.offset.store=true: only when every record the process was handed
  is processed or dismissed. With enable.auto.offset.store=false a bare commit() commits what was
  stored (as librdkafka does), so it is always allowed
  (``BARE_COMMIT_IN_STORE_MODE_CLAIMS_STORED``).
* seek(tp, s) from the primary's position() p: s > p dismisses [p, s); s <= p dismisses nothing.
  With position() unknown (-1001: nothing read in this assignment yet) [L, s) is dismissed.

Scenarios. The mock cluster rejects commits from an assign()-only consumer into a group that has
ever had a subscribed member (UNKNOWN_MEMBER_ID), so each example is one of:

* ``test_model_assign``: one consumer (restarted after crashes) using assign()/incremental_assign()/
  unassign()/incremental_unassign() (partitions without offsets: the committed offset applies and
  the catch-up plan runs): no join delays, steps are cheap;
* ``test_model_group``: subscribe() (cooperative-sticky, session.timeout.ms=2000), with a second
  member joining / leaving (close()) / crashing, and crash-restart of the main member.

Each example starts from a topic with 1-2 partitions where "a previous incarnation" committed
some offset (partition 0 always, partition 1 maybe) below a backlog of 0-60 records, with a lag
threshold of 5, 10 or 20: most examples start with a catch-up.

Profiles. The default (``make test``) is deterministic (derandomized, no example database).
FASTREBALANCE_MODEL_PROFILE=long runs many more, longer, random examples (and keeps failing ones
in .hypothesis/); FASTREBALANCE_MODEL_EXAMPLES / FASTREBALANCE_MODEL_STEPS override either
profile::

    FASTREBALANCE_MODEL_PROFILE=long .venv/bin/python -m pytest tests/integration/test_model.py

Reading a failure: the trace in the exception message (also printed between Hypothesis's
``state.step(...)`` lines) is what was done and what the consumer answered. The step arguments
are indices into the choices of the moment (see ``ModelMachine.step``), and a shrunk example is
padded with ``action='noop'`` steps. Knobs for investigating: FASTREBALANCE_MODEL_VERBOSE=1
(print every step, with -s), FASTREBALANCE_MODEL_SHRINK=0, FASTREBALANCE_MODEL_DISABLE=<actions>
(look past a known bug), FASTREBALANCE_MODEL_SURVEY=1 (never fail: print every kind of
violation seen, with -s).
"""

from __future__ import annotations

import functools
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple
from uuid import uuid4

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as _engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

import fastrebalance
from fastrebalance import Consumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# ------------------------------------------------------------------------------ profiles
PROFILE = os.environ.get("FASTREBALANCE_MODEL_PROFILE", "default")
#: (examples, steps per example) of each scenario. The default runs in about 1.5 minutes on a
#: 2-core machine when nothing fails (~1.7 s per assign example, ~3.5 s per group example);
#: a failure adds up to SHRINK_SECONDS of shrinking per test.
_PROFILES = {
    "default": {"assign": (30, 30), "group": (8, 20)},
    "long": {"assign": (500, 50), "group": (60, 40)},
}
if PROFILE not in _PROFILES:
    raise ValueError(
        f"FASTREBALANCE_MODEL_PROFILE={PROFILE!r}: expected one of {sorted(_PROFILES)}"
    )
ASSIGN_EXAMPLES, ASSIGN_STEPS = _PROFILES[PROFILE]["assign"]
GROUP_EXAMPLES, GROUP_STEPS = _PROFILES[PROFILE]["group"]
if "FASTREBALANCE_MODEL_EXAMPLES" in os.environ:  # the group scenario gets a fifth
    ASSIGN_EXAMPLES = int(os.environ["FASTREBALANCE_MODEL_EXAMPLES"])
    GROUP_EXAMPLES = max(1, ASSIGN_EXAMPLES // 5)
if "FASTREBALANCE_MODEL_STEPS" in os.environ:  # and two thirds of the steps
    ASSIGN_STEPS = int(os.environ["FASTREBALANCE_MODEL_STEPS"])
    GROUP_STEPS = max(10, ASSIGN_STEPS * 2 // 3)

#: A bare commit() with enable.auto.offset.store=false commits the stored offsets (librdkafka):
#: it claims only what store_offsets() claimed, so the application may always call it. Set to
#: False to require, as with auto store, that everything handed out is processed first.
BARE_COMMIT_IN_STORE_MODE_CLAIMS_STORED = True

#: semantics.md: commit(offsets=[n]) with n < F (the primary's start in the current assignment)
#: claims nothing, so the application may make it whatever it holds unprocessed. Set to False
#: to also require, as plain Kafka would, that every record below n this process was handed
#: (in any assignment) is processed or dismissed.
OFFSETS_BELOW_START_CLAIM_NOTHING = True

#: Where the driver processes find the fastrebalance package this test imported.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastrebalance.__file__)))
_REPLY_TIMEOUT_S = 60.0
_FINAL_DRAIN_S = 30.0
#: A consume step stops after this long without a record (or CAP_S in all): long enough that
#: what is fetchable is delivered (so replays during shrinking see the same records).
IDLE_S = 0.2
#: Pause after producing, so fetchers have the new records before the next step.
FETCH_SETTLE_S = 0.05
CAP_S = 3.0

#: Actions to leave out, e.g. FASTREBALANCE_MODEL_DISABLE=commit_offsets,seek (to look for a
#: second bug once one is known); "rewind_check" turns check R off.
#: FASTREBALANCE_MODEL_SHRINK=0 reports the first failing example unshrunk (shrinking replays
#: examples against the cluster: up to 5 minutes).
DISABLED = {
    r.strip() for r in os.environ.get("FASTREBALANCE_MODEL_DISABLE", "").split(",") if r.strip()
}
SHRINK = os.environ.get("FASTREBALANCE_MODEL_SHRINK", "1") != "0"
#: Shrinking stops after this long (Hypothesis' own limit is 5 minutes), per test.
SHRINK_SECONDS = int(
    os.environ.get("FASTREBALANCE_MODEL_SHRINK_SECONDS", 120 if PROFILE == "default" else 300)
)
#: FASTREBALANCE_MODEL_SURVEY=1: never fail, print each violation seen (with pytest -s) and
#: carry on (what a library's full set of problems looks like, and a timing of full runs).
SURVEY = os.environ.get("FASTREBALANCE_MODEL_SURVEY", "0") != "0"
SURVEYED: list[str] = []
#: FASTREBALANCE_MODEL_VERBOSE=1 prints every step as it runs (with pytest -s).
VERBOSE = os.environ.get("FASTREBALANCE_MODEL_VERBOSE", "0") != "0"


#: How often each action is drawn, relative to the others. The first is Hypothesis's
#: "simplest" step: a shrunk example is padded with it up to its full length (every example
#: runs all its steps, see ``_recorded``), so it does nothing.
WEIGHTS: list[tuple[str, int]] = [
    ("noop", 1),
    ("produce", 3),
    ("consume", 4),
    ("process", 4),
    ("commit_message", 4),
    ("commit_offsets", 3),
    ("commit_bare", 1),
    ("assign", 2),
    ("incremental_assign", 1),
    ("unassign", 2),
    ("incremental_unassign", 1),
    ("pause", 1),
    ("resume", 1),
    ("seek", 1),
    ("crash_restart", 2),
    ("member2_join", 1),
    ("member2_leave", 1),
]
ACTIONS = [name for name, weight in WEIGHTS for _ in range(weight)]


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=PROFILE == "default",
        database=None if PROFILE == "default" else settings.default.database,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=True,
        phases=[p for p in Phase if SHRINK or p is not Phase.shrink],
    )


# -------------------------------------------------------------------------------- driver
class DriverError(AssertionError):
    pass


class DriverProc:
    """One consumer process (``_modeldriver``) plus what the oracle knows about it."""

    def __init__(self, name: str, topic: str, conf: dict[str, Any]) -> None:
        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fastrebalance.testing._modeldriver",
                "--topic",
                topic,
                "--config",
                json.dumps(conf),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name=f"model-{name}").start()
        self.alive = True
        ready = self._read(_REPLY_TIMEOUT_S)
        if not ready.get("ok"):
            self.kill()
            raise DriverError(f"{name} did not start: {ready}; stderr: {self.stderr_text()}")
        # the oracle's view of this process
        self.handles: dict[int, tuple[int, int]] = {}  # handle -> (partition, offset)
        self.deliveries: dict[int, list[tuple[int, int]]] = {}  # partition -> [(handle, offset)]
        self.held: dict[int, None] = {}  # handles not processed yet, in delivery order
        self.lower: dict[int, int] = {}  # partition -> L <= F of its current/last assignment
        self.assigned: list[int] = []
        self.paused: set[int] = set()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stderr_text(self, tail: int = 3000) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read()[-tail:] or "(empty)"
        except (OSError, ValueError):
            return "(unavailable)"

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise DriverError(
                f"{self.name} (pid {self.proc.pid}) gave no answer within {timeout:g}s;"
                f" stderr: {self.stderr_text()}"
            ) from None
        if line is None:
            code = self.proc.wait()
            self.alive = False
            raise DriverError(
                f"{self.name} (pid {self.proc.pid}) exited with {code}; stderr:"
                f" {self.stderr_text()}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.alive, f"{self.name} is not running"
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # reading reports the death, with stderr
        answer = self._read(_REPLY_TIMEOUT_S)
        if not answer.get("ok") and answer.get("traceback"):
            # a Python exception from the library (not a KafkaException): a bug, not weather
            raise DriverError(
                f"{self.name}: {op}{fields} raised {answer['error']}\n{answer['traceback']}"
            )
        return answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.alive = False
        self.stderr.close()

    def close(self) -> None:
        try:
            self.call("close")
            self.proc.wait(30)
        except (DriverError, subprocess.TimeoutExpired):
            pass
        self.kill()


# --------------------------------------------------------------------------------- oracle
class Violation(AssertionError):
    """S1, S2, R, or a delivery that contradicts what was produced."""


def _recorded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a step unless a violation was already seen; record, rather than raise, what goes
    wrong: ``teardown`` raises it.

    Failing at once would make the number of steps an example draws depend on when the real
    system misbehaves, which varies a little from run to run; Hypothesis then calls its own
    replays inconsistent (FlakyStrategyDefinition) instead of shrinking them. Every example
    therefore draws all its steps; after a violation they do nothing."""

    @functools.wraps(fn)
    def wrapper(self: ModelMachine, *args: Any, **kwargs: Any) -> Any:
        if self.violation is not None:
            return None
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            if isinstance(exc, Violation):
                self.violated(str(exc))
            else:
                self.violated(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return None

    return wrapper


class Args(NamedTuple):
    """One step's arguments (see ``ModelMachine.step``)."""

    who: int
    x: int
    y: int
    flags: int
    subset: list[int]

    @property
    def store(self) -> bool:
        return bool(self.flags & 1)

    @property
    def asynchronous(self) -> bool:
        return bool(self.flags & 2)

    @property
    def crash(self) -> bool:
        return bool(self.flags & 4)


class ModelMachine(RuleBasedStateMachine):
    """The shared model; the two scenarios are the subclasses below."""

    SUBSCRIBE = False
    # set by the test function, shared by the examples
    cluster: Any = None
    admin: AdminClient | None = None
    producer: Producer | None = None

    def __init__(self) -> None:
        super().__init__()
        self.violation: str | None = None
        self.surveyed: set[str] = set()
        self.started = False
        self.t0 = time.monotonic()
        self.step_no = 0
        self.trace: list[str] = []
        self.drivers: dict[str, DriverProc] = {}
        self.incarnations = 0
        self.produced: dict[int, list[str]] = {}
        self.done: dict[int, set[int]] = {}  # processed or dismissed offsets
        self.stored: dict[int, int] = {}  # last stored offsets read
        self.committed_seen: set[int] = set()  # partitions the group surely has an offset for
        self.seq = 0

    # ------------------------------------------------------------------- bookkeeping
    def log(self, line: str) -> None:
        line = f"[{self.step_no}] {line}"
        self.trace.append(line)
        note(line)
        if VERBOSE:
            print(f"{time.monotonic() - self.t0:7.2f}s {line}", flush=True)

    def trace_tail(self, n: int = 300) -> str:
        return "\n".join(self.trace[-n:])

    def violated(self, message: str) -> None:
        """Remember the first violation (teardown raises it); later steps do nothing.

        In survey mode (FASTREBALANCE_MODEL_SURVEY=1) every new kind of violation is printed
        and the example goes on: the test passes and reports what it saw."""
        first = message.splitlines()[0]
        if SURVEY:
            kind = re.sub(r"\d+", "N", first)[:80]
            if kind not in self.surveyed:
                self.surveyed.add(kind)
                self.log(f"VIOLATION (survey): {first}")
                SURVEYED.append(f"{first}\n--- trace:\n{self.trace_tail()}")
            return
        if self.violation is None:
            self.log(f"VIOLATION: {first}")
            self.violation = f"{message}\n--- trace:\n{self.trace_tail()}"

    def ok(self, p: int, o: int) -> bool:
        return o in self.done[p]

    def log_end(self, p: int) -> int:
        return len(self.produced[p])

    def conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.cluster.bootstrap_servers,
            "group.id": self.group,
            "enable.parallel.rebalance": True,
            "parallel.rebalance.lag.threshold": self.threshold,
            "enable.auto.commit": False,
            "enable.auto.offset.store": not self.store_mode,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
        if self.SUBSCRIBE:
            conf.update(
                {
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": 2000,
                    "heartbeat.interval.ms": 400,
                }
            )
        return conf

    def spawn(self, name: str) -> DriverProc:
        self.incarnations += 1
        d = DriverProc(f"{name}#{self.incarnations}", self.topic, self.conf())
        self.drivers[name] = d
        self.log(f"start {d.name} (pid {d.proc.pid})")
        return d

    def read_group(self) -> dict[int, int]:
        assert self.admin is not None
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        futures = self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.group, tps)], request_timeout=15
        )
        (future,) = futures.values()
        got = future.result(timeout=20)
        out = {}
        for tp in got.topic_partitions:
            if tp.error is not None:
                raise AssertionError(f"list_consumer_group_offsets: {tp.error}")
            out[tp.partition] = tp.offset
        return out

    def _lower_bound_of_start(self, p: int, catchup: dict[str, list[list[int]]] | None) -> int:
        """L <= F, where the primary starts in an assignment of ``p`` made just now.

        * No offset committed for ``p`` (as far as the test knows): F is where
          auto.offset.reset=earliest puts it, 0 here. L = 0.
        * catchup_status() shows a pending range ending at the log end H: a catch-up, F = H.
          (An older range ending at H means nothing was produced since, so F = P = H anyway.)
        * Otherwise no catch-up: H - P <= threshold, F = P >= H - threshold (one less, in case
          the rewrite's trigger is >= rather than >).
        """
        high = self.log_end(p)
        if p not in self.committed_seen:
            return 0
        ranges = (catchup or {}).get(str(p)) or []
        if any(end == high for _, end in ranges):
            return high
        return max(0, high - self.threshold - 1)

    def absorb(self, d: DriverProc, answer: dict[str, Any]) -> list[list[Any]]:
        """Take a driver's answer into the model: deliveries, rebalance events, assignment."""
        records = answer.get("records") or []
        for h, p, o, value in records:
            if not (0 <= p < self.partitions and 0 <= o < self.log_end(p)):
                raise Violation(f"{d.name} delivered p{p}@{o}, which was never produced")
            if self.produced[p][o] != value:
                raise Violation(
                    f"{d.name} delivered p{p}@{o} with value {value!r}; produced"
                    f" {self.produced[p][o]!r}"
                )
            d.handles[h] = (p, o)
            d.deliveries.setdefault(p, []).append((h, o))
            d.held[h] = None
        for kind, ps in answer.get("events") or []:
            self.log(f"{d.name}: on_{kind}({ps})")
            if kind == "assign":
                for p in ps:
                    d.lower[p] = self._lower_bound_of_start(p, answer.get("catchup"))
                    d.paused.discard(p)
                    self.log(
                        f"{d.name}: p{p} assigned, L={d.lower[p]} catchup={answer.get('catchup')}"
                    )
            else:
                for p in ps:
                    d.paused.discard(p)
        if answer.get("assignment") is not None:
            d.assigned = answer["assignment"]
        for e in answer.get("errors") or []:
            self.log(f"{d.name}: error event {e}")
        return records

    def describe(self, records: list[list[Any]]) -> str:
        by_p: dict[int, list[int]] = {}
        for _h, p, o, _v in records:
            by_p.setdefault(p, []).append(o)
        parts = []
        for p, offs in sorted(by_p.items()):
            runs = []
            start = prev = offs[0]
            for o in [*offs[1:], None]:
                if o is not None and o == prev + 1:
                    prev = o
                    continue
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                if o is not None:
                    start = prev = o
            parts.append(f"p{p}:[{','.join(runs)}]")
        return " ".join(parts) or "nothing"

    # -------------------------------------------------------------- truthful claims
    def eligible_messages(self, d: DriverProc) -> list[int]:
        """Handles m such that m and everything d delivered before m on that partition are
        processed or dismissed (so commit(message=m) claims only processed records)."""
        out = []
        for p, seq in d.deliveries.items():
            for h, o in seq:
                if not self.ok(p, o):
                    break
                out.append(h)
        return sorted(out)

    def offset_candidates(self, d: DriverProc, p: int) -> list[int]:
        """Offsets n that commit(offsets=[n]) may claim: [L, n) processed or dismissed."""
        if p not in d.lower:
            return []
        low = d.lower[p]
        high = low
        while high < self.log_end(p) and self.ok(p, high):
            high += 1
        if not OFFSETS_BELOW_START_CLAIM_NOTHING:
            for _h, o in d.deliveries.get(p, []):
                if not self.ok(p, o):
                    high = min(high, o)
        cands = {0, low, high, self.stored.get(p, 0), self.log_end(p)}
        for _h, o in d.deliveries.get(p, []):
            cands.update((o, o + 1))
        # n just after a record this process was handed: the child's, maybe, and then it
        # claims what commit(message=) of that record would (docs/design.md), from the child's
        # run start, which may lie below L (a catch-up over before the test saw it): allowed
        # only if that record's first delivery is in the processed prefix (eligible_messages)
        seq = d.deliveries.get(p, [])
        prefix = next((i for i, (_h, o) in enumerate(seq) if not self.ok(p, o)), len(seq))
        first: dict[int, int] = {}
        for i, (_h, o) in enumerate(seq):
            first.setdefault(o, i)
        return sorted(n for n in cands if 0 <= n <= high and first.get(n - 1, -1) < prefix)

    def follows_a_delivery(self, d: DriverProc, p: int, n: int) -> bool:
        """commit(offsets=[n]) just after a record ``d`` was handed: the child's, maybe, and
        then a commit of that record, no rewind (docs/design.md)."""
        return any(o == n - 1 for _h, o in d.deliveries.get(p, []))

    def bare_commit_allowed(self, d: DriverProc) -> bool:
        """With auto store: everything handed out is processed. With store_offsets(): always
        (it commits what was stored), see BARE_COMMIT_IN_STORE_MODE_CLAIMS_STORED."""
        if not d.handles:
            return False
        if self.store_mode and BARE_COMMIT_IN_STORE_MODE_CLAIMS_STORED:
            return True
        return all(self.ok(p, o) for p, o in d.handles.values())

    def live(self) -> list[str]:
        return sorted(n for n, d in self.drivers.items() if d.alive)

    # ------------------------------------------------------------------------ setup
    @initialize(
        partitions=st.integers(1, 2),
        threshold=st.sampled_from([5, 10, 20]),
        store_mode=st.booleans(),
        # partition 0 always has an offset (so a backlog above the threshold is caught up at
        # once); partition 1 may have none (auto.offset.reset applies)
        committed=st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 40))),
        backlog=st.lists(st.integers(0, 60), min_size=2, max_size=2),
    )
    @_recorded
    def setup(
        self,
        partitions: int,
        threshold: int,
        store_mode: bool,
        committed: tuple[int, int | None],
        backlog: list[int],
    ) -> None:
        """A topic whose partitions hold ``committed[p] + backlog[p]`` records, of which a
        previous incarnation processed and committed the first ``committed[p]`` (None: the
        group never committed the partition); then the main consumer starts: assign() of
        every partition, or subscribe()."""
        self.partitions, self.threshold, self.store_mode = partitions, threshold, store_mode
        self.topic = f"model-{uuid4().hex[:10]}"
        self.group = f"g-model-{uuid4().hex[:10]}"
        self.cluster.create_topic(self.topic, partitions)
        self.produced = {p: [] for p in range(partitions)}
        self.done = {p: set() for p in range(partitions)}
        self.started = True
        self.log(
            f"setup: {partitions} partition(s), threshold {threshold},"
            f" {'store_offsets mode' if store_mode else 'auto offset store'},"
            f" {'subscribe' if self.SUBSCRIBE else 'assign'} scenario, group {self.group}"
        )
        seeds = []
        for p in range(partitions):
            self._produce(p, (committed[p] or 0) + backlog[p])
            if committed[p] is not None:
                self.done[p].update(range(committed[p]))
                seeds.append(TopicPartition(self.topic, p, committed[p]))
        if seeds:
            assert self.admin is not None
            (f,) = self.admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group, seeds)]
            ).values()
            f.result(timeout=20)
            self.log(
                f"setup: previous incarnation committed {[(t.partition, t.offset) for t in seeds]}"
            )
        self.check_group()  # learns which partitions have an offset
        main = self.spawn("main")
        if self.SUBSCRIBE:
            self.absorb(main, main.call("subscribe"))
            self.settle(15.0)
        else:
            self._assign(main, list(range(partitions)), "assign")

    def _produce(self, p: int, count: int) -> None:
        if count <= 0:
            return
        assert self.producer is not None
        got: list[tuple[int, str]] = []
        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                got.append((msg.offset(), msg.value().decode()))

        for _ in range(count):
            self.producer.produce(
                self.topic, value=str(self.seq).encode(), partition=p, on_delivery=on_delivery
            )
            self.seq += 1
        assert self.producer.flush(30) == 0, "produce did not complete"
        assert not errors, errors
        got.sort()
        start = self.log_end(p)
        assert [o for o, _ in got] == list(range(start, start + count)), got
        self.produced[p].extend(v for _, v in got)
        self.log(f"produce p{p}: {count} records, offsets [{start}, {start + count})")
        # Let the consumers' fetchers see them before the next step, as they would with any
        # real gap between producing and polling (and so that replays see the same batches).
        time.sleep(FETCH_SETTLE_S)

    def settle(self, seconds: float) -> None:
        """Poll every live member until the group covers every partition (or time is up)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in self.live():
                d = self.drivers[name]
                recs = self.absorb(d, d.call("consume", max=200, batch=100, idle=0.1, cap=0.3))
                if recs:
                    self.log(f"{d.name}: (settling) consumed {self.describe(recs)}")
            covered = set()
            members = [self.drivers[n] for n in self.live()]
            for d in members:
                covered.update(d.assigned)
            if len(covered) == self.partitions and (
                self.partitions == 1 or all(d.assigned for d in members)
            ):
                break
        else:
            self.log("settle: group not settled in time (going on)")
        # Then drain until idle, so that what the settling delivered does not depend on how
        # fast the group formed (a replay must see the same state).
        for name in self.live():
            d = self.drivers[name]
            recs = self.absorb(d, d.call("consume", max=1000, batch=100, idle=IDLE_S, cap=CAP_S))
            if recs:
                self.log(f"{d.name}: (settled) consumed {self.describe(recs)}")

    def _assign(self, d: DriverProc, ps: list[int], how: str) -> None:
        answer = d.call(how, partitions=ps)
        self.absorb(d, answer)
        if not answer.get("ok"):
            self.log(f"{d.name}: {how}({ps}) failed: {answer.get('error')}")
            return
        if how == "assign":
            d.paused.clear()
        for p in ps:
            d.lower[p] = self._lower_bound_of_start(p, answer.get("catchup"))
            d.paused.discard(p)
        self.log(
            f"{d.name}: {how}({ps}) -> assignment {d.assigned}, catchup {answer.get('catchup')},"
            f" L={ {p: d.lower[p] for p in ps} }"
        )

    # ------------------------------------------------------------------------ steps
    # One rule, ``step``, picks a weighted action among those that apply now. Separate
    # Hypothesis rules would be feature-flagged ("swarm testing" turns about half of them off
    # per example, which with a handful of examples against a real cluster wastes most of them
    # on a consumer that, say, never commits). Every step draws the same shape of arguments,
    # whatever the state: what the real system answered decides what they mean (an index into
    # today's eligible handles, candidate offsets, ...), never what Hypothesis draws next, so a
    # replay that sees slightly different answers from the cluster is not a "flaky strategy".
    def applicable(self, action: str) -> bool:
        main = self.drivers["main"]
        live = [self.drivers[n] for n in self.live()]
        checks: dict[str, Callable[[], bool]] = {
            "assign": lambda: not self.SUBSCRIBE,
            "unassign": lambda: not self.SUBSCRIBE,
            "incremental_assign": lambda: (
                not self.SUBSCRIBE and len(main.assigned) < self.partitions
            ),
            "produce": lambda: True,
            "consume": lambda: True,
            "process": lambda: any(d.held for d in live),
            "commit_message": lambda: any(self.eligible_messages(d) for d in live),
            "commit_offsets": lambda: any(d.lower for d in live),
            "commit_bare": lambda: any(self.bare_commit_allowed(d) for d in live),
            "incremental_unassign": lambda: not self.SUBSCRIBE and bool(main.assigned),
            "pause": lambda: bool(main.assigned),
            "resume": lambda: bool(main.paused),
            "seek": lambda: bool(main.assigned),
            # A crash of a consumer that did nothing is a mere restart; in the subscribe
            # scenario each costs the session timeout plus a rejoin (~3 s): a few only.
            "crash_restart": lambda: (
                bool(main.handles) and (not self.SUBSCRIBE or self.incarnations <= 3)
            ),
            "member2_join": lambda: self.SUBSCRIBE and "m2" not in self.live(),
            "member2_leave": lambda: self.SUBSCRIBE and "m2" in self.live(),
        }
        return checks[action]()

    @rule(
        action=st.sampled_from(ACTIONS),
        alt=st.integers(0, 1 << 10),
        who=st.integers(0, 3),
        x=st.integers(0, 1 << 16),
        y=st.integers(0, 1 << 16),
        flags=st.integers(0, 7),
        subset=st.lists(st.integers(0, 1 << 16), max_size=6),
    )
    @_recorded
    def step(
        self, action: str, alt: int, who: int, x: int, y: int, flags: int, subset: list[int]
    ) -> None:
        """Do ``action`` or, when it does not apply now, the one ``alt`` picks among those that
        do (weighted). ``who`` picks the member; ``x``, ``y`` and ``subset`` index today's
        choices (handles, candidate offsets, partitions); ``flags`` bit 0: store_offsets()
        rather than commit() (store mode), bit 1: asynchronous, bit 2: crash rather than
        close(). The trace (the lines Hypothesis prints between the steps) says what was done.
        """
        if action == "noop":
            return
        self.step_no += 1
        name = action
        if name in DISABLED or not self.applicable(name):
            names = [n for n in ACTIONS if n != "noop" and n not in DISABLED]
            ok = {n for n in set(names) if self.applicable(n)}
            choices = [n for n in names if n in ok]
            if not choices:
                self.log("no action applies")
                return
            name = choices[alt % len(choices)]
        getattr(self, "do_" + name)(Args(who, x, y, flags, subset))
        self.check_group()  # S1 after every step

    def pick(self, a: Args, names: list[str] | None = None) -> DriverProc:
        names = names if names is not None else self.live()
        return self.drivers[names[a.who % len(names)]]

    def do_produce(self, a: Args) -> None:
        self._produce(a.x % self.partitions, (1, 3, 8, 25, 60)[a.y % 5])

    def do_consume(self, a: Args) -> None:
        """poll()/consume() until ``most`` records or idle for IDLE_S: the records are held."""
        d = self.pick(a)
        most = (1, 4, 20, 200)[a.x % 4]
        batch = (0, 1, 10, 100)[a.y % 4]
        answer = d.call("consume", max=most, batch=batch, idle=IDLE_S, cap=CAP_S)
        recs = self.absorb(d, answer)
        call = "poll()" if batch == 0 else f"consume({batch})"
        self.log(f"{d.name}: {call} until {most} records or idle -> {self.describe(recs)}")

    def do_process(self, a: Args) -> None:
        """The application processes records it holds (out of order unless 'oldest')."""
        d = self.pick(a, [n for n in self.live() if self.drivers[n].held])
        held = list(d.held)
        how = ("oldest", "all", "newest", "some", "oldest")[a.x % 5]
        k = 1 + a.y % len(held)
        if how == "all":
            chosen = held
        elif how == "oldest":
            chosen = held[:k]
        elif how == "newest":
            chosen = held[-k:]
        else:
            chosen = sorted({held[i % len(held)] for i in a.subset} or {held[a.y % len(held)]})
        for h in chosen:
            p, o = d.handles[h]
            self.done[p].add(o)
            del d.held[h]
        recs = [[h, *d.handles[h], None] for h in sorted(chosen)]
        self.log(f"{d.name}: process {how} -> {self.describe(recs)}")

    def do_commit_message(self, a: Args) -> None:
        """commit(message=m) (or store_offsets(message=m) in store mode) for a truthful m."""
        d = self.pick(a, [n for n in self.live() if self.eligible_messages(self.drivers[n])])
        eligible = self.eligible_messages(d)
        h = eligible[a.x % len(eligible)]
        p, o = d.handles[h]
        if self.store_mode and a.store:
            answer = d.call("store", handle=h)
            what = f"store_offsets(message=h{h} p{p}@{o})"
        else:
            answer = d.call("commit", handle=h, **{"async": a.asynchronous})
            what = f"commit(message=h{h} p{p}@{o}, async={a.asynchronous})"
        self.absorb(d, answer)
        self.log(f"{d.name}: {what} -> {self._result(answer)}")

    def do_commit_offsets(self, a: Args) -> None:
        """commit(offsets=[n]) / store_offsets(offsets=[n]) with [L, n) processed: rewinds,
        the primary's start, offsets of records from earlier assignments, fresh positions."""
        d = self.pick(a, [n for n in self.live() if self.drivers[n].lower])
        parts = sorted(d.lower)
        p = parts[a.y % len(parts)]
        cands = self.offset_candidates(d, p)
        n = cands[a.x % len(cands)]
        if self.store_mode and a.store:
            answer = d.call("store", offsets=[[p, n]])
            self.absorb(d, answer)
            self.log(
                f"{d.name}: store_offsets(offsets=[p{p}@{n}]) (L={d.lower[p]})"
                f" -> {self._result(answer)}"
            )
            return
        answer = d.call("commit", offsets=[[p, n]], **{"async": a.asynchronous})
        self.absorb(d, answer)
        self.log(
            f"{d.name}: commit(offsets=[p{p}@{n}], async={a.asynchronous}) (L={d.lower[p]},"
            f" stored before {self.stored.get(p)}) -> {self._result(answer)}"
        )
        if (
            "rewind_check" not in DISABLED
            and not self.SUBSCRIBE
            and not a.asynchronous
            and not self.follows_a_delivery(d, p, n)
            and answer.get("ok")
            and all(err is None for _, _, err in answer.get("result") or [])
        ):
            stored = self.read_group().get(p, -1001)
            if stored > n:
                raise Violation(
                    f"(R) after a synchronous commit(offsets=[p{p}@{n}]) returned, the group"
                    f" stores {stored} > {n}: an offsets commit must leave the stored offset at"
                    " or below n (a rewind when n < F)"
                )

    def do_commit_bare(self, a: Args) -> None:
        d = self.pick(a, [n for n in self.live() if self.bare_commit_allowed(self.drivers[n])])
        answer = d.call("commit", **{"async": a.asynchronous})
        self.absorb(d, answer)
        self.log(f"{d.name}: commit(async={a.asynchronous}) -> {self._result(answer)}")

    def _result(self, answer: dict[str, Any]) -> str:
        if not answer.get("ok"):
            return f"error: {answer.get('error')}"
        if answer.get("result") is not None:
            return f"ok {answer['result']}"
        return "ok"

    def _parts(self, a: Args, among: list[int]) -> list[int]:
        among = sorted(among)
        return sorted({among[i % len(among)] for i in a.subset} or {among[a.x % len(among)]})

    # --- assignment (assign scenario)
    def do_assign(self, a: Args) -> None:
        self._assign(self.drivers["main"], self._parts(a, list(range(self.partitions))), "assign")

    def do_incremental_assign(self, a: Args) -> None:
        d = self.drivers["main"]
        free = [p for p in range(self.partitions) if p not in d.assigned]
        self._assign(d, self._parts(a, free), "incremental_assign")

    def do_unassign(self, a: Args) -> None:
        d = self.drivers["main"]
        answer = d.call("unassign")
        self.absorb(d, answer)
        d.paused.clear()
        self.log(f"{d.name}: unassign() -> {self._result(answer)}")

    def do_incremental_unassign(self, a: Args) -> None:
        d = self.drivers["main"]
        ps = self._parts(a, d.assigned)
        answer = d.call("incremental_unassign", partitions=ps)
        self.absorb(d, answer)
        d.paused.difference_update(ps)
        self.log(f"{d.name}: incremental_unassign({ps}) -> {self._result(answer)}")

    # --- pause / resume / seek (main member)
    def do_pause(self, a: Args) -> None:
        d = self.drivers["main"]
        ps = self._parts(a, d.assigned)
        answer = d.call("pause", partitions=ps)
        self.absorb(d, answer)
        if answer.get("ok"):
            d.paused.update(ps)
        self.log(f"{d.name}: pause({ps}) -> {self._result(answer)}")

    def do_resume(self, a: Args) -> None:
        d = self.drivers["main"]
        ps = self._parts(a, list(d.paused))
        answer = d.call("resume", partitions=ps)
        self.absorb(d, answer)
        if answer.get("ok"):
            d.paused.difference_update(ps)
        self.log(f"{d.name}: resume({ps}) -> {self._result(answer)}")

    def do_seek(self, a: Args) -> None:
        """seek(tp, s): forward from the primary's position() p dismisses [p, s); backward
        nothing. With position() unknown (nothing read yet in this assignment) the primary
        stands at its start F >= L: [L, s) is dismissed (more than needed: the oracle only
        gets weaker, never wrong)."""
        d = self.drivers["main"]
        p = d.assigned[a.y % len(d.assigned)]
        target = a.x % (self.log_end(p) + 1)
        answer = d.call("seek", partition=p, offset=target, force=True)
        self.absorb(d, answer)
        before = answer.get("before")
        if answer.get("ok"):
            start = before if before is not None and before >= 0 else d.lower.get(p, 0)
            if target > start:
                self.done[p].update(range(start, target))
                self.log(
                    f"{d.name}: seek(p{p}@{target}) from {before}: dismisses [{start}, {target})"
                )
                return
        self.log(f"{d.name}: seek(p{p}@{target}) from {before} -> {self._result(answer)}")

    # --- crashes and members
    def do_crash_restart(self, a: Args) -> None:
        """SIGKILL the main consumer (its held records are never processed) and start anew."""
        old = self.drivers["main"]
        previous = list(old.assigned)
        old.kill()
        self.log(f"{old.name}: SIGKILL (held, unprocessed: {len(old.held)})")
        main = self.spawn("main")
        if self.SUBSCRIBE:
            self.absorb(main, main.call("subscribe"))
            self.settle(15.0)
        else:
            self._assign(main, previous or list(range(self.partitions)), "assign")

    def do_member2_join(self, a: Args) -> None:
        m2 = self.spawn("m2")
        self.absorb(m2, m2.call("subscribe"))
        self.settle(10.0)

    def do_member2_leave(self, a: Args) -> None:
        m2 = self.drivers.pop("m2")
        if a.crash:
            m2.kill()
        else:
            m2.close()
        how = "SIGKILL" if a.crash else "close()"
        self.log(f"{m2.name}: {how} (held, unprocessed: {len(m2.held)})")
        self.settle(10.0)

    # ------------------------------------------------------------------- invariant
    def check_group(self) -> None:
        stored = self.read_group()
        for p, c in sorted(stored.items()):
            if c < 0:
                continue
            self.committed_seen.add(p)
            high = self.log_end(p)
            bad = [o for o in range(min(c, high)) if not self.ok(p, o)]
            if bad or c > high:
                raise Violation(
                    f"(S1) the group stores offset {c} for p{p} (log end {high}), passing"
                    f" {len(bad)} unprocessed record(s): {bad[:20]}"
                )
        if stored != self.stored:
            self.log(f"group offsets now {stored}")
        self.stored = stored

    # -------------------------------------------------------------------- teardown
    def teardown(self) -> None:
        try:
            if self.started and self.violation is None:
                self.final_check()
        finally:
            for d in self.drivers.values():
                if d.alive:
                    d.kill()
            self.drivers.clear()
        if self.violation is not None:
            raise Violation(self.violation)

    @_recorded
    def final_check(self) -> None:
        """S2: after a crash of everything, a fresh consumer delivers every unprocessed record."""
        for d in self.drivers.values():
            if d.alive:
                d.kill()
                self.log(f"{d.name}: SIGKILL (final)")
        self.check_group()
        wanted = {
            (p, o)
            for p in range(self.partitions)
            for o in range(self.log_end(p))
            if not self.ok(p, o)
        }
        seen: set[tuple[int, int]] = set()
        conf = self.conf()
        for key in ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key, None)
        c = Consumer(conf)
        try:
            c.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
            deadline = time.monotonic() + _FINAL_DRAIN_S
            while not wanted <= seen and time.monotonic() < deadline:
                for m in c.consume(500, 0.2):
                    if m.error() is None:
                        seen.add((m.partition(), m.offset()))
        finally:
            c.close()
        missing = sorted(wanted - seen)
        self.log(f"final: {len(wanted)} unprocessed record(s), {len(missing)} not redelivered")
        if missing:
            raise Violation(
                f"(S2) after the final restart {len(missing)} unprocessed record(s) were not"
                f" delivered within {_FINAL_DRAIN_S:g}s: {missing[:30]}"
            )
        self.check_group()


class AssignMachine(ModelMachine):
    SUBSCRIBE = False


class GroupMachine(ModelMachine):
    SUBSCRIBE = True


def _run(machine: type[ModelMachine], cluster: Any, examples: int, steps: int) -> None:
    machine.cluster = cluster
    machine.admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    machine.producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "enable.idempotence": True, "linger.ms": 1}
    )
    SURVEYED.clear()
    # Hypothesis has no setting for its shrinking time limit: a module constant it reads when
    # shrinking starts (left alone if a future Hypothesis drops it).
    saved = getattr(_engine, "MAX_SHRINKING_SECONDS", None)
    if saved is not None:
        _engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS
    try:
        run_state_machine_as_test(machine, settings=_settings(examples, steps))
        if SURVEYED:
            print(f"\n{len(SURVEYED)} violation(s) seen in survey mode:")
            for text in SURVEYED:
                print(f"\n{text}")
    finally:
        if saved is not None:
            _engine.MAX_SHRINKING_SECONDS = saved
        machine.producer.flush(10)
        machine.admin = machine.producer = None


def test_model_assign(kafka_cluster: Any) -> None:
    """assign()-only consumer: produce, consume, process, every kind of commit, (un)assign,
    pause/resume, seek, crash-restart; S1 after every step, S2 at the end."""
    _run(AssignMachine, kafka_cluster, ASSIGN_EXAMPLES, ASSIGN_STEPS)


def test_model_group(kafka_cluster: Any) -> None:
    """subscribe() with a second member joining/leaving/crashing and main crash-restarts."""
    _run(GroupMachine, kafka_cluster, GROUP_EXAMPLES, GROUP_STEPS)
