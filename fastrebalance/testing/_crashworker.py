"""A consumer worker for the chaos harness: process (log) records, fsync, then commit.

Run as::

    python -m fastrebalance.testing._crashworker --bootstrap B --topic T --group G --log PATH \
        [--mode inorder|async|eos] [--seed N] [--threshold N]
        [--protocol classic|cooperative|consumer] [--work-us N] [--session-timeout-ms MS]
        [--max-poll-interval-ms MS] [--socket-timeout-ms MS]
        [--output-topic T --transactional-id ID]   (--mode eos)

It is a ``fastrebalance.Consumer`` with ``enable.parallel.rebalance=true`` and manual commits.
Every record ``consume()`` returns is *processed* by appending one line to the log file
(``_chaos_check.format_line``: partition, offset, value, produce-to-processing
latency, and which stream delivered it), and the log is flushed and fsynced BEFORE any commit
that covers the record. That ordering is the at-least-once contract the harness checks: a
committed offset may only cover records already durable in some log. Three behaviours
(``--mode``; the harness draws ``inorder`` or ``async`` per process from the chaos seed,
``eos`` runs alone):

* ``inorder``: consume a batch, process all of it, and every ~50 ms (or 2000 records) flush,
  fsync and ``commit()`` (bare, synchronous).
* ``async``: an asynchronous pipeline. Consumed batches are held in a queue and processed out
  of order (a random held batch at a time, some held back for several iterations, some split);
  the log is fsynced every ~50 ms, and commits are made LATE: each is scheduled when it
  becomes true and made 0-30 s later, so it often lands after its partition was revoked or
  lost, or in a later assignment of it. The commits stay true under Kafka's contract as the
  library documents it (see ``HandedLog``): ``commit(message=m)`` (synchronous or not), or
  ``commit(offsets=[m.offset() + 1])`` (either stream's record), only once ``m``
  and every record handed out before ``m`` on its partition (in delivery order, whatever
  the stream) is durable; a bare ``commit()`` only when everything handed out is durable
  (the pipeline stops consuming and drains every 0.3-3 s for that).
* ``eos``: read-process-write in producer transactions (``EOSWorker``): one output record
  per input record, both commit logs in the same transaction.

Signals (the harness sends them; see ``_chaos_faults.FaultInjector``):

* SIGKILL at any moment, SIGSTOP/SIGCONT: the harness alone.
* SIGTERM / SIGINT: a clean close (process what is held, a final synchronous commit,
  ``close()``).
* SIGUSR1: SIGKILL yourself while the next commit is in flight: a timer thread fires a
  random fraction of a typical commit's duration after the commit call starts, so the kill
  lands between the child's checkpoint and the group commit, or during either.
* SIGUSR2: SIGKILL yourself halfway through the next batch holding backlog records: some
  of the child's records processed (logged), none committed: the child is mid-range.
* SIGQUIT: dump every thread's stack to stderr (the harness sends it to a worker that does
  not exit in time after SIGTERM, before it SIGKILLs it).

Only this process can see those moments precisely; a signal from outside would arrive
milliseconds too late. Progress events go to stdout as JSON lines (``{"ev": ..., "t": ...}``).
Around a shutdown they say how long each step took, for the harness to hold against the
library's documented bounds (``_chaos_workers.documented_bounds``): ``sigterm`` (written by a
watchdog thread the moment the signal arrives, naming the call under way and since when),
``stopping`` (the loop is left), ``final_commit_begin`` / ``final_commit_done``,
``close_begin`` / ``closed``.
"""

from __future__ import annotations

import abc
import argparse
import bisect
import contextlib
import faulthandler
import heapq
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from fastrebalance import Consumer
from fastrebalance.testing._chaos_check import format_line
from fastrebalance.testing._chaos_settings import ALL_WORKER_MODES
from fastrebalance.testing._chaos_workers import OWN_STEP, documented_bounds

#: Flush + fsync + commit when this much time has passed with records pending...
COMMIT_INTERVAL_S = 0.05
#: ... or this many records are pending ...
COMMIT_RECORDS = 2000
#: ... and at least this often even with nothing new (a failed commit is retried).
IDLE_COMMIT_INTERVAL_S = 1.0
#: The timeout of every consume() call.
CONSUME_TIMEOUT_S = 0.1
#: The async pipeline processes extra batches when it holds more than this many.
MAX_HELD = 8

