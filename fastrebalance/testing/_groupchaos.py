"""Chaos for group-wide catch-up: member processes SIGKILLed and restarted at random while the
whole group drains a backlog in chunks; a checker for 0 lost records and 0 unsafe offsets.

A worker (``python -m fastrebalance.testing._groupchaos worker ...``) is a
``fastrebalance.Consumer`` with ``parallel.rebalance.group.catchup=true``. Every record it
is handed is *processed* by appending ``"<partition> <offset>"`` to its own file, flushed
before the commit that covers it (a SIGKILL loses the process, not the page cache). It
commits (bare, asynchronous) after every batch; with ``--pipeline N`` it keeps up to N
batches handed out but unprocessed while records flow, and commits what it stored with
``store_offsets()`` once processed. Lines starting with ``#`` are events:
``#member <id>`` (its member id in the claims log), ``#assign <p>...``, ``#revoke <p>...``.

The checker holds the two promises of the mode, group-wide:

* **0 lost**: every produced offset is in some worker's file at the end;
* **0 unsafe**: at every sample the offset the group stores (read as any tool reads it)
  has every offset below it in some file *already* (``Observer``): the group never
  claimed a record no member processed.

``run_group_chaos`` is the chaos mode (``fastrebalance group-chaos``); the integration tests
use its pieces with fewer, chosen faults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from .._claims import ClaimRecord, Scope, decode_record
from .._config import default_claims_topic
from .._retry import call_with_retries

__all__ = [
    "ChaosReport",
    "Member",
    "Observer",
    "Processed",
    "claims_history",
    "main",
    "prepare",
    "run_group_chaos",
]


# -- the worker ---------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    from fastrebalance import Consumer

    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "enable.parallel.rebalance": True,
        "parallel.rebalance.group.catchup": True,
        "parallel.rebalance.group.chunk.records": args.chunk,
        "parallel.rebalance.group.claim.timeout.ms": args.claim_timeout_ms,
        "parallel.rebalance.lag.threshold": 10,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": 500,
    }
    if args.protocol == "consumer":  # KIP-848: the session timeout is the group's (broker)
        conf["group.protocol"] = "consumer"
        del conf["session.timeout.ms"], conf["heartbeat.interval.ms"]
    if args.pipeline:
        conf["enable.auto.offset.store"] = False  # store_offsets() once processed
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(args.out, "a", encoding="ascii")  # noqa: SIM115 (closed at exit)
    consumer = Consumer(conf)
    group = consumer._group
    out.write(f"#member {group.member if group is not None else '?'}\n")
    out.flush()

    def on_assign(c: Any, tps: list[TopicPartition]) -> None:
        out.write("#assign " + " ".join(str(t.partition) for t in tps) + "\n")
        out.flush()

    def on_revoke(c: Any, tps: list[TopicPartition]) -> None:
        out.write("#revoke " + " ".join(str(t.partition) for t in tps) + "\n")
        out.flush()

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    work_s = args.work_us / 1e6
    deadline = time.monotonic() + args.seconds
    held: deque[list[Any]] = deque()

    def process(batch: list[Any]) -> None:
        lines = []
        for m in batch:
            if work_s:
                time.sleep(work_s)
            lines.append(f"{m.partition()} {m.offset()}\n")
        out.write("".join(lines))
        out.flush()  # processed before committed
        if args.pipeline:
            for m in batch:
                consumer.store_offsets(message=m)
        try:
            consumer.commit(asynchronous=True)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise

    try:
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = [m for m in consumer.consume(500, 0.1) if m.error() is None]
            if msgs:
                held.append(msgs)
            # --pipeline N: up to N batches stay handed out but unprocessed while records
            # flow (a pipeline stage ahead of processing), so the consumer is called while
            # they are: a chunk declared done before its records are committed would show
            if not held or (msgs and len(held) <= args.pipeline):
                continue
            process(held.popleft())
        while held:
            process(held.popleft())
        with contextlib.suppress(Exception):
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
        out.write("#closed\n")
        out.close()
    return 0


# -- reading what the workers processed ---------------------------------------------------------
class Processed:
    """Every worker file, read incrementally: which offsets of each partition some member
    processed, how often, and the workers' events."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self._pos: dict[Path, int] = {}
        self.count: dict[tuple[int, int], int] = {}
        self.members: dict[Path, list[str]] = {}
        self.events: dict[Path, list[str]] = {}
        #: per partition, the lowest offset not processed yet (everything below is)
        self.low: dict[int, int] = {}
        self._parts: set[int] = set()
        self.lock = threading.Lock()

    def add(self, path: Path) -> None:
        with self.lock:
            if path not in self.paths:
                self.paths.append(path)

    def refresh(self) -> None:
        with self.lock:
            for path in self.paths:
                if not path.exists():
                    continue
                with path.open("rb") as f:
                    f.seek(self._pos.get(path, 0))
                    data = f.read()
                cut = data.rfind(b"\n") + 1  # a line being written is read next time
                self._pos[path] = self._pos.get(path, 0) + cut
                for raw in data[:cut].decode("ascii", "replace").splitlines():
                    if raw.startswith("#member "):
                        self.members.setdefault(path, []).append(raw.split()[1])
                    elif raw.startswith("#"):
                        self.events.setdefault(path, []).append(raw[1:])
                    elif raw:
                        p, o = raw.split()
                        key = (int(p), int(o))
                        self.count[key] = self.count.get(key, 0) + 1
                        self._parts.add(key[0])
            for part in self._parts:
                low = self.low.get(part, 0)
                while (part, low) in self.count:
                    low += 1
                self.low[part] = low

    def missing(self, partition: int, below: int, start: int = 0) -> list[int]:
        with self.lock:
            start = max(start, self.low.get(partition, 0))  # all below low are processed
            return [o for o in range(start, below) if (partition, o) not in self.count]

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.count.values())


