"""The Spark crash harness: a streaming query on the fastrebalance source, its driver SIGKILLed.

``run_spark_chaos(SparkChaosSettings(...))`` runs, for each trigger (processingTime, once,
availableNow), on a topic of its own with live traffic (``_workload.FreshProducer``):

* a **driver process** (this module's ``driver`` command, in a session of its own: the Python
  driver, its JVM and the Python workers the JVM starts) running the query with a
  ``foreachBatch`` sink that writes, per batch id and attempt, exactly which (topic,
  partition, offset) it received: one file per call, written to a temporary name, fsynced
  and renamed, so a file exists only if the sink finished writing it;
* **kills**, one per driver life, drawn from a seeded deck (each round holds every point
  once): ``random`` (any moment, JVM start and planning included), ``offsets`` (just after
  a new ``offsets/N`` appears in the checkpoint: the batch is logged and running),
  ``commits`` (just after ``commits/N``: the next batch is being planned), and, from inside
  the driver because only it can see the moment, ``sink_read`` (while the sink's action
  reads Kafka on the executors), ``sink_write`` (the attempt file written, not renamed) and
  ``sink_done`` (the attempt is in the sink, the commit log does not know yet). A kill
  SIGKILLs every process of the driver's session;
* **restarts** on the same checkpoint after a random down time, with a burst of records on
  top of the live traffic half of the time, so that restarts find a backlog above
  ``catchup.threshold``. A once/availableNow run also ends by itself (a scheduled job);

then it stops the traffic, **drains** with driver lives that are not killed, and **checks**:

* every record in the topic (read with a plain confluent-kafka consumer) from where the
  query starts is in some attempt; records retention deleted before anyone read them are
  counted apart;
* a batch id seen in several attempts holds exactly the records of its first attempt, so a
  sink that overwrites per batch id ends up with each record once;
* no record is in two batch ids, no driver wrote one batch id twice, and a batch is
  replayed only after the life that wrote its earlier attempt was killed: duplicates that
  crashes explain (a non-idempotent sink's extra copies) are counted, any other fails;
* no driver life failed on its own (an exception in the query is reported with its log).

``event_time=True`` (``_sparkevtime``) makes the query a watermarked count per event-time
window over the live rows, with the backlog rows routed around it into the same sink; the
sink then holds windows and backlog rows, and the record check gives way to a window check:
every window Spark closed holds, live count plus backlog rows, every record of the topic
whose timestamp falls in it. Under processingTime the live traffic runs on into the drain
until its restart backlog is read, so that the drain, too, restarts behind the watermark.

Thread ownership: ``FreshProducer``'s handle belongs to its thread; the check's consumer,
and the admin client that reads log ends, to the thread that made them.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from fastrebalance.spark._plan import decode_offset
from fastrebalance.testing._chaos_check import read_topic
from fastrebalance.testing._sparkevtime import (
    WindowCheck,
    bucket,
    check_windows,
    merge_live,
    short_summary,
)
from fastrebalance.testing._sparkpython import local_driver_conf, worker_python
from fastrebalance.testing._workload import FreshProducer, partition_keys, produce_backlog

__all__ = [
    "KILL_POINTS",
    "TRIGGERS",
    "Attempt",
    "Life",
    "PhaseResult",
    "SparkChaosResult",
    "SparkChaosSettings",
    "check_attempts",
    "format_result",
    "kill_session",
    "read_sink",
    "run_spark_chaos",
    "session_members",
]

TRIGGERS = ("processingTime", "once", "availableNow")
#: Where a driver life may be killed; the last three by the driver itself.
KILL_POINTS = ("random", "offsets", "commits", "sink_read", "sink_write", "sink_done")
_SELF_POINTS = frozenset(KILL_POINTS[3:])
#: A driver here lives seconds: C1 alone and one GC thread save much of the CPU of its start,
#: which is most of a life on a loaded 2-core machine.
_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:cds*=off"
#: Spark waits a hard-coded 10 s (PythonWorkerFactory.createSimpleWorker) for the Python
#: process that runs the source on the driver to connect back; on a 2-core machine at load
#: 15-20 importing pyspark alone can take longer, and the query fails before the source
#: ran. Such a life is reported apart, not as a failure of the source.
_NO_START = "Python worker failed to connect back"
#: The live producer's batching: at 200 records/s over 4 partitions, about 10 records a set.
_LIVE_LINGER_MS = 200
#: Partition and offset in one int: a soak holds a million of them.
_SHIFT = 40


def _key(partition: int, offset: int) -> int:
    return (partition << _SHIFT) | offset


def _split(key: int) -> tuple[int, int]:
    return key >> _SHIFT, key & ((1 << _SHIFT) - 1)


# ------------------------------------------------------------------------- settings
@dataclass
class SparkChaosSettings:
    """One run. Times in seconds. ``duration_s`` is shared by the triggers."""

    duration_s: float = 120.0
    seed: int | None = None
    triggers: tuple[str, ...] = TRIGGERS
    points: tuple[str, ...] = KILL_POINTS
    #: the plans of the first lives, before the deck (a reproduction); a sink point dies in
    #: the sink's first call
    first_points: tuple[str, ...] = ()
    min_kills: int = 3  #: per trigger: keep going past its share of the duration until then
    partitions: int = 4
    rate: float = 200.0  #: live records per second, while the chaos lasts
    #: records piled up during a down time (half of them), and before the drain
    burst: tuple[int, int] = (3_000, 12_000)
    down_s: tuple[float, float] = (0.5, 4.0)
    starting_offsets: str = "earliest"
    processing_time: str = "500 milliseconds"
    options: dict[str, str] = field(
        default_factory=lambda: {
            "catchup.threshold": "500",
            "catchup.chunkSize": "2000",
            "catchup.maxOffsetsPerTrigger": "6000",
            "kafka.fetch.wait.max.ms": "10",
        }
    )
    master: str = "local[2]"
    #: the triggers' phases side by side (each has its own topic, driver and random stream)
    parallel: bool = False
    #: a life whose kill never came is killed from outside then (a safety net: a life on a
    #: 2-core machine shared with other Spark jobs took up to 170 s)
    life_cap_s: float = 300.0
    #: a processingTime drain with no new sink file this long ends; a once/availableNow
    #: drain run is killed after twice this
    drain_timeout_s: float = 300.0
    bootstrap_servers: str | None = None  #: None: start an embedded cluster
    workdir: Path | None = None
    #: the query counts live rows per event-time window under a watermark, backlog rows
    #: routed around it; the check counts windows, not records (``_sparkevtime``)
    event_time: bool = False
    window_ms: int = 2_000
    #: the watermark delay: above the live stream's disorder (producer to log, partitions
    #: planned one after another), far below a restart's gap (a JVM start, the down time)
    watermark_delay_ms: int = 2_000


# ------------------------------------------------------------------------ the sink
@dataclass(frozen=True)
class Attempt:
    """One call of the sink: a batch id, the driver life and its call number."""

    batch: int
    life: int
    call: int
    keys: frozenset[int]
    backlog: int  #: rows with ``catchup = true``
    #: event time: the windows the watermarked count emitted, (start ms, count)
    windows: tuple[tuple[int, int], ...] = ()
    #: event time: each row's timestamp (ms) by key (the rows are the backlog's)
    stamps: Mapping[int, int] = field(default_factory=dict, compare=False)


def _attempt_name(batch: int, life: int, call: int) -> str:
    return f"b{batch:08d}-l{life:04d}-c{call:04d}.txt"


def read_sink(folder: Path, topic: str, known: dict[str, Attempt] | None = None) -> list[Attempt]:
    """Every finished attempt in ``folder`` (``known`` caches the ones read before)."""
    cache = {} if known is None else known
    for path in sorted(folder.glob("b*.txt")):
        if path.name in cache:
            continue
        lines = path.read_text().splitlines()
        head = json.loads(lines[0])
        keys, backlog = set(), 0
        windows: list[tuple[int, int]] = []
        stamps: dict[int, int] = {}
        for line in lines[1:]:
            if line.startswith("W "):  # event time: "W start count", a window the count emitted
                _, start, n = line.split()
                windows.append((int(start), int(n)))
                continue
            t, p, o, c, *ms = line.split()  # event time: the row's timestamp too
            if t != topic:
                raise ValueError(f"{path}: a record of topic {t!r}, the query reads {topic!r}")
            keys.add(_key(int(p), int(o)))
            backlog += c == "1"
            if ms:
                stamps[_key(int(p), int(o))] = int(ms[0])
        if len(lines) - 1 != head["rows"]:
            raise ValueError(f"{path}: {len(lines) - 1} rows, its header says {head['rows']}")
        cache[path.name] = Attempt(
            head["batch"], head["life"], head["call"], frozenset(keys), backlog,
            tuple(windows), stamps,
        )  # fmt: skip
    return sorted(cache.values(), key=lambda a: (a.batch, a.life, a.call))


# ----------------------------------------------------------------------- the driver
#: Tells the driver's source where to record its ``initialOffset()`` answers: JSON
#: ``{"dir": phase folder, "life": n}``. An environment variable, because the source runs in
#: a Python worker that the JVM starts, and only the environment reaches it.
_INITIAL_ENV = "FASTREBALANCE_SPARKCHAOS_INITIAL"


def _recording_source() -> type:
    """``fastrebalance`` with every ``initialOffset()`` answer appended to ``initial.jsonl``.

    Spark keeps no record of where a new query started (only where its first batch ends),
    and a ``latest`` query owes every record from there on: the check needs the answer
    that batch 0 was planned from, the last one given before ``offsets/0`` existed.
    """
    from fastrebalance.spark import FastRebalanceDataSource

    class RecordingSource(FastRebalanceDataSource):  # type: ignore[misc]
        def streamReader(self, schema: Any) -> Any:
            reader = super().streamReader(schema)
            answer = reader.initialOffset

            def initial_offset() -> Any:
                offset = answer()
                where = json.loads(os.environ.get(_INITIAL_ENV) or "null")
                if where is not None:
                    folder = Path(where["dir"])
                    logged = (folder / "checkpoint" / "offsets" / "0").exists()
                    line = {"life": where["life"], "offsets0": logged, "offset": offset}
                    with open(folder / "initial.jsonl", "a") as f:
                        f.write(json.dumps(line) + "\n")
                return offset

            reader.initialOffset = initial_offset
            return reader

    RecordingSource.__module__, RecordingSource.__qualname__ = __name__, "RecordingSource"
    return RecordingSource


def __getattr__(name: str) -> Any:
    # Made on first use, because it needs pyspark; found here by name when Spark unpickles it.
    if name == "RecordingSource":
        globals()[name] = cls = _recording_source()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _die(why: str) -> None:
    """SIGKILL this driver's whole session at once (Python, JVM, workers), after a line
    saying where: the line is the only record of a point that only this process sees."""
    print(f"sparkchaos: die {why}", flush=True)
    os.killpg(0, signal.SIGKILL)


def _driver(argv: list[str]) -> int:
    a = argparse.ArgumentParser(prog="_sparkchaos driver")
    for name in ("bootstrap", "topic", "checkpoint", "sink", "trigger", "master", "interval"):
        a.add_argument("--" + name, required=True)
    a.add_argument("--life", type=int, required=True)
    a.add_argument("--die", default="", help="POINT:CALL:DELAY_S, a point of the sink")
    a.add_argument("--java-opts", default="", help="more JVM options (the CDS archive)")
    a.add_argument("--option", action="append", default=[], help="KEY=VALUE")
    a.add_argument("--event-time", default="", help="WINDOW_MS:DELAY_MS (_sparkevtime)")
    args = a.parse_args(argv)
    point, call_no, delay = [*args.die.split(":"), "", "0", "0"][:3] if args.die else ("", "0", "0")
    die_call, die_delay = int(call_no), float(delay)
    sink = Path(args.sink)
    # workers import fastrebalance, and pyspark with its bytecode cached (_sparkpython)
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ[_INITIAL_ENV] = json.dumps({"dir": str(sink.parent), "life": args.life})

    from pyspark.sql import SparkSession

    from fastrebalance.spark import register

    spark = (
        SparkSession.builder.master(args.master)
        .appName(f"sparkchaos-{args.life}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.driver.extraJavaOptions", f"{_JAVA_OPTS} {args.java_opts}")
        .config(map=local_driver_conf(args.master))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # its checks; then the same source, recording where it starts
    spark.dataSource.register(__getattr__("RecordingSource"))
    calls = 0

    def write(df: Any, batch_id: int) -> None:
        # Runs on the driver (py4j callback thread); the reads it triggers run on executors.
        nonlocal calls
        calls += 1
        armed = point if calls == die_call else ""
        read_done = threading.Event()
        if armed == "sink_read":

            def kill_mid_read() -> None:
                if not read_done.wait(die_delay):
                    _die(f"sink_read batch={batch_id} (during the read, {die_delay:.2f}s in)")

            threading.Thread(target=kill_mid_read, daemon=True).start()
        names = ["topic", "partition", "offset", "catchup"]
        names += ["ms", "n"] if args.event_time else []
        table = df.select(*names).toArrow()
        read_done.set()
        if armed == "sink_read":
            _die(f"sink_read batch={batch_id} (the read ended within {die_delay:.2f}s)")
        cols = [table.column(c).to_pylist() for c in names]
        name = _attempt_name(batch_id, args.life, calls)
        tmp = sink / f".{name}"
        with open(tmp, "w") as f:
            f.write(
                json.dumps(
                    {"batch": batch_id, "life": args.life, "call": calls, "rows": table.num_rows}
                )
                + "\n"
            )
            if args.event_time:  # a window of the count (no topic), or a backlog row
                f.writelines(
                    f"W {ms} {n}\n" if t is None else f"{t} {p} {o} {int(c)} {ms}\n"
                    for t, p, o, c, ms, n in zip(*cols, strict=True)
                )
            else:
                f.writelines(f"{t} {p} {o} {int(c)}\n" for t, p, o, c in zip(*cols, strict=True))
            f.flush()
            os.fsync(f.fileno())
        if armed == "sink_write":
            _die(f"sink_write batch={batch_id} ({table.num_rows} rows written, not renamed)")
        os.replace(tmp, sink / name)
        fd = os.open(sink, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        print(f"sparkchaos: batch {batch_id} call {calls} rows {table.num_rows}", flush=True)
        if armed == "sink_done":
            _die(f"sink_done batch={batch_id} (in the sink, not in the commit log)")

    reader = (
        spark.readStream.format("fastrebalance")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
    )
    for kv in args.option:
        k, v = kv.split("=", 1)
        reader = reader.option(k, v)
    trigger: dict[str, Any] = {
        "processingTime": {"processingTime": args.interval},
        "once": {"once": True},
        "availableNow": {"availableNow": True},
    }[args.trigger]
    stream = reader.load()
    if args.event_time:
        from fastrebalance.testing._sparkevtime import event_time_query

        width, delay = (int(x) for x in args.event_time.split(":"))
        stream = event_time_query(stream, width, delay)
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**trigger)
        .start()
    )
    stop = Path(args.sink).parent / f"stop-{args.life}"
    while query.isActive and not stop.exists():
        query.awaitTermination(1)
    if query.isActive:  # asked to stop: between two batches, so nothing is left half done
        while query.status["isTriggerActive"]:
            time.sleep(0.01)
        query.stop()
    error = query.exception()
    spark.stop()
    if error is not None:
        print(f"sparkchaos: query failed: {error}", flush=True)
        return 3
    return 0


# -------------------------------------------------------------------- the processes
def session_members(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != b"Z":  # a zombie is dead, only not reaped
            pids.append(int(entry))
    return pids


def kill_session(sid: int, timeout: float = 10.0) -> int:
    """SIGKILL every process of session ``sid`` (a driver: Python, its JVM, the JVM's Python
    workers, which sit in a process group of their own) until none is left; returns how
    many there were. A crash of the driver machine leaves none of them."""
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while (pids := session_members(sid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(killed)


@dataclass
class Life:
    """One driver process, from start to end."""

    number: int
    plan: str  #: a kill point, "clean" (may end by itself) or "drain"
    started: float
    ended: float = 0.0
    rc: int | None = None
    killed: str = ""  #: where it was killed ("" = not killed)
    log: Path | None = None
    pid: int = 0  #: the driver's, and its session's id
    #: the query failed before the source ran: Spark gave up on its Python worker (_NO_START)
    no_start: bool = False

    @property
    def crashed(self) -> bool:
        return bool(self.killed)


def _new_files(folder: Path, since: set[str]) -> list[str]:
    try:
        names = {n for n in os.listdir(folder) if n.isdigit()}
    except FileNotFoundError:
        return []
    return sorted(names - since, key=int)


class Phase:
    """One trigger's run: its topic, checkpoint, sink and driver lives."""

    def __init__(
        self,
        s: SparkChaosSettings,
        trigger: str,
        bootstrap: str,
        workdir: Path,
        rng: random.Random,
        out: Callable[[str], None],
    ) -> None:
        self.s, self.trigger, self.bootstrap, self.rng, self.out = s, trigger, bootstrap, rng, out
        self.topic = f"sparkchaos-{trigger.lower()}-{uuid4().hex[:8]}"
        self.label = trigger if s.starting_offsets == "earliest" else f"{trigger}-latest"
        self.java_opts = ""  #: see _jvm_options
        self.dir = workdir / self.label
        self.checkpoint, self.sink = self.dir / "checkpoint", self.dir / "sink"
        self.sink.mkdir(parents=True)
        self.lives: list[Life] = []
        self.deck: list[str] = []
        self.cache: dict[str, Attempt] = {}

    def next_point(self) -> str:
        started = sum(not life.no_start for life in self.lives)
        if started < len(self.s.first_points):
            return self.s.first_points[started]
        points = list(self.s.points)
        if self.trigger != "processingTime":
            points.append("clean")  # a scheduled run that ends by itself
        if not self.deck:
            self.deck = self.rng.sample(points, len(points))
        return self.deck.pop()

    def run_life(self, plan: str, deadline: float | None = None, grace_s: float = 0.0) -> Life:
        """Start a driver, kill it as planned (or let it end), reap its whole session (after
        ``grace_s`` for the JVM to exit by itself, once the Python driver did)."""
        life = Life(len(self.lives) + 1, plan, time.monotonic())
        self.lives.append(life)
        life.log = self.dir / f"driver-{life.number:04d}.log"
        cmd = [
            sys.executable,
            "-m",
            __name__,
            "driver",
            "--bootstrap",
            self.bootstrap,
            "--topic",
            self.topic,
            "--checkpoint",
            str(self.checkpoint),
            "--sink",
            str(self.sink),
            "--trigger",
            self.trigger,
            "--master",
            self.s.master,
            "--interval",
            self.s.processing_time,
            "--life",
            str(life.number),
            "--option",
            f"startingOffsets={self.s.starting_offsets}",
            f"--java-opts={self.java_opts}",  # one word: it starts with a dash
        ]
        cmd += [x for k, v in self.s.options.items() for x in ("--option", f"{k}={v}")]
        if self.s.event_time:
            cmd += ["--event-time", f"{self.s.window_ms}:{self.s.watermark_delay_ms}"]
        if plan in _SELF_POINTS:
            first = sum(not x.no_start for x in self.lives[:-1]) < len(self.s.first_points)
            call = 1 if self.trigger == "once" or first else self.rng.randint(1, 3)
            cmd += ["--die", f"{plan}:{call}:{self.rng.uniform(0.0, 1.5):.3f}"]
        at = self.rng.uniform(1.0, 15.0) if plan == "random" else None
        delay = self.rng.uniform(0.0, 0.5) if plan == "offsets" else 0.0
        seen = {d: set(_new_files(self.checkpoint / d, set())) for d in ("offsets", "commits")}
        with open(life.log, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        life.pid = proc.pid
        fired: float | None = None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if plan in ("offsets", "commits") and fired is None:
                    new = _new_files(self.checkpoint / plan, seen[plan])
                    if new:
                        fired, life.killed = now, f"{plan}/{new[0]} appeared, +{delay:.2f}s"
                if at is not None and now - life.started >= at:
                    life.killed = f"random, {at:.1f}s after start"
                elif deadline is not None and now >= deadline:
                    life.killed = "drain timeout"
                elif now - life.started >= self.s.life_cap_s and plan != "drain":
                    life.killed = f"life cap {self.s.life_cap_s:g}s (the planned kill never came)"
                elif fired is None or now < fired + delay:
                    time.sleep(0.02)
                    continue
                kill_session(proc.pid)
                break
            proc.wait()
            end = time.monotonic() + grace_s
            while session_members(proc.pid) and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            kill_session(proc.pid)
        if proc.returncode is not None and proc.returncode >= 0 and fired is not None:
            life.killed = ""  # it ended by itself before the kill was due
        life.ended, life.rc = time.monotonic(), proc.returncode
        text = life.log.read_text(errors="replace")
        if not life.killed and "sparkchaos: die " in text:
            life.killed = text.rsplit("sparkchaos: die ", 1)[1].splitlines()[0]
        life.no_start = not life.killed and life.rc != 0 and _NO_START in text
        how = "killed: " + life.killed if life.killed else f"exit {life.rc}"
        self.out(f"  {self.label} life {life.number} ({plan}): {life.ended - life.started:.1f}s,"
                 f" {how}{' (Spark: ' + _NO_START + ')' if life.no_start else ''}")  # fmt: skip
        return life

    def run_drain_life(self, deadline_s: float) -> Life:
        """A life that is not killed; started again if Spark could not start its worker."""
        for _ in range(3):
            life = self.run_life("drain", deadline=time.monotonic() + deadline_s)
            if not life.no_start:
                break
        return life

    def attempts(self) -> list[Attempt]:
        return read_sink(self.sink, self.topic, self.cache)


# --------------------------------------------------------------------------- checks
def check_attempts(attempts: list[Attempt], lives: dict[int, Life]) -> dict[str, list[str]]:
    """What the sink's attempts say about replays, by kind of problem (see the module doc);
    plus ``crash_duplicates``: the extra copies a sink that appends would hold."""
    by_batch: dict[int, list[Attempt]] = {}
    for a in attempts:
        by_batch.setdefault(a.batch, []).append(a)
    out: dict[str, list[str]] = {
        k: []
        for k in (
            "replay_mismatch",
            "replay_without_crash",
            "written_twice",
            "in_two_batches",
            "crash_duplicates",
        )
    }
    owner: dict[int, int] = {}
    for batch, runs in sorted(by_batch.items()):
        first = runs[0]
        for prev, a in itertools.pairwise(runs):
            if a.life == prev.life:
                out["written_twice"].append(
                    f"batch {batch}: calls {prev.call} and {a.call} of life {a.life}"
                )
            elif not lives[prev.life].crashed:
                out["replay_without_crash"].append(
                    f"batch {batch}: in life {prev.life} (not killed, exit {lives[prev.life].rc})"
                    f" and again in life {a.life}"
                )
            if a.keys != first.keys:
                extra, gone = sorted(a.keys - first.keys), sorted(first.keys - a.keys)
                out["replay_mismatch"].append(
                    f"batch {batch}: life {first.life} held {len(first.keys)} records, life"
                    f" {a.life} {len(a.keys)}; only in the replay {len(extra)} (e.g."
                    f" {[_split(k) for k in extra[:3]]}), only in the first {len(gone)} (e.g."
                    f" {[_split(k) for k in gone[:3]]})"
                )
            elif a.keys:
                out["crash_duplicates"].append(
                    f"batch {batch}: {len(a.keys)} records again in life {a.life}"
                )
        for k in first.keys:
            other = owner.setdefault(k, batch)
            if other != batch:
                out["in_two_batches"].append(f"record {_split(k)} in batches {other} and {batch}")
    return out


def _log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            for p in range(partitions)
        }
    finally:
        c.close()


