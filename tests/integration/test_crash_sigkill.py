"""SIGKILL chaos: worker processes die at random moments; no produced record may be lost.

Workers (``fastrebalance.testing._crashworker``) log every record they are handed, fsync the
log, and only then commit. While a producer writes uniquely numbered records, the test
SIGKILLs random workers at random moments (soon after a start, right after a commit, while a
catch-up is running) and restarts them. At the end:

* at-least-once: every produced value is in the union of the worker logs;
* no committed offset ever ran ahead of processing: the group's committed offsets are sampled
  every ~0.5 s (with the sizes of the logs right after), and every offset a sample declares
  processed must be in a log *as it was at that moment*. Checked for the bare offset (what any
  tool sees) and for the full claim the range token plus the child checkpoint make (what the
  next owner restores).

The seed is printed; ``FASTREBALANCE_CRASH_SEED`` replays one, ``FASTREBALANCE_CRASH_SECONDS``
changes the chaos duration of the main variant.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from fastrebalance._state import restore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
PRODUCE_RATE = 2000  # records/s
WORK_US = 250  # simulated work per record (4k records/s per worker): widens catch-up windows
THRESHOLD = 20
SAMPLE_INTERVAL_S = 0.5
DRAIN_TIMEOUT_S = 90.0


def _seed() -> int:
    env = os.environ.get("FASTREBALANCE_CRASH_SEED")
    return int(env) if env else random.SystemRandom().randrange(1 << 32)


# --------------------------------------------------------------------------- producer
class SteadyProducer:
    """Writes value=str(i), i = 0, 1, ..., round-robin over the partitions at a steady rate."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        self.topic = topic
        self.rate = rate
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self.sent = 0
        self.delivered: dict[int, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

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
            while self.sent < due:
                i = self.sent
                try:
                    self.producer.produce(
                        self.topic,
                        value=str(i).encode(),
                        partition=i % PARTITIONS,
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

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        remaining = self.producer.flush(30)
        assert remaining == 0, f"{remaining} records still undelivered after 30 s"


# ---------------------------------------------------------------------------- workers
@dataclass
class WorkerRun:
    """One process (incarnation) of a worker slot."""

    slot: int
    incarnation: int
    log: Path
    stderr: Path
    proc: subprocess.Popen[str]
    started: float = field(default_factory=time.monotonic)
    last_commit: float | None = None
    commits: int = 0
    catchup_since: float | None = None
    catchups: int = 0
    assigned: set[int] = field(default_factory=set)
    killed: bool = False

    @property
    def name(self) -> str:
        return f"w{self.slot}.{self.incarnation}"


class Fleet:
    """The worker processes: start, read their events, SIGKILL, restart, SIGTERM."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, protocol: str, workdir: Path, slots: int
    ) -> None:
        self.bootstrap, self.topic, self.group, self.protocol = bootstrap, topic, group, protocol
        self.workdir = workdir
        self.runs: list[WorkerRun] = []  # every incarnation, in start order
        self.paths: list[Path] = []  # every log, listed before its worker starts
        self.current: dict[int, WorkerRun] = {}
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.kills: list[str] = []
        self.kill_reasons: Counter[str] = Counter()
        self.deaths: list[str] = []  # workers that exited without being told to
        for slot in range(slots):
            self.start(slot)

    def log_paths(self) -> list[Path]:
        with self.lock:
            return list(self.paths)

    def start(self, slot: int) -> WorkerRun:
        incarnation = sum(1 for r in self.runs if r.slot == slot)
        log = self.workdir / f"w{slot}.{incarnation}.log"
        err = self.workdir / f"w{slot}.{incarnation}.stderr"
        with self.lock:
            self.paths.append(log)  # before any sample could miss a line of it
        args = [
            sys.executable, "-m", "fastrebalance.testing._crashworker",
            "--bootstrap", self.bootstrap, "--topic", self.topic, "--group", self.group,
            "--log", str(log), "--threshold", str(THRESHOLD), "--protocol", self.protocol,
            "--work-us", str(WORK_US),
        ]  # fmt: skip
        with open(err, "w") as err_file:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err_file, text=True)
        run = WorkerRun(slot, incarnation, log, err, proc)
        with self.lock:
            self.runs.append(run)
            self.current[slot] = run
        threading.Thread(target=self._read, args=(run,), daemon=True).start()
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
        now = time.monotonic()
        with self.cond:
            kind = event.get("ev")
            if kind == "commit":
                run.last_commit, run.commits = now, run.commits + 1
            elif kind == "catchup":
                if event["active"]:
                    run.catchup_since, run.catchups = now, run.catchups + 1
                else:
                    run.catchup_since = None
            elif kind == "assigned":
                run.assigned |= set(event["partitions"])
            elif kind in ("revoked", "lost"):
                run.assigned -= set(event["partitions"])
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], Any], timeout: float) -> Any:
        """Wait (under the lock) until predicate() is truthy; returns its last value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = predicate()
                remaining = deadline - time.monotonic()
                if got or remaining <= 0:
                    return got
                self.cond.wait(min(remaining, 0.05))

    def kill(self, run: WorkerRun, why: str) -> None:
        age = time.monotonic() - run.started
        with self.lock:
            committed_ago = (
                f"{time.monotonic() - run.last_commit:.2f}s" if run.last_commit else "never"
            )
            note = (
                f"SIGKILL {run.name} ({why}; age {age:.1f}s, {run.commits} commits, last "
                f"{committed_ago} ago, catch-up {'ACTIVE' if run.catchup_since else 'idle'}, "
                f"partitions {sorted(run.assigned)})"
            )
        self._check_alive(run)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait()
        run.killed = True
        self.kills.append(note)
        self.kill_reasons[why] += 1
        print(f"[{time.strftime('%H:%M:%S')}] {note}", flush=True)

    def _check_alive(self, run: WorkerRun) -> None:
        code = run.proc.poll()
        if code is not None:
            tail = run.stderr.read_text()[-2000:]
            self.deaths.append(f"{run.name} exited by itself with code {code}: {tail}")

    def terminate_all(self, timeout: float = 20.0) -> None:
        for r in self.current.values():
            self._check_alive(r)
        live = [r for r in self.current.values() if r.proc.poll() is None]
        for r in live:
            r.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for r in live:
            try:
                r.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                print(f"{r.name} ignored SIGTERM for {timeout:g}s: SIGKILL", flush=True)
                r.proc.kill()
                r.proc.wait()
                continue
            if r.proc.returncode != 0:
                tail = r.stderr.read_text()[-2000:]
                self.deaths.append(f"{r.name} exited with {r.proc.returncode} on SIGTERM: {tail}")

    def kill_everything(self) -> None:
        for r in self.runs:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def chaos(fleet: Fleet, rng: random.Random, duration: float, min_kills: int) -> None:
    """SIGKILL + restart random workers at random moments for ``duration`` seconds."""
    slots = sorted(fleet.current)
    end = time.monotonic() + duration
    hard_end = end + 20.0  # room to reach min_kills
    while True:
        now = time.monotonic()
        if now >= hard_end or (now >= end and len(fleet.kills) >= min_kills):
            return
        time.sleep(rng.uniform(1.5, 5.0))
        mode = rng.choice(["random", "after_commit", "catchup", "young"])
        slot = rng.choice(slots)
        if mode == "after_commit":
            run = fleet.current[slot]
            seen = run.commits
            # the instant a commit returned: right after a commit burst
            got = fleet.wait_for(lambda run=run, seen=seen: run.commits > seen, rng.uniform(1, 5))
            fleet.kill(run, "right after a commit" if got else "no commit seen")
        elif mode == "catchup":
            # a worker whose child is reading a skipped range
            def reading() -> WorkerRun | None:
                return next((r for r in fleet.current.values() if r.catchup_since), None)

            run = fleet.wait_for(reading, rng.uniform(4.0, 12.0)) or fleet.current[slot]
            time.sleep(rng.uniform(0.0, 0.3))
            fleet.kill(run, "during catch-up" if run.catchup_since else "no catch-up seen")
        elif mode == "young":
            # restart now, kill again soon: while it joins, plans, or its child starts
            fleet.kill(fleet.current[slot], "to restart it young")
            fleet.start(slot)
            time.sleep(rng.uniform(0.2, 4.0))
            fleet.kill(fleet.current[slot], "young")
        else:
            fleet.kill(fleet.current[slot], "random moment")
        slot = next(s for s, r in fleet.current.items() if r.killed)
        time.sleep(rng.uniform(0.0, 1.0))
        fleet.start(slot)


# --------------------------------------------------------------------------- sampling
@dataclass
class Sample:
    t: float
    group: dict[int, tuple[int, str | None]]  # partition -> (offset, metadata)
    child: dict[int, tuple[int, str | None]]
    sizes: dict[Path, int]  # log sizes read AFTER the offsets


class OffsetSampler:
    """Samples the group's committed offsets (and the child's log), then the log sizes.

    The consumers here never subscribe and never commit: ``committed()`` only.
    """

    def __init__(self, bootstrap: str, topic: str, group: str, fleet: Fleet) -> None:
        base = {"bootstrap.servers": bootstrap, "enable.auto.commit": False}
        self.group = Consumer({**base, "group.id": group})
        self.child = Consumer({**base, "group.id": group + ".catchup"})
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.fleet = fleet
        self.samples: list[Sample] = []
        self.errors = 0
        self._lock = threading.Lock()  # the sampler thread and the test share the consumers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def read_group(self) -> dict[int, tuple[int, str | None]]:
        with self._lock:
            got = self.group.committed(self.tps, 10)
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
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            try:
                self.sample()
            except KafkaException:
                self.errors += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        self.group.close()
        self.child.close()


# ----------------------------------------------------------------------------- checks
@dataclass
class LogRecord:
    partition: int
    offset: int
    value: int
    log: Path
    end: int  # byte position just after its line


def read_logs(paths: list[Path]) -> list[LogRecord]:
    out = []
    for path in paths:
        if not path.exists():
            continue
        pos = 0
        with open(path, "rb") as f:
            for line in f:
                pos += len(line)
                if not line.endswith(b"\n"):
                    continue  # torn by SIGKILL; a later line would start in a new file
                p, o, v = line.split()
                out.append(LogRecord(int(p), int(o), int(v), path, pos))
    return out


def availability(
    records: list[LogRecord], samples: list[Sample], produced: dict[int, int]
) -> dict[int, list[int]]:
    """Per partition and produced offset: the index of the first sample that saw it in a
    log (``len(samples)`` when none did)."""
    never = len(samples)
    sizes: dict[Path, list[int]] = {}
    for path in {r.log for r in records}:
        sizes[path] = [s.sizes.get(path, 0) for s in samples]
    avail = {p: [never] * produced.get(p, 0) for p in range(PARTITIONS)}
    for r in records:
        idx = bisect.bisect_left(sizes[r.log], r.end)  # sizes only grow
        row = avail[r.partition]
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
    samples: list[Sample], records: list[LogRecord], produced: dict[int, int]
) -> list[str]:
    """Every offset a sample declared processed must be in a log at that sample."""
    avail = availability(records, samples, produced)
    problems = []
    for idx, sample in enumerate(samples):
        for p in range(PARTITIONS):
            row = avail[p]
            bare, claimed = claimed_intervals(sample, p)
            checks = [("committed offset", [(0, bare)] if bare > 0 else [])]
            checks.append(("token+checkpoint claim", claimed))
            for what, intervals in checks:
                for a, b in intervals:
                    if b > len(row):
                        problems.append(f"sample {idx} partition {p}: {what} {b} > log end")
                        b = len(row)
                    if a >= b or max(row[a:b]) <= idx:
                        continue
                    late = [o for o in range(a, b) if row[o] > idx]
                    if late:
                        problems.append(
                            f"sample {idx} (t={sample.t:.1f}) partition {p}: {what} covers "
                            f"[{a}, {b}) but {len(late)} offsets were not in any log yet, first "
                            f"{late[:10]} (group {sample.group.get(p)}, child "
                            f"{sample.child.get(p)})"
                        )
    return problems


# ------------------------------------------------------------------------------ test
VARIANTS = {
    # protocol -> (workers, chaos seconds, minimum kills)
    "cooperative": (3, float(os.environ.get("FASTREBALANCE_CRASH_SECONDS", 60)), 8),
    "consumer": (2, 25.0, 4),
}


@pytest.mark.parametrize("protocol", list(VARIANTS))
def test_sigkill_chaos_loses_nothing(
    kafka_cluster: Any,
    topic_factory: Callable[..., str],
    unique_group: str,
    tmp_path: Path,
    protocol: str,
) -> None:
    workdir = tmp_path
    seed = _seed()
    rng = random.Random(seed)
    workers, duration, min_kills = VARIANTS[protocol]
    print(
        f"\n[crash test] protocol={protocol} seed={seed} (replay: FASTREBALANCE_CRASH_SEED={seed})"
        f" workers={workers} chaos={duration:g}s logs in {workdir}",
        flush=True,
    )
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(PARTITIONS)
    t0 = time.monotonic()

    producer = SteadyProducer(bootstrap, topic, PRODUCE_RATE)
    fleet = Fleet(bootstrap, topic, unique_group, protocol, workdir, workers)
    sampler = OffsetSampler(bootstrap, topic, unique_group, fleet)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group + ".probe"})
    try:
        producer.start()
        sampler.start()
        chaos(fleet, rng, duration, min_kills)
        producer.stop()
        chaos_end = time.monotonic()
        print(
            f"[crash test] chaos over after {chaos_end - t0:.1f}s: {len(fleet.kills)} kills, "
            f"{producer.sent} records produced; draining",
            flush=True,
        )

        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(PARTITIONS)
        }
        assert all(low == 0 for low, _ in marks.values()), f"retention deleted records: {marks}"
        high = {p: h for p, (_, h) in marks.items()}

        def drained() -> bool:
            got = sampler.read_group()
            return all(got.get(p, (-1, None))[0] >= high[p] for p in range(PARTITIONS))

        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not (ok := drained()) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(
            f"[crash test] drain {'done' if ok else 'TIMED OUT'} after "
            f"{time.monotonic() - chaos_end:.1f}s; committed {sampler.read_group()}, "
            f"log ends {high}",
            flush=True,
        )
        fleet.terminate_all()
        sampler.stop()
        sampler.sample()  # a last one, with every worker stopped
    finally:
        fleet.kill_everything()
        sampler.stop()
        sampler.close()
        probe.close()

    # ---- at-least-once
    assert not producer.failed, f"{len(producer.failed)} records failed to produce"
    produced_values = set(producer.delivered)
    assert len(produced_values) == producer.sent
    per_partition: dict[int, int] = Counter(p for p, _ in producer.delivered.values())
    assert per_partition == {p: high[p] for p in range(PARTITIONS)}, "offsets not contiguous?"
    records = read_logs(fleet.log_paths())
    counts = Counter(r.value for r in records)
    wrong = [r for r in records if producer.delivered.get(r.value) != (r.partition, r.offset)]
    lost = sorted(produced_values - set(counts))
    duplicates = {v: n for v, n in counts.items() if n > 1}
    print(
        f"[crash test] seed={seed} protocol={protocol}: {producer.sent} produced, "
        f"{len(fleet.kills)} kills, {len(fleet.runs)} worker processes, "
        f"{len(records)} logged, {len(lost)} lost, {len(duplicates)} values duplicated "
        f"({sum(duplicates.values()) - len(duplicates)} extra copies), "
        f"{len(sampler.samples)} offset samples ({sampler.errors} failed), "
        f"runtime {time.monotonic() - t0:.1f}s",
        flush=True,
    )
    print(f"[crash test] kills by moment: {dict(fleet.kill_reasons)}", flush=True)
    if duplicates:
        by_partition = Counter(producer.delivered[v][0] for v in duplicates)
        print(
            f"[crash test] duplicates per partition {dict(sorted(by_partition.items()))}; "
            f"first {sorted(duplicates)[:20]}",
            flush=True,
        )
    assert not fleet.deaths, "\n".join(fleet.deaths)
    assert not wrong, f"log lines disagree with the producer: {wrong[:5]}"
    if lost:
        where = Counter(producer.delivered[v][0] for v in lost)
        pytest.fail(
            f"seed {seed}: {len(lost)} records lost (never returned by poll/consume); "
            f"per partition {dict(where)}; first {[(v, producer.delivered[v]) for v in lost[:20]]}"
        )
    assert ok, f"seed {seed}: committed offsets never reached the log end {high}"

    # ---- no commit ever ran ahead of processing
    tokens = sum(
        1
        for smp in sampler.samples
        for off, md in smp.group.values()
        if md and md.startswith("~fr")
    )
    checkpoints = sum(1 for smp in sampler.samples for off, _ in smp.child.values() if off >= 0)
    print(
        f"[crash test] samples: {tokens} partition samples carried a range token, "
        f"{checkpoints} a child checkpoint",
        flush=True,
    )
    problems = check_samples(sampler.samples, records, high)
    assert not problems, f"seed {seed}: " + "\n".join(problems[:20])