class Observer(threading.Thread):
    """Samples the offsets the group stores, as any tool reads them, and checks each
    against what was processed by then: an offset with an unprocessed record below it is
    unsafe. The consumer handle is this thread's own."""

    def __init__(
        self, bootstrap: str, group: str, topic: str, partitions: int, processed: Processed
    ) -> None:
        super().__init__(name="group-observer", daemon=True)
        self._conf = {"bootstrap.servers": bootstrap, "group.id": group}
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self._processed = processed
        self._halt = threading.Event()
        self.samples = 0
        self.unsafe: list[tuple[int, int, list[int]]] = []
        self.last: dict[int, int] = {}

    def run(self) -> None:
        c = PlainConsumer(self._conf)
        try:
            while not self._halt.wait(0.1):
                with contextlib.suppress(Exception):
                    self.sample(c)
        finally:
            c.close()

    def sample(self, c: PlainConsumer) -> None:
        got = c.committed(self._tps, timeout=10)
        self._processed.refresh()
        for tp in got:
            if tp.offset < 0:
                continue
            self.samples += 1
            self.last[tp.partition] = tp.offset
            missing = self._processed.missing(tp.partition, tp.offset)
            if missing:
                self.unsafe.append((tp.partition, tp.offset, missing[:5]))

    def stop(self) -> None:
        self._halt.set()
        self.join(15)


def claims_history(
    bootstrap: str, group: str, claims_topic: str | None = None
) -> list[tuple[ClaimRecord | None, int]]:
    """Every record of ``group``'s in its claims log (the default topic unless named), in
    order, with its timestamp (what each member did); None for a record of another group."""
    claims_topic = claims_topic or default_claims_topic(group)
    c = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"inspect-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        _, high = c.get_watermark_offsets(TopicPartition(claims_topic, 0), timeout=10)
        scope = Scope(group, c.list_topics(claims_topic, timeout=10).cluster_id or "")
        c.assign([TopicPartition(claims_topic, 0, 0)])
        out: list[tuple[ClaimRecord | None, int]] = []
        deadline = time.monotonic() + 30
        read = 0
        while read < high and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    read += 1
                    out.append((decode_record(m.value(), scope), m.timestamp()[1]))
        return out
    finally:
        c.close()