def _topic_keys(bootstrap: str, topic: str, ends: dict[int, int]) -> set[int]:
    """Every record's (partition, offset) in the topic below ``ends``, read with a plain
    consumer: the truth the sink is held against (its first offsets also tell what
    retention deleted, which a log-start offset may not)."""
    return set(_topic_stamps(bootstrap, topic, ends))


def _topic_stamps(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, int]:
    """``_topic_keys`` with each record's timestamp (ms; the producer's CreateTime)."""
    found = read_topic(bootstrap, topic, ends, strict=True, timeout=300)
    return {_key(m.partition(), m.offset()): m.timestamp()[1] for m in found}


def _batch_watermarks(checkpoint: Path) -> dict[int, int]:
    """The event-time watermark each logged batch ran with (``batchWatermarkMs`` in its
    offset log entry): the late-row filter and the windows it closed."""
    out = {}
    for name in _new_files(checkpoint / "offsets", set()):
        meta = json.loads((checkpoint / "offsets" / name).read_text().splitlines()[1])
        out[int(name)] = int(meta.get("batchWatermarkMs", 0))
    return out


def _query_start(folder: Path, topic: str) -> dict[int, int] | None:
    """Where a ``latest`` query starts, per partition: the ``initialOffset()`` answer its
    batch 0 was planned from (the last one given before ``offsets/0`` existed), when that
    answer names offsets; records from there on are owed. Otherwise where batch 0 began:
    ``offsets/0``'s ``@from`` (the source answers ``{"@initial": ...}`` and keeps the start
    it resolved there, docs/spark.md), or the end of batch 0 for a partition it did not read.
    """
    answers = []
    if (folder / "initial.jsonl").exists():
        answers = [json.loads(x) for x in (folder / "initial.jsonl").read_text().splitlines()]
    before = [a["offset"] for a in answers if not a["offsets0"] and topic in a["offset"]]
    path = folder / "checkpoint" / "offsets" / "0"
    if before:
        source = before[-1][topic]
    elif path.exists():
        logged = json.loads(path.read_text().splitlines()[2])
        source = {**logged[topic], **logged.get("@from", {}).get(topic, {})}
    else:
        return None
    return {
        int(p): v if isinstance(v, int) else min([v[0], *(r[0] for r in v[1:])])
        for p, v in source.items()
    }