#: Calls of the transactional producer tried again on a retriable error before giving up
ATTEMPTS = 5
#: The transactional producers' transaction.timeout.ms.
TRANSACTION_TIMEOUT_MS = 10000
#: How long init_transactions() is retried: the previous producer's open transaction may
#: take transaction.timeout.ms to be aborted, and the broker may be restarting meanwhile
#: (an attempt count was not enough: five CONCURRENT_TRANSACTIONS answers came in seconds).
INIT_BUDGET_S = 3 * TRANSACTION_TIMEOUT_MS / 1000 + 30

_emit_lock = threading.Lock()


def _emit(event: str, **fields: Any) -> None:
    fields["ev"] = event
    fields["t"] = time.time()
    line = json.dumps(fields) + "\n"
    with _emit_lock:  # the watchdog thread writes too
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):  # the harness stopped reading us: keep working
            pass


def build_config(
    bootstrap: str,
    group: str,
    threshold: int,
    protocol: str,
    client_id: str,
    session_timeout_ms: int = 6000,
    max_poll_interval_ms: int = 300000,
    socket_timeout_ms: int = 60000,
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": client_id,
        "enable.parallel.rebalance": True,
        "parallel.rebalance.lag.threshold": threshold,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,
        "max.poll.interval.ms": max_poll_interval_ms,
        "socket.timeout.ms": socket_timeout_ms,
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"  # KIP-848: session timeout is the broker's
    else:
        conf["session.timeout.ms"] = session_timeout_ms
        conf["heartbeat.interval.ms"] = min(1000, session_timeout_ms // 3)
        conf["partition.assignment.strategy"] = (
            "cooperative-sticky" if protocol == "cooperative" else "range"
        )
    return conf


def _parts(partitions: list[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)


def _die() -> None:
    _emit("dying")
    os.kill(os.getpid(), signal.SIGKILL)


class Flags:
    """What the signal handlers asked for. Installed before the Consumer exists, so a signal
    sent to a young worker is never met by the default action (which would terminate it)."""

    stop = False
    kill_in_commit = False  # SIGUSR1
    kill_mid_backlog = False  # SIGUSR2


class Phase:
    """What the main thread is doing, since when (wall clock) and within which bound: read
    by the watchdog thread when SIGTERM arrives, since the main thread may be blocked in a
    librdkafka call and only see the signal when that call returns.

    ``hangs`` (``--hang``, tests of the harness only): steps that first sleep this many
    seconds, as a library call that does not return would."""

    OWN = OWN_STEP

    def __init__(self, own_bound: float, hangs: dict[str, float] | None = None) -> None:
        self.own_bound = own_bound
        self.hangs = hangs or {}
        self.now: tuple[str, float, float] = (self.OWN, time.time(), own_bound)

    @contextlib.contextmanager
    def __call__(self, name: str, bound: float) -> Iterator[None]:
        self.now = (name, time.time(), bound)
        try:
            if name in self.hangs:
                time.sleep(self.hangs.pop(name))
            yield
        finally:
            self.now = (self.OWN, time.time(), self.own_bound)


def _watch_for_sigterm(read_fd: int, phase: Phase) -> None:
    """Say which call was under way when SIGTERM arrived (``signal.set_wakeup_fd`` writes
    the signal's number to ``read_fd``'s pipe from the C handler, whatever the main thread
    is blocked in), then every step the shutdown goes through (sampled every 0.5 s: a step
    that could break a bound lasts far longer)."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        if {signal.SIGTERM, signal.SIGINT} & set(data):
            break
    name, since, bound = reported = phase.now
    _emit("sigterm", phase=name, phase_t=since, bound=bound)
    while True:
        time.sleep(0.5)
        now = phase.now
        if now != reported:
            reported = now
            name, since, bound = now
            _emit("phase", phase=name, phase_t=since, bound=bound)


class Worker(abc.ABC):
    """What every behaviour shares: the consumer, the log, the callbacks, the shutdown."""

    mode = "inorder"

    def __init__(self, args: argparse.Namespace, flags: Flags, phase: Phase) -> None:
        self.args = args
        self.flags = flags
        conf = build_config(
            args.bootstrap,
            args.group,
            args.threshold,
            args.protocol,
            f"crashworker-{os.getpid()}",
            args.session_timeout_ms,
            args.max_poll_interval_ms,
            args.socket_timeout_ms,
        )
        conf.update(self.extra_config())
        self.consumer = Consumer(conf)
        self.bounds = bounds(args)
        self.phase = phase
        self.log = open(args.log, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        seed = args.seed if args.seed is not None else os.getpid() ^ int(time.time() * 1000)
        self.rng = random.Random(seed)
        self.processed = 0
        self.commits = 0
        self.commit_s = 0.002  # running mean of a commit's duration
        self.catchup = False
        self.assigned: set[int] = set()
        self.generation: dict[int, int] = {}  #: partition -> how many times assigned

    def extra_config(self) -> dict[str, Any]:
        return {}

    # -- callbacks
    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.add(tp.partition)
            self.generation[tp.partition] = self.generation.get(tp.partition, 0) + 1
        _emit("assigned", partitions=_parts(partitions))

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.assigned -= {tp.partition for tp in partitions}
        _emit("revoked", partitions=_parts(partitions))

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.assigned -= {tp.partition for tp in partitions}
        _emit("lost", partitions=_parts(partitions))

    # -- helpers
    def _backlog(self) -> dict[int, list[tuple[int, int]]]:
        """Pending backlog ranges per partition: a record inside one came from the child
        (the primary reads only from the log end at assignment on)."""
        with self.phase("catchup_status()", self.bounds["own"]):
            status = self.consumer.catchup_status()
        return {k[1]: list(s.pending_ranges) for k, s in status.items()}

    def consume(self) -> list[Any]:
        with self.phase("consume()", self.bounds["consume"]):
            return self.consumer.consume(self.batch_size(), CONSUME_TIMEOUT_S)

    def batch_size(self) -> int:
        return 500

    def sync_log(self) -> None:
        with self.phase("flush + fsync of the log", self.bounds["own"]):
            self.log.flush()
            os.fsync(self.log.fileno())

    def work(self, records: int) -> None:
        if records and self.args.work_us:
            time.sleep(records * self.args.work_us / 1e6)  # simulated work, not burning a core

    def commit_call(
        self, call: Callable[[bool], Any], asynchronous: bool, may_die: bool = True, **info: Any
    ) -> bool:
        """Make one commit (``call(asynchronous)``); if SIGUSR1 asked for it and ``may_die``,
        die in it."""
        if self.flags.kill_in_commit and may_die:
            self._commit_and_die(call, info)  # returns only in "timer" mode
        started = time.monotonic()
        try:
            with self.phase("commit()", self.bounds["commit"]):
                call(asynchronous)
        except KafkaException as exc:
            took = round(time.monotonic() - started, 3)
            _emit("commit_failed", error=str(exc), took=took, **info)
            return False
        took = round(time.monotonic() - started, 3)
        if not asynchronous:
            self.commit_s = 0.9 * self.commit_s + 0.1 * took
        self.commits += 1
        _emit("commit", asynchronous=asynchronous, took=took, **info)
        return True

    def _commit_and_die(self, call: Callable[[bool], Any], info: dict[str, Any]) -> None:
        """SIGKILL this process while a commit is in flight, one of three ways:

        * ``async``: an asynchronous commit, then SIGKILL at once: the OffsetCommit requests
          are queued or on the wire, and the broker may or may not apply them;
        * ``between``: after the child's checkpoint commit returned, before the group commit
          (the two commit logs then disagree, the case the restart merge exists for); when
          this commit carries no checkpoint, right after the group commit instead;
        * ``timer``: a synchronous commit, with a timer firing a random fraction of a typical
          commit's duration into it (this returns, and the caller makes the commit).
        """
        how = self.rng.choice(("async", "between", "timer"))
        _emit("commit_kill", how=how, **info)
        if how == "async":
            try:
                call(True)
            finally:
                _die()
        if how == "timer":
            timer = threading.Timer(self.rng.uniform(0.0, 1.5 * self.commit_s), _die)
            timer.daemon = True
            timer.start()
            return
        # A test-only hook on the library's internals: nothing outside can stop a process
        # between two calls it makes within one commit().
        child = getattr(self.consumer, "_child", None)
        original = getattr(child, "commit", None)
        if child is not None and original is not None:

            def commit_then_die(*args: Any, **kwargs: Any) -> Any:
                original(*args, **kwargs)
                _emit("between_commits")
                _die()

            child.commit = commit_then_die
        try:
            call(False)
        finally:
            _die()

    def report_catchup(self) -> None:
        with self.phase("catchup_status()", self.bounds["own"]):
            status = self.consumer.catchup_status()
        active = any(s.child_position is not None for s in status.values())
        if active != self.catchup:
            self.catchup = active
            _emit(
                "catchup",
                active=active,
                pending={str(k[1]): s.records_remaining for k, s in status.items()},
            )

    def write(self, partition: int, offset: int, msg: Any, now_ms: float, stream: str) -> None:
        _, ts = msg.timestamp()
        value = msg.value()
        self.log.write(
            format_line(partition, offset, value.decode() if value else "", now_ms - ts, stream)
        )

    # -- the behaviour
    @abc.abstractmethod
    def loop(self) -> None:
        """Consume, process, commit until asked to stop: what each behaviour is."""

    def stopping(self) -> dict[str, Any]:
        """Finish what is held (the loop is left); what the "stopping" event reports."""
        return {}

    def final_commit(self) -> None:
        # everything handed out is processed and durable: a bare commit is true
        self.consumer.commit(asynchronous=False)

    def run(self) -> int:
        self.consumer.subscribe(
            [self.args.topic],
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_lost=self.on_lost,
        )
        _emit(
            "started",
            pid=os.getpid(),
            log=self.args.log,
            mode=self.mode,
            seed=self.args.seed,
            bounds=self.bounds,
        )
        try:
            self.loop()
            _emit("stopping", **self.stopping())
            self.sync_log()
            _emit("final_commit_begin")
            started = time.monotonic()
            try:
                with self.phase("final commit", self.bounds["commit"]):
                    self.final_commit()
                ok, error = True, None
            except KafkaException as exc:
                ok, error = False, str(exc)
            _emit("final_commit_done", duration=time.monotonic() - started, ok=ok, error=error)
        finally:
            self.log.flush()
            os.fsync(self.log.fileno())
            self.log.close()
            _emit("close_begin")
            started = time.monotonic()
            with self.phase("close()", self.bounds["close"]):
                self.consumer.close()
            _emit(
                "closed",
                duration=time.monotonic() - started,
                processed=self.processed,
                commits=self.commits,
            )
        return 0


class InOrderWorker(Worker):
    """Consume a batch, process all of it, fsync, then commit (bare, synchronous)."""

    mode = "inorder"

    def __init__(self, args: argparse.Namespace, flags: Flags, phase: Phase) -> None:
        super().__init__(args, flags, phase)
        self.pending = 0
        self.last_commit = time.monotonic()

    def process(self, msgs: list[Any]) -> None:
        backlog = self._backlog()
        with self.phase("processing", self.bounds["own"]):
            now_ms = time.time() * 1000
            done = 0
            child_seen = 0
            die_after = -1
            if self.flags.kill_mid_backlog and backlog:
                in_backlog = [i for i, m in enumerate(msgs) if _inside(backlog, m)]
                if in_backlog:
                    die_after = in_backlog[len(in_backlog) // 2]
            for i, m in enumerate(msgs):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        _emit("error", error=str(err))
                    continue
                stream = "b" if backlog and _inside(backlog, m) else "f"
                child_seen += stream == "b"
                self.write(m.partition(), m.offset(), m, now_ms, stream)
                done += 1
                if i == die_after:
                    # processed (in the OS's hands, as a real side effect would be), not
                    # committed
                    self.log.flush()
                    _emit("mid_backlog", processed=child_seen)
                    _die()
            self.work(done)
        self.pending += done
        self.processed += done

    def checkpoint(self) -> None:
        """Make the processed records durable, THEN commit them."""
        self.sync_log()
        had = self.pending
        self.pending = 0
        self.last_commit = time.monotonic()
        self.commit_call(
            lambda asynchronous: self.consumer.commit(asynchronous=asynchronous),
            False,
            may_die=had > 0,  # die in a commit that covers records
            kind="bare",
            records=had,
            processed=self.processed,
        )

    def loop(self) -> None:
        while not self.flags.stop:
            msgs = self.consume()
            if msgs:
                self.process(msgs)
            if self.flags.stop:
                break  # the final commit follows: one call to wait for, not two
            now = time.monotonic()
            since = now - self.last_commit
            if (
                self.pending >= COMMIT_RECORDS
                or (self.pending and since >= COMMIT_INTERVAL_S)
                or since >= IDLE_COMMIT_INTERVAL_S
            ):
                self.checkpoint()
            self.report_catchup()


class Entry:
    """One record the async pipeline was handed."""

    __slots__ = ("at", "durable", "generation", "msg", "offset", "partition", "seq", "stream")

    def __init__(
        self, seq: int, msg: Any, partition: int, offset: int, stream: str, generation: int
    ) -> None:
        self.seq = seq
        self.msg = msg
        self.partition = partition
        self.offset = offset
        self.stream = stream  #: "f" primary, "b" child (seen when it was handed out)
        self.generation = generation  #: which assignment of its partition handed it out
        self.durable = False
        self.at = time.monotonic()

    def __repr__(self) -> str:
        return f"Entry(#{self.seq} {self.partition}/{self.offset} {self.stream})"


class HandedLog:
    """Every record handed to the application, per partition in delivery order, until it
    and every record handed out before it on its partition are durable.

    This is what keeps the async pipeline's commits true: the library attributes
    ``commit(message=m)`` to the stream that delivered ``m`` and claims ``m`` and what
    that stream handed out before it (docs/design.md), and ``commit(offsets=[o + 1])`` as
    the commit of the record at ``o`` if a child handed it out, else to the primary's
    records below ``o + 1``; both are true once every record handed out
    before ``m`` on its partition, whichever stream and assignment delivered it, is
    durable. ``make_durable`` returns, per partition, the latest record for which that
    holds (the *frontier*); a record stays durable, so a frontier stays committable.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.queues: dict[int, deque[Entry]] = {}
        self.undurable = 0

    def hand(self, msg: Any, stream: str, generation: int) -> Entry:
        self.seq += 1
        partition = msg.partition()
        entry = Entry(self.seq, msg, partition, msg.offset(), stream, generation)
        self.queues.setdefault(partition, deque()).append(entry)
        self.undurable += 1
        return entry

    def make_durable(self, entries: Iterable[Entry]) -> dict[int, Entry]:
        """Mark ``entries`` durable (logged and fsynced); the new frontier of every
        partition whose frontier moved."""
        touched = set()
        for e in entries:
            if not e.durable:
                e.durable = True
                self.undurable -= 1
                touched.add(e.partition)
        out = {}
        for p in touched:
            queue = self.queues[p]
            last = None
            while queue and queue[0].durable:
                last = queue.popleft()
            if last is not None:
                out[p] = last
        return out

    def all_durable(self) -> bool:
        return self.undurable == 0


class Batch:
    __slots__ = ("entries", "hold")

    def __init__(self, entries: list[Entry], hold: int) -> None:
        self.entries = entries
        self.hold = hold  #: iterations before it may be processed (unless forced)


class AsyncWorker(Worker):
    """Hold consumed batches, process them out of order, commit late; see the module
    docstring and ``HandedLog`` for why every commit stays true."""

    mode = "async"

    def __init__(self, args: argparse.Namespace, flags: Flags, phase: Phase) -> None:
        super().__init__(args, flags, phase)
        self.handed = HandedLog()
        self.held: list[Batch] = []
        self.unsynced: list[Entry] = []
        self.last_sync = time.monotonic()
        #: commits made true but not made yet: (due, seq, kind, entry)
        self.scheduled: list[tuple[float, int, str, Entry]] = []
        self._scheduled_seq = 0
        self.frontier: dict[int, Entry] = {}  #: committable, not scheduled yet
        self.next_commit_at: dict[int, float] = {}
        self.draining = False
        self.next_drain = time.monotonic() + self.rng.uniform(0.3, 3.0)

    def batch_size(self) -> int:
        return self.rng.choice((20, 100, 500))

    # -- handing out, processing, durability
    def hand(self, msgs: list[Any]) -> None:
        backlog = self._backlog()
        entries = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    _emit("error", error=str(err))
                continue
            stream = "b" if backlog and _inside(backlog, m) else "f"
            entries.append(self.handed.hand(m, stream, self.generation.get(m.partition(), 0)))
        if entries:
            hold = self.rng.randint(3, 20) if self.rng.random() < 0.15 else 0
            self.held.append(Batch(entries, hold))

    def process(self, entries: list[Entry]) -> None:
        with self.phase("processing", self.bounds["own"]):
            now_ms = time.time() * 1000
            die_after = -1
            if self.flags.kill_mid_backlog:
                in_backlog = [i for i, e in enumerate(entries) if e.stream == "b"]
                if in_backlog:
                    die_after = in_backlog[len(in_backlog) // 2]
            for i, e in enumerate(entries):
                self.write(e.partition, e.offset, e.msg, now_ms, e.stream)
                if i == die_after:
                    self.log.flush()
                    _emit("mid_backlog", processed=sum(x.stream == "b" for x in entries[: i + 1]))
                    _die()
            self.work(len(entries))
        self.unsynced.extend(entries)
        self.processed += len(entries)

    def process_one(self, batch: Batch) -> None:
        """Process a held batch, in one of several orders, sometimes only part of it."""
        self.held.remove(batch)
        entries = batch.entries
        r = self.rng.random()
        if r < 0.2 and len(entries) > 1:  # half now, the rest stays held
            entries = list(entries)
            self.rng.shuffle(entries)
            half = len(entries) // 2
            self.held.append(Batch(entries[half:], self.rng.randint(0, 5)))
            entries = entries[:half]
        elif r < 0.35:
            entries = entries[::-1]
        self.process(entries)

    def sync(self) -> None:
        if not self.unsynced:
            return
        self.sync_log()
        self.frontier.update(self.handed.make_durable(self.unsynced))
        self.unsynced = []
        self.last_sync = time.monotonic()

    # -- commits
    def schedule_commits(self, now: float) -> None:
        for p, e in list(self.frontier.items()):
            if now < self.next_commit_at.get(p, 0.0):
                continue
            del self.frontier[p]
            self.next_commit_at[p] = now + self.rng.uniform(0.05, 0.4)
            r = self.rng.random()
            if r < 0.45:
                delay = self.rng.uniform(0.0, 0.5)
            elif r < 0.75:
                delay = self.rng.uniform(0.5, 4.0)
            else:  # across a rebalance or two
                delay = self.rng.uniform(4.0, 30.0)
            k = self.rng.random()
            if k < 0.15:
                kind = "offsets"
            elif k < 0.5:
                kind = "message_sync"
            else:
                kind = "message_async"
            self._scheduled_seq += 1
            heapq.heappush(self.scheduled, (now + delay, self._scheduled_seq, kind, e))

    def commit_due(self, now: float, most: int = 20) -> None:
        """Make the commits that are due: at most one synchronous one per iteration (during
        a rebalance each can wait seconds, and consume() must keep being called)."""
        synchronous = 0
        later = []
        while self.scheduled and self.scheduled[0][0] <= now and most > 0:
            if self.flags.stop:
                break  # SIGTERM: straight to the final commit
            item = heapq.heappop(self.scheduled)
            if item[2] != "message_async":
                if synchronous:
                    later.append(item)
                    continue
                synchronous += 1
            most -= 1
            self.commit_entry(item[2], item[3])
        for item in later:
            heapq.heappush(self.scheduled, item)

    def commit_entry(self, kind: str, e: Entry) -> None:
        p = e.partition
        if p not in self.assigned:
            when = "revoked"  # left this member (revoked or lost) since it was handed out
        elif self.generation.get(p) != e.generation:
            when = "reassigned"  # a later assignment of the partition
        else:
            when = "current"
        if kind == "offsets":
            asynchronous = self.rng.random() < 0.5
            tp = TopicPartition(e.msg.topic(), p, e.offset + 1)

            def call(a: bool) -> Any:
                return self.consumer.commit(offsets=[tp], asynchronous=a)

        else:
            asynchronous = kind == "message_async"
            msg = e.msg

            def call(a: bool) -> Any:
                return self.consumer.commit(message=msg, asynchronous=a)

        self.commit_call(
            call, asynchronous, kind=kind, partition=p, offset=e.offset, stream=e.stream,
            when=when, age=round(time.monotonic() - e.at, 3),
        )  # fmt: skip

    def bare_commit(self) -> None:
        """Only when everything handed out is processed and durable."""
        assert not self.held and not self.unsynced and self.handed.all_durable()
        if not self.assigned:
            return  # nothing handed out is ours to commit: it would fail with _NO_OFFSET
        self.commit_call(
            lambda a: self.consumer.commit(asynchronous=a),
            self.rng.random() < 0.3,
            kind="bare",
            processed=self.processed,
        )

    # -- the loop
    def loop(self) -> None:
        while not self.flags.stop:
            if not self.draining:
                msgs = self.consume()
                if msgs:
                    self.hand(msgs)
            for b in self.held:
                b.hold -= 1
            if self.draining:
                while self.held:
                    self.process_one(self.rng.choice(self.held))
            else:
                ready = [b for b in self.held if b.hold <= 0]
                if ready:
                    self.process_one(self.rng.choice(ready))
                while len(self.held) > MAX_HELD:
                    self.process_one(min(self.held, key=lambda b: b.entries[0].seq))
            now = time.monotonic()
            if self.unsynced and (
                self.draining
                or len(self.unsynced) >= COMMIT_RECORDS
                or now - self.last_sync >= COMMIT_INTERVAL_S
            ):
                self.sync()
            self.schedule_commits(now)
            self.commit_due(now)
            if self.flags.stop:
                break
            if self.draining:
                self.bare_commit()
                self.draining = False
                self.next_drain = time.monotonic() + self.rng.uniform(0.3, 3.0)
            elif now >= self.next_drain:
                self.draining = True  # stop consuming, drain, then a bare commit
            self.report_catchup()

    def stopping(self) -> dict[str, Any]:
        held = sum(len(b.entries) for b in self.held)
        while self.held:
            self.process_one(self.rng.choice(self.held))
        self.sync()
        return {"held": held, "dropped_commits": len(self.scheduled)}


class EOSWorker(Worker):
    """Read-process-write, exactly once: each consumed batch is one producer transaction
    holding one output record per input record (its value) and both commit logs
    (``send_offsets_to_transaction``); the log line, fsynced before the commit, is for the
    harness's at-least-once and latency checks, the output topic for the exactly-once one.

    SIGUSR1 kills it during the commit (right after the offsets are sent, between sending
    them and committing, or a random moment into the commit), SIGUSR2 halfway through
    producing a batch holding backlog records (mid-transaction)."""

    mode = "eos"

    def __init__(self, args: argparse.Namespace, flags: Flags, phase: Phase) -> None:
        super().__init__(args, flags, phase)
        self.producer = self._new_producer()

    def _new_producer(self) -> Producer:
        """A transactional producer, initialised as an application must: an error of
        ``init_transactions()`` while the broker restarts (NOT_COORDINATOR, a timeout) or
        still ends the previous producer's transaction (CONCURRENT_TRANSACTIONS, for up to
        transaction.timeout.ms) is retried for INIT_BUDGET_S, on the same producer if
        librdkafka calls it retriable, on a new one if not; then the worker dies for the
        harness to see. The producer, like the consumer, is owned by this (the main) thread."""
        config = {
            "bootstrap.servers": self.args.bootstrap,
            "transactional.id": self.args.transactional_id,
            # a transaction of a worker killed for good blocks read_committed readers of
            # its partitions until it times out
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": 5,
            # librdkafka: at most transaction.timeout.ms + 100
            "socket.timeout.ms": min(self.args.socket_timeout_ms, TRANSACTION_TIMEOUT_MS),
        }
        producer = Producer(config)
        deadline = time.monotonic() + INIT_BUDGET_S
        while True:
            try:
                with self.phase("init_transactions()", self.bounds["commit"]):
                    producer.init_transactions(self.bounds["commit"])
                return producer
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise
                _emit("retry", call="init_transactions", error=str(exc))
                if not exc.args[0].retriable():
                    time.sleep(0.5)
                    producer = Producer(config)

    def extra_config(self) -> dict[str, Any]:
        return {"parallel.rebalance.transactional": True, "isolation.level": "read_committed"}

    def process(self, msgs: list[Any]) -> None:
        good = [m for m in msgs if m.error() is None]
        for m in msgs:
            err = m.error()
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                _emit("error", error=str(err))
        if not good:
            return
        backlog = self._backlog()
        die_after = -1
        if self.flags.kill_mid_backlog and backlog:
            inside = [i for i, m in enumerate(good) if _inside(backlog, m)]
            if inside:
                die_after = inside[len(inside) // 2]
        with self.phase("transaction", self.bounds["commit"]):
            self.producer.begin_transaction()
        now_ms = time.time() * 1000
        with self.phase("processing", self.bounds["own"]):
            for i, m in enumerate(good):
                self.producer.produce(
                    self.args.output_topic, value=m.value(), partition=m.partition()
                )
                stream = "b" if backlog and _inside(backlog, m) else "f"
                self.write(m.partition(), m.offset(), m, now_ms, stream)
                if i == die_after:
                    self.log.flush()
                    _emit("mid_backlog", processed=i + 1)
                    _die()
            self.producer.poll(0)
            self.work(len(good))
        self.sync_log()
        self.processed += len(good)
        self.commit_transaction(good)

    def commit_transaction(self, batch: list[Any]) -> None:
        how = None
        if self.flags.kill_in_commit:
            how = self.rng.choice(("sent", "before_commit", "timer"))
            _emit("commit_kill", how=how, records=len(batch))
        started = time.monotonic()
        try:
            with self.phase("send_offsets_to_transaction()", self.bounds["commit"]):
                self.consumer.send_offsets_to_transaction(
                    self.producer, batch, timeout=self.bounds["commit"]
                )
            if how == "sent":
                _die()
            if how == "before_commit":
                self.producer.flush(self.bounds["commit"])
                _die()
            if how == "timer":
                timer = threading.Timer(self.rng.uniform(0.0, 1.5 * self.commit_s), _die)
                timer.daemon = True
                timer.start()
            self._commit_with_retries()
        except KafkaException as exc:
            _emit("commit_failed", error=str(exc), took=round(time.monotonic() - started, 3))
            self._abort(fatal=exc.args[0].fatal())
            _emit("aborted", records=len(batch))
            return
        took = round(time.monotonic() - started, 3)
        self.commit_s = 0.9 * self.commit_s + 0.1 * took
        self.commits += 1
        _emit("commit", asynchronous=False, took=took, kind="transaction", records=len(batch))

    def _abort(self, fatal: bool) -> None:
        """Abort as librdkafka's transaction guide says: an abort that timed out is called
        again (it resumes); a producer that failed fatally (fenced: the coordinator aborted
        the transaction on its timeout while the broker restarted and bumped the epoch)
        cannot abort and is replaced by a new one with the same transactional.id. Either
        way ``Consumer.abort_transaction`` has rewound the consumer to what was committed,
        even when the producer's abort raised."""
        for attempt in range(ATTEMPTS):
            if attempt and self.flags.stop:
                # shutting down: the broker aborts the transaction when it times out, or
                # when the next worker with this transactional.id starts (retrying here
                # would break the shutdown's bound: 4 x 60 s seen in the eos soak)
                return
            try:
                with self.phase("abort_transaction()", self.bounds["commit"]):
                    self.consumer.abort_transaction(self.producer, self.bounds["commit"])
                if not fatal:
                    return
                break
            except KafkaException as exc:
                err = exc.args[0]
                _emit("retry", call="abort_transaction", error=str(exc))
                if err.fatal():
                    break
                if attempt == ATTEMPTS - 1 or not err.retriable():
                    raise
        # nothing of the old producer's can be flushed or aborted any more: its open
        # transaction is aborted by the broker when the new one initialises
        _emit("producer_replaced")
        self.producer = self._new_producer()

    def _commit_with_retries(self) -> None:
        """A retriable failure of the commit is retried (the transaction is still open);
        one that requires an abort, or anything else, is raised for the caller to abort
        (a fatal one then fails the abort too, and the worker dies for the harness to see)."""
        for attempt in range(5):
            try:
                with self.phase("commit_transaction()", self.bounds["commit"]):
                    self.consumer.commit_transaction(self.producer, self.bounds["commit"])
                return
            except KafkaException as exc:
                err = exc.args[0]
                if attempt == 4 or not err.retriable() or err.txn_requires_abort():
                    raise

    def loop(self) -> None:
        while not self.flags.stop:
            msgs = self.consume()
            if msgs:
                self.process(msgs)
            self.report_catchup()

    def final_commit(self) -> None:
        """Nothing is open: every batch was committed or aborted in its own iteration."""


def bounds(args: argparse.Namespace) -> dict[str, float]:
    return documented_bounds(args.socket_timeout_ms / 1000.0, CONSUME_TIMEOUT_S)


def _inside(backlog: dict[int, list[tuple[int, int]]], m: Any) -> bool:
    ranges = backlog.get(m.partition())
    if not ranges:
        return False
    o = m.offset()
    i = bisect.bisect_right(ranges, (o, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= o < ranges[i][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--log", required=True, help="append processed records here")
    parser.add_argument("--mode", choices=ALL_WORKER_MODES, default="inorder")
    parser.add_argument("--output-topic", help="eos: where the output records go")
    parser.add_argument("--transactional-id", help="eos: the producer's transactional.id")
    parser.add_argument("--seed", type=int, help="seeds the worker's own random choices")
    parser.add_argument("--threshold", type=int, default=20)
    parser.add_argument(
        "--protocol", choices=("classic", "cooperative", "consumer"), default="cooperative"
    )
    parser.add_argument("--work-us", type=int, default=0, help="simulated work per record (µs)")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--max-poll-interval-ms", type=int, default=300000)
    parser.add_argument("--socket-timeout-ms", type=int, default=60000)
    parser.add_argument(
        "--hang",
        action="append",
        default=[],
        metavar="STEP=SECONDS",
        help="(tests of the harness) sleep this long at the start of STEP, e.g. 'close()=60'",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    flags = Flags()

    def on_term(_signum: int, _frame: Any) -> None:
        flags.stop = True

    def on_usr1(_signum: int, _frame: Any) -> None:
        flags.kill_in_commit = True

    def on_usr2(_signum: int, _frame: Any) -> None:
        flags.kill_mid_backlog = True

    # The watchdog first: every signal with a Python handler installed below then wakes it.
    hangs = {step: float(s) for step, _, s in (h.rpartition("=") for h in args.hang)}
    phase = Phase(bounds(args)["own"], hangs)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(
        target=_watch_for_sigterm, args=(read_fd, phase), name="sigterm-watch", daemon=True
    ).start()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGUSR2, on_usr2)
    # every thread's stack to stderr, even with the GIL held: what the harness asks for
    # before it SIGKILLs a worker that does not exit
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    kinds: dict[str, type[Worker]] = {
        "inorder": InOrderWorker,
        "async": AsyncWorker,
        "eos": EOSWorker,
    }
    if args.mode == "eos" and not (args.output_topic and args.transactional_id):
        parser.error("--mode eos needs --output-topic and --transactional-id")
    worker = kinds[args.mode](args, flags, phase)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