# -- setting up a backlog -----------------------------------------------------------------------
def prepare(bootstrap: str, topic: str, group: str, backlog: int, partition: int = 0) -> None:
    """The group commits offset 0, then ``backlog`` records arrive: the member that gains
    the partition finds that backlog to catch up on."""
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        # retried: a broker started moments ago answers COORDINATOR_LOAD_IN_PROGRESS while
        # it loads the group's __consumer_offsets partition (a fresh Kafka 3.9, first test)
        call_with_retries(
            lambda: c.commit(offsets=[TopicPartition(topic, partition, 0)], asynchronous=False),
            attempts=30,
        )
    finally:
        c.close()
    produce(bootstrap, topic, backlog, partition)


def produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        p.produce(topic, value=str(i).encode(), partition=partition)
        if i % 10000 == 0:
            p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("records not delivered")


# -- member processes -----------------------------------------------------------------------------
class Member:
    """One worker process; restartable; its file accumulates across its lives."""

    def __init__(self, name: str, workdir: Path, argv: list[str]) -> None:
        self.name = name
        self.out = workdir / f"{name}.log"
        self.err = workdir / f"{name}.err"
        self._argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.kills = 0

    def start(self) -> None:
        with self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fastrebalance.testing._groupchaos", "worker",
                 "--out", str(self.out), *self._argv],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        self.lives += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.kills += 1

    def stop(self, timeout: float = 30.0) -> None:
        if not self.running:
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def worker_argv(
    bootstrap: str,
    topic: str,
    group: str,
    work_us: float,
    chunk: int,
    claim_timeout_ms: int,
    seconds: float,
    session_timeout_ms: int = 6000,
    pipeline: int = 0,
    protocol: str = "classic",
) -> list[str]:
    return [
        "--pipeline", str(pipeline), "--protocol", protocol,
        "--bootstrap", bootstrap, "--topic", topic, "--group", group,
        "--work-us", str(work_us), "--chunk", str(chunk),
        "--claim-timeout-ms", str(claim_timeout_ms), "--seconds", str(seconds),
        "--session-timeout-ms", str(session_timeout_ms),
    ]  # fmt: skip


# -- the chaos run ------------------------------------------------------------------------------
@dataclass
class ChaosReport:
    produced: int
    lost: int
    unsafe: int
    duplicates: int
    kills: int
    lives: int
    samples: int
    seconds: float
    drained: bool
    final_offset: int
    unsafe_examples: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.unsafe == 0 and self.drained and self.samples > 0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ok"] = self.ok
        return d