@dataclass
class PhaseResult:
    trigger: str
    topic: str
    folder: Path
    lives: list[Life]
    in_topic: int = 0
    owed: int = 0  #: records the sink must hold
    delivered: int = 0  #: owed records found in some attempt
    missing: list[tuple[int, int]] = field(default_factory=list)
    deleted_by_retention: int = 0
    batches: int = 0
    attempts: int = 0
    backlog_rows: int = 0  #: rows delivered with catchup = true (first attempts)
    problems: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  #: lives that failed on their own
    no_start: int = 0  #: lives whose query Spark could not start (see _NO_START)
    #: the source's initialOffset() answers: (life, offsets/0 existed, offset per partition)
    initial: list[tuple[int, bool, dict[int, int]]] = field(default_factory=list)
    windows: WindowCheck | None = None  #: event time: the count per window, checked

    @property
    def kills(self) -> int:
        return sum(life.crashed for life in self.lives)

    @property
    def ok(self) -> bool:
        bad = ("replay_mismatch", "replay_without_crash", "written_twice", "in_two_batches",
               "window_replay_mismatch", "window_emitted_twice", "retention")  # fmt: skip
        return not (
            self.missing
            or self.failures
            or any(self.problems.get(k) for k in bad)
            or (self.windows is not None and not self.windows.ok)
        )


@dataclass
class SparkChaosResult:
    seed: int
    settings: SparkChaosSettings
    workdir: Path
    phases: list[PhaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.phases) and all(p.ok for p in self.phases)


def _check(ph: Phase, start: dict[int, int] | None) -> PhaseResult:
    r = PhaseResult(ph.trigger, ph.topic, ph.dir, ph.lives)
    ends = {p: high for p, (_, high) in _log_ends(ph.bootstrap, ph.topic, ph.s.partitions).items()}
    stamps = _topic_stamps(ph.bootstrap, ph.topic, ends)
    present = set(stamps)
    low = {p: high for p, high in ends.items()}
    for k in present:
        p, o = _split(k)
        low[p] = min(low[p], o)
    attempts = ph.attempts()
    lives = {life.number: life for life in ph.lives}
    r.problems = check_attempts(attempts, lives)
    r.batches, r.attempts = len({a.batch for a in attempts}), len(attempts)
    firsts: dict[int, Attempt] = {}
    for a in attempts:
        firsts.setdefault(a.batch, a)
    r.backlog_rows = sum(a.backlog for a in firsts.values())
    sunk = set().union(*(a.keys for a in attempts)) if attempts else set()
    begin = start or {}
    owed = {k for k in present if _split(k)[1] >= begin.get(_split(k)[0], 0)}
    gone = [_key(p, o) for p, first in low.items() for o in range(begin.get(p, 0), first)]
    r.deleted_by_retention = sum(1 for k in gone if k not in sunk)
    r.in_topic, r.owed = len(present), len(owed) + len(gone)
    r.delivered = len(owed & sunk) + len(gone) - r.deleted_by_retention
    r.missing = sorted(_split(k) for k in owed - sunk)
    if ph.s.event_time:  # the live rows are in the sink as counts, not records
        r.missing = []
        _check_windows(ph, r, attempts, {k: stamps[k] for k in owed}, gone)
    phantom = sorted(_split(k) for k in sunk - present if _split(k)[1] >= low[_split(k)[0]])
    if phantom:
        r.problems["phantom"] = [f"records in the sink, not in the topic: {phantom[:10]}"]
    if (ph.dir / "initial.jsonl").exists():
        for line in (ph.dir / "initial.jsonl").read_text().splitlines():
            a = json.loads(line)
            if ph.topic not in a["offset"]:  # {"@initial": ...}: the same on every call
                continue
            got = {
                int(q): v if isinstance(v, int) else v[0] for q, v in a["offset"][ph.topic].items()
            }
            r.initial.append((a["life"], a["offsets0"], got))
    r.no_start = sum(life.no_start for life in ph.lives)
    for life in ph.lives:
        if not life.crashed and life.rc != 0 and not life.no_start and life.log is not None:
            tail = life.log.read_text(errors="replace").strip().splitlines()[-6:]
            r.failures.append(
                f"life {life.number} exit {life.rc} ({life.log}):\n    " + "\n    ".join(tail)
            )
    return r