def run_group_chaos(
    bootstrap: str,
    workdir: Path,
    seconds: float = 60.0,
    members: int = 3,
    backlog: int = 30_000,
    fresh_per_s: int = 200,
    work_us: float = 100.0,
    chunk: int = 2000,
    claim_timeout_ms: int = 3000,
    seed: int | None = None,
    kill_every_s: tuple[float, float] = (2.0, 6.0),
    drain_s: float = 120.0,
    create_topic: Callable[[str, int], None] | None = None,
    log: Callable[[str], None] = lambda line: None,
    protocol: str = "classic",
    group_timeout: bool = True,
) -> ChaosReport:
    """Members SIGKILLed and restarted at random for ``seconds`` while the group drains a
    backlog (one partition) and fresh records arrive; then everything is drained with no
    faults and checked: every produced record processed, the group's offset never unsafe.

    ``protocol``: ``classic`` (librdkafka's default assignors) or ``consumer`` (KIP-848;
    the group gets the classic members' 6 s session timeout where the broker takes a
    per-group one, Apache Kafka 4; ``group_timeout=False`` where it does not: the embedded
    cluster sets one for all groups, and leaves the request unanswered)."""
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    topic, group = f"gchaos-{tag}", f"gchaos-{tag}"
    if create_topic is None:
        from ._clusters import ExternalKafka

        create_topic = ExternalKafka(bootstrap).create_topic
    create_topic(topic, 1)
    prepare(bootstrap, topic, group, backlog)
    if protocol == "consumer" and group_timeout:
        from ._clusters import set_consumer_group_timeouts

        took, why = set_consumer_group_timeouts(bootstrap, group, 6000)
        log("group chaos: group session timeout 6000 ms" if took else
            f"group chaos: the broker's group session timeout applies ({why})")  # fmt: skip
    log(
        f"group chaos: topic {topic}, seed {seed}, {members} members, backlog {backlog:,}, "
        f"{protocol} protocol"
    )
    produced = [backlog]
    argv = worker_argv(
        bootstrap, topic, group, work_us, chunk, claim_timeout_ms, 3600, protocol=protocol
    )
    team = [Member(f"m{i}", workdir, argv) for i in range(members)]
    processed = Processed([m.out for m in team])
    observer = Observer(bootstrap, group, topic, 1, processed)
    stop_fresh = threading.Event()

    def fresh() -> None:  # the producer handle is this thread's own
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while not stop_fresh.wait(0.1):
            n = max(fresh_per_s // 10, 1)
            for _ in range(n):
                p.produce(topic, value=b"f", partition=0)
            p.poll(0)
            produced[0] += n
        p.flush(30)

    began = time.monotonic()
    for m in team:
        m.start()
    observer.start()
    feeder = threading.Thread(target=fresh, name="group-chaos-fresh", daemon=True)
    feeder.start()
    try:
        while time.monotonic() - began < seconds:
            time.sleep(rng.uniform(*kill_every_s))
            victim = rng.choice(team)
            victim.kill()
            log(f"{time.monotonic() - began:6.1f}s SIGKILL {victim.name}")
            time.sleep(rng.uniform(0.0, 2.0))
            for m in team:
                if not m.running:
                    m.start()
        stop_fresh.set()
        feeder.join(30)
        for m in team:
            if not m.running:
                m.start()
        end = produced[0]
        deadline = time.monotonic() + drain_s
        drained = False
        while time.monotonic() < deadline:
            processed.refresh()
            if not processed.missing(0, end) and observer.last.get(0, -1) >= end:
                drained = True
                break
            time.sleep(0.5)
    finally:
        stop_fresh.set()
        for m in team:
            m.stop()
        observer.stop()
    processed.refresh()
    lost = len(processed.missing(0, produced[0]))
    return ChaosReport(
        produced=produced[0],
        lost=lost,
        unsafe=len(observer.unsafe),
        duplicates=processed.duplicates(),
        kills=sum(m.kills for m in team),
        lives=sum(m.lives for m in team),
        samples=observer.samples,
        seconds=round(time.monotonic() - began, 1),
        drained=drained,
        final_offset=observer.last.get(0, -1),
        unsafe_examples=observer.unsafe[:5],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--bootstrap", required=True)
    w.add_argument("--topic", required=True)
    w.add_argument("--group", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--work-us", type=float, default=0.0)
    w.add_argument("--chunk", type=int, default=2000)
    w.add_argument("--claim-timeout-ms", type=int, default=3000)
    w.add_argument("--seconds", type=float, default=600.0)
    w.add_argument("--session-timeout-ms", type=int, default=6000)
    w.add_argument("--pipeline", type=int, default=0)
    w.add_argument("--protocol", choices=("classic", "consumer"), default="classic")
    r = sub.add_parser("run")
    r.add_argument("--bootstrap", required=True)
    r.add_argument("--workdir", default=None)
    r.add_argument("--seconds", type=float, default=60.0)
    r.add_argument("--members", type=int, default=3)
    r.add_argument("--backlog", type=int, default=30_000)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--protocol", choices=("classic", "consumer"), default="classic")
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        return _worker(args)
    workdir = Path(args.workdir or f"/tmp/group-chaos-{os.getpid()}")
    report = run_group_chaos(
        args.bootstrap,
        workdir,
        seconds=args.seconds,
        members=args.members,
        backlog=args.backlog,
        seed=args.seed,
        log=lambda line: print(line, flush=True),
        protocol=args.protocol,
    )
    print(json.dumps(report.as_dict()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