def _pending(offset: dict[str, Any], topic: str) -> int:
    """Backlog records pending in ``topic`` at this offset."""
    return sum(
        b - a for tp, pos in decode_offset(offset).items() if tp[0] == topic for a, b in pos.pending
    )


def _check_windows(
    ph: Phase, r: PhaseResult, attempts: list[Attempt], owed: dict[int, int], gone: list[int]
) -> None:
    """The event-time check (``_sparkevtime``): the topic's records per window against the
    watermarked count's windows plus the backlog rows, for every closed window. The backlog
    rows' own checks (replays, a record in two batches) are check_attempts', on their keys."""
    s = ph.s
    live = merge_live(attempts)
    r.problems["window_replay_mismatch"] = live.replay_mismatch
    r.problems["window_emitted_twice"] = live.emitted_twice
    if gone:  # their timestamps are gone with them: the topic no longer says the full count
        r.problems["retention"] = [
            f"{len(gone)} records deleted before the check, e.g. {[_split(k) for k in gone[:3]]}"
            ": their windows cannot be checked"
        ]
    marks = _batch_watermarks(ph.checkpoint)
    last = _committed_offset(ph)
    final = marks.get(last[0], 0) if last else 0
    unread = _unread(last[1], ph.topic) if last else (lambda _key: True)
    backlog: dict[int, int] = {}  # key -> timestamp, over every attempt (a replay: the same)
    behind = 0
    seen: set[int] = set()
    for a in attempts:
        if a.batch not in seen:
            seen.add(a.batch)
            behind += sum(ts < marks.get(a.batch, 0) for ts in a.stamps.values())
        backlog.update(a.stamps)
    counts = bucket(backlog.values(), s.window_ms)
    expected = bucket(owed.values(), s.window_ms)
    not_read = bucket((ts for k, ts in owed.items() if unread(k)), s.window_ms)
    r.windows = check_windows(expected, live.counts, counts, s.window_ms, final, not_read)
    r.windows.behind = behind


# ------------------------------------------------------------------------- the run
def _covered(ph: Phase, start: dict[int, int], ends: dict[int, int]) -> bool:
    sunk = set().union(*(a.keys for a in ph.attempts()))
    return all(_key(p, o) in sunk for p, end in ends.items() for o in range(start.get(p, 0), end))


def _committed_offset(ph: Phase) -> tuple[int, dict[str, Any]] | None:
    """The last committed batch and the source offset it ended at."""
    done = _new_files(ph.checkpoint / "commits", set())
    if not done:
        return None
    offset = json.loads((ph.checkpoint / "offsets" / done[-1]).read_text().splitlines()[2])
    return int(done[-1]), offset


def _caught_up(ph: Phase) -> bool:
    """The last committed batch ends at every log end with nothing pending (the offset JSON
    of docs/spark.md): the query will read nothing more, whatever the sink lacks."""
    last = _committed_offset(ph)
    if last is None:
        return False
    offset = last[1]
    ends = _log_ends(ph.bootstrap, ph.topic, ph.s.partitions)
    return {int(p): v for p, v in offset[ph.topic].items()} == {p: e for p, (_, e) in ends.items()}


def _unread(offset: dict[str, Any], topic: str) -> Callable[[int], bool]:
    """Whether a record is one the query has not read by this offset: at or past a
    partition's next offset, or in its pending backlog."""
    where = {tp[1]: pos for tp, pos in decode_offset(offset).items() if tp[0] == topic}

    def unread(key: int) -> bool:
        p, o = _split(key)
        pos = where.get(p)
        return pos is None or o >= pos.next or any(a <= o < b for a, b in pos.pending)

    return unread


def _drain(ph: Phase, start: dict[int, int], producer: FreshProducer | None = None) -> None:
    """Driver lives that are not killed. Under processingTime, one that runs until the sink
    holds everything, the query has read to the end, or nothing new arrives for a while;
    under once and availableNow one run, which must read everything that was in the topic
    when it started: that is what these triggers are scheduled for (a once run that replays
    an interrupted batch does only that, so then one more).

    ``producer`` (event time, processingTime): live traffic still running, so that the
    drain's restart, too, reads live records first and moves the watermark past its
    backlog. It is stopped once the drain committed the second batch it planned (the
    restart batch, then one that ran with the watermark the restart batch set) or read the
    backlog: the backlog then stays behind the watermark, and live traffic kept on for the
    whole backlog (a loaded machine's batches take a minute or more) would outgrow the
    embedded cluster's retention. The drain then reads to the end.
    """
    s = ph.s
    if ph.trigger == "processingTime":
        ends = {p: high for p, (_, high) in _log_ends(ph.bootstrap, ph.topic, s.partitions).items()}
        done = threading.Event()
        logged = _new_files(ph.checkpoint / "offsets", set())
        planned = int(logged[-1]) if logged else -1  # replayed by the drain, not planned by it

        def watch() -> None:
            nonlocal ends
            last, count, stopping, lives = time.monotonic(), -1, False, len(ph.lives)
            live = producer is not None
            while not done.is_set():
                n = len(ph.attempts())
                if n != count or len(ph.lives) != lives:  # a life Spark did not start is new
                    last, count, lives = time.monotonic(), n, len(ph.lives)
                if live and producer is not None:
                    now = _committed_offset(ph)
                    read = now is not None and (
                        now[0] > planned + 1
                        or (now[0] > planned and not _pending(now[1], ph.topic))
                    )
                    if read or time.monotonic() - last > s.drain_timeout_s:
                        producer.stop()
                        live = False
                        ends = {p: e for p, (_, e) in _log_ends(
                            ph.bootstrap, ph.topic, s.partitions).items()}  # fmt: skip
                        why = f"batch {now[0]} committed" if now and read else "timeout"
                        ph.out(f"  {ph.label} drain: live traffic stopped ({why})")
                    else:
                        done.wait(1.0)
                        continue
                stopping = stopping or (
                    (not s.event_time and _covered(ph, start, ends))
                    or _caught_up(ph)
                    or time.monotonic() - last > s.drain_timeout_s
                )
                if stopping:  # the current life's file: a life Spark could not start is redone
                    (ph.dir / f"stop-{len(ph.lives)}").touch()
                done.wait(1.0)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ph.run_drain_life(s.drain_timeout_s * 5)
        done.set()
        watcher.join()
        return
    logged = _new_files(ph.checkpoint / "offsets", set())
    committed = _new_files(ph.checkpoint / "commits", set())
    replay = bool(logged) and (not committed or int(logged[-1]) > int(committed[-1]))
    ph.run_drain_life(2 * s.drain_timeout_s)
    if ph.trigger == "once" and replay:
        # Trigger.Once's one batch is the replay of the batch a kill interrupted (logged, not
        # committed; Spark's Kafka source does the same): the next run reads what is left.
        ph.run_drain_life(2 * s.drain_timeout_s)


def _jvm_options(cluster: Any, workdir: Path, out: Callable[[str], None]) -> str:
    """The drivers' JVM options: a class-data-sharing archive of the classes a driver loads.

    A driver life is mostly JVM and Spark start, and most of that is loading and verifying
    some ten thousand classes. With the archive, a life on a loaded 2-core machine took
    21-35 s instead of 73 s (``availableNow`` on a small topic, interleaved runs, load
    9-16). The archive depends on the JVM build and Spark's jars, so it is kept per both,
    in ``~/.cache/fastrebalance``, and made once, by a driver run that exits normally
    (the JVM writes it at exit). It changes how fast classes load, nothing Spark does.
    """
    java = shutil.which("java") or "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    import pyspark

    key = hashlib.sha256(f"{os.path.realpath(java)} {version} {pyspark.__file__}".encode())
    cache = Path.home() / ".cache" / "fastrebalance"
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"spark-driver-{pyspark.__version__}-{key.hexdigest()[:12]}.jsa"
    with open(cache / "spark-driver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker, whoever else starts a run meanwhile
        if not archive.exists():
            out(f"sparkchaos: making the drivers' class archive {archive} (once)")
            s = SparkChaosSettings(min_kills=0)
            warm = Phase(s, "availableNow", cluster.bootstrap_servers, workdir / "jvm-archive",
                         random.Random(0), out)  # fmt: skip
            cluster.create_topic(warm.topic, 1)
            produce_backlog(cluster.bootstrap_servers, warm.topic, 1, 100)
            tmp = archive.with_suffix(f".{os.getpid()}.tmp")
            warm.java_opts = f"-XX:ArchiveClassesAtExit={tmp}"
            life = warm.run_life("archive", deadline=time.monotonic() + 600, grace_s=120)
            if life.rc == 0 and tmp.exists():
                os.replace(tmp, archive)
            else:
                tmp.unlink(missing_ok=True)
                out(f"sparkchaos: no class archive (the run ended {life.rc}); drivers start slower")
                return ""
    return f"-XX:SharedArchiveFile={archive}"


#: Driver lives started per kill wanted, at most, once the phase's time share is over.
_MAX_LIVES_PER_KILL = 6


def _phase(
    s: SparkChaosSettings,
    trigger: str,
    cluster: Any,
    workdir: Path,
    rng: random.Random,
    share_s: float,
    java_opts: str,
    out: Callable[[str], None],
) -> PhaseResult:
    bootstrap: str = cluster.bootstrap_servers
    ph = Phase(s, trigger, bootstrap, workdir, rng, out)
    ph.java_opts = java_opts
    cluster.create_topic(ph.topic, s.partitions)
    out(f"sparkchaos: {ph.label}: topic {ph.topic}, checkpoint {ph.checkpoint}")
    # Batched: on the embedded cluster a log of single-record message sets reads slower the
    # deeper it is (``FreshProducer``), and a run slowed by a loaded machine made its topic
    # deeper still: a drain batch of 6,000 records took 60 s at offset 37,000 (load 11-25).
    producer = FreshProducer(
        bootstrap, partition_keys(ph.topic, s.partitions), s.rate, linger_ms=_LIVE_LINGER_MS
    )
    producer.start()
    live_drain = s.event_time and trigger == "processingTime"
    try:
        first = time.monotonic()
        while time.monotonic() < first + share_s or sum(x.crashed for x in ph.lives) < s.min_kills:
            if len(ph.lives) >= _MAX_LIVES_PER_KILL * max(s.min_kills, 1) and time.monotonic() > (
                first + share_s
            ):
                # lives that end on their own (a Python worker that never connected back on a
                # loaded machine, a failed query) are not kills: never start them for ever
                raise RuntimeError(
                    f"{ph.label}: {len(ph.lives)} driver lives, only"
                    f" {sum(x.crashed for x in ph.lives)} killed of the {s.min_kills} wanted"
                )
            if producer.error is not None:
                raise RuntimeError(f"the live producer failed: {producer.error}")
            ph.run_life(ph.next_point())
            down = rng.uniform(*s.down_s)
            if rng.random() < 0.5:
                n = rng.randint(*s.burst)
                t = time.monotonic()
                if produce_backlog(bootstrap, ph.topic, s.partitions, n):
                    raise RuntimeError("a burst was not fully produced")
                out(f"  {ph.label} down: a burst of {n} records")
                down -= time.monotonic() - t
            time.sleep(max(0.0, down))
    except BaseException:
        producer.stop()
        raise
    if not live_drain:
        producer.stop()
    # The drain is a restart too, with a backlog above catchup.threshold behind it.
    if produce_backlog(bootstrap, ph.topic, s.partitions, rng.randint(*s.burst)):
        raise RuntimeError("the burst before the drain was not fully produced")
    start = {p: low for p, (low, _) in _log_ends(bootstrap, ph.topic, s.partitions).items()}
    if s.starting_offsets == "latest":
        start = _query_start(ph.dir, ph.topic) or {
            p: high for p, (_, high) in _log_ends(bootstrap, ph.topic, s.partitions).items()
        }
    try:
        _drain(ph, start, producer if live_drain else None)
    finally:
        producer.stop()  # the handle is the producer thread's; stop() only joins it
    if producer.error is not None:
        raise RuntimeError(f"the live producer failed: {producer.error}")
    return _check(ph, start if s.starting_offsets == "latest" else None)


def run_spark_chaos(
    settings: SparkChaosSettings, cluster: Any = None, out: Callable[[str], None] = print
) -> SparkChaosResult:
    """Run every trigger's phase in turn and check it.

    ``cluster`` (anything with ``bootstrap_servers`` and ``create_topic``, e.g. the test
    suite's) wins over ``settings.bootstrap_servers``; with neither, an embedded one runs.
    """
    s = settings
    unknown = sorted(set(s.triggers) - set(TRIGGERS)) + sorted(set(s.points) - set(KILL_POINTS))
    if unknown or not s.triggers or not s.points:
        raise ValueError(f"unknown triggers or kill points {unknown}: {TRIGGERS}, {KILL_POINTS}")
    seed = s.seed if s.seed is not None else random.SystemRandom().randrange(1 << 32)
    workdir = s.workdir or Path(tempfile.mkdtemp(prefix="fastrebalance-sparkchaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = SparkChaosResult(seed, s, workdir)
    out(f"sparkchaos: seed={seed} (replay with --seed {seed}); files in {workdir}")
    own: Any = None
    try:
        if cluster is None:
            from fastrebalance.testing._clusters import ExternalKafka
            from fastrebalance.testing._embedded import EmbeddedKafka

            b = s.bootstrap_servers
            own = cluster = ExternalKafka(b) if b else EmbeddedKafka()
        java = _jvm_options(cluster, workdir, out)
        share = s.duration_s if s.parallel else s.duration_s / len(s.triggers)
        phases: dict[str, PhaseResult | BaseException] = {}

        def run(trigger: str) -> None:
            rng = random.Random(f"{seed}-{trigger}")  # the same schedule, in turn or in parallel
            try:
                phases[trigger] = _phase(s, trigger, cluster, workdir, rng, share, java, out)
            except BaseException as exc:  # re-raised by the caller's thread
                phases[trigger] = exc

        threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in s.triggers]
        for t in threads:
            t.start()
            if not s.parallel:
                t.join()
        for t in threads:
            t.join()
        for trigger in s.triggers:
            phase = phases[trigger]
            if isinstance(phase, BaseException):
                raise phase
            result.phases.append(phase)
    finally:
        if own is not None:
            own.close()
    return result


def format_result(r: SparkChaosResult, command: str | None = None) -> str:
    lines = [f"spark chaos: seed {r.seed}, files in {r.workdir}"]
    if command:
        lines.append(f"replay: {command}")
    for p in r.phases:
        kinds: dict[str, int] = {}
        for life in p.lives:
            kinds[life.plan] = kinds.get(life.plan, 0) + 1
        lines += [
            f"[{p.trigger}] {'PASS' if p.ok else 'FAIL'}  topic {p.topic}, {p.folder}",
            f"  driver lives {len(p.lives)} ("
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
            + f"), killed {p.kills}"
            + (f", {p.no_start} not started by Spark ({_NO_START})" if p.no_start else ""),
            f"  records in topic {p.in_topic}, owed {p.owed}, in the sink {p.delivered},"
            f" missing {len(p.missing)}, deleted by retention first {p.deleted_by_retention}"
            if p.windows is None
            else f"  records in topic {p.in_topic}, owed {p.owed}; backlog rows in the sink"
            f" {p.delivered} (the live rows are in it as counts per window)",
            f"  batches {p.batches}, attempts {p.attempts}, backlog rows {p.backlog_rows},"
            f" replays with crash duplicates {len(p.problems.get('crash_duplicates', []))}",
        ]
        if p.windows is not None:
            w = p.windows
            lines.append(
                f"  event time: windows of {w.width_ms} ms checked {w.checked} ({w.records}"
                f" records: {w.live} counted live, {w.backlog} as backlog rows), short"
                f" {len(w.short)}, over {len(w.over)}, still open {w.open}; backlog rows"
                f" behind their batch's watermark {w.behind}"
            )
            if w.short:
                lines.append("  SHORT: " + short_summary(w))
            if w.over:
                over = (f"{st} ({got} of {want})" for st, want, got in w.over[:5])
                lines.append(f"  OVER ({len(w.over)}): " + ", ".join(over))
        if p.missing:
            by_part: dict[int, list[int]] = {}
            for part, off in p.missing:
                by_part.setdefault(part, []).append(off)
            ranges = (f"p{q}: {len(o)} in [{o[0]}, {o[-1]}]" for q, o in sorted(by_part.items()))
            lines.append("  MISSING: " + "; ".join(ranges))
        for kind, items in sorted(p.problems.items()):
            if kind != "crash_duplicates" and items:
                lines += [f"  {kind.upper()} ({len(items)}):"] + [f"    {x}" for x in items[:10]]
        lines += [f"  DRIVER FAILED: {x}" for x in p.failures]
        if len({str(o) for _, _, o in p.initial}) > 1:
            lines.append("  initialOffset() answered differently in one query:")
            lines += [
                f"    life {n}, {'after' if logged else 'before'} offsets/0: "
                + " ".join(f"p{q}={o}" for q, o in sorted(offs.items()))
                for n, logged, offs in p.initial
            ]
    lines.append("result: " + ("PASS" if r.ok else "FAIL"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["driver"]:
        return _driver(args[1:])
    raise SystemExit("usage: python -m fastrebalance.testing._sparkchaos driver ...")


if __name__ == "__main__":
    sys.exit(main())
