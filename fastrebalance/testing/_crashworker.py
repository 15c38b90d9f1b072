"""A consumer worker for the chaos harness: process (log) records, fsync, then commit.

Run as::

    python -m fastrebalance.testing._crashworker --bootstrap B --topic T --group G --log PATH \
        [--threshold N] [--protocol classic|cooperative|consumer] [--work-us N] \
        [--session-timeout-ms MS] [--max-poll-interval-ms MS]

It is a ``fastrebalance.Consumer`` with ``enable.parallel.rebalance=true`` and manual commits.
Every record ``consume()`` returns is *processed* by appending one line to the log file
(``fastrebalance.testing._chaos.format_line``: partition, offset, value, produce-to-processing
latency, and which stream delivered it); every ~50 ms (or 2000 records) the log is flushed
and fsynced and only THEN ``commit()`` is called. That ordering is the at-least-once contract
the harness checks: a committed offset may only cover records already durable in some log.

Signals (the harness sends them; see ``_chaos.FaultInjector``):

* SIGKILL at any moment, SIGSTOP/SIGCONT: the harness alone.
* SIGTERM / SIGINT: a clean close (commit, leave the group).
* SIGUSR1: SIGKILL yourself while the next commit is in flight: a timer thread fires a
  random fraction of a typical commit's duration after the commit call starts, so the kill
  lands between the child's checkpoint and the group commit, or during either.
* SIGUSR2: SIGKILL yourself halfway through the next batch holding backlog records: some
  of the child's records processed (logged), none committed: the child is mid-range.
* SIGQUIT: dump every thread's stack to stderr (the harness sends it to a worker whose
  close() does not return, before it SIGKILLs it).

Only this process can see those moments precisely; a signal from outside would arrive
milliseconds too late. Progress events go to stdout as JSON lines (``{"ev": ..., "t": ...}``).
"""

from __future__ import annotations

import argparse
import bisect
import faulthandler
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import Consumer
from fastrebalance.testing._chaos import format_line

#: Flush + fsync + commit when this much time has passed with records pending...
COMMIT_INTERVAL_S = 0.05
#: ... or this many records are pending ...
COMMIT_RECORDS = 2000
#: ... and at least this often even with nothing new (a failed commit is retried).
IDLE_COMMIT_INTERVAL_S = 1.0


def _emit(event: str, **fields: Any) -> None:
    fields["ev"] = event
    fields["t"] = time.time()
    try:
        sys.stdout.write(json.dumps(fields) + "\n")
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


class Worker:
    def __init__(self, args: argparse.Namespace, flags: Flags) -> None:
        self.args = args
        self.flags = flags
        self.consumer = Consumer(
            build_config(
                args.bootstrap,
                args.group,
                args.threshold,
                args.protocol,
                f"crashworker-{os.getpid()}",
                args.session_timeout_ms,
                args.max_poll_interval_ms,
            )
        )
        self.log = open(args.log, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        self.rng = random.Random(os.getpid() ^ int(time.time() * 1000))
        self.pending = 0
        self.processed = 0
        self.commits = 0
        self.commit_s = 0.002  # running mean of a commit's duration
        self.last_commit = time.monotonic()
        self.catchup = False

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("assigned", partitions=_parts(partitions))

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("revoked", partitions=_parts(partitions))

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("lost", partitions=_parts(partitions))

    def _backlog(self) -> dict[int, list[tuple[int, int]]]:
        """Pending backlog ranges per partition: a record inside one came from the child
        (the primary reads only from the log end at assignment on)."""
        return {k[1]: list(s.pending_ranges) for k, s in self.consumer.catchup_status().items()}

    def process(self, msgs: list[Any]) -> None:
        write = self.log.write
        backlog = self._backlog()
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
            _, ts = m.timestamp()
            value = m.value()
            write(
                format_line(
                    m.partition(), m.offset(), value.decode() if value else "", now_ms - ts, stream
                )
            )
            done += 1
            if i == die_after:
                # processed (in the OS's hands, as a real side effect would be), not committed
                self.log.flush()
                _emit("mid_backlog", processed=child_seen)
                _die()
        if done and self.args.work_us:
            time.sleep(done * self.args.work_us / 1e6)  # simulated work, without burning a core
        self.pending += done
        self.processed += done

    def checkpoint(self) -> None:
        """Make the processed records durable, THEN commit them."""
        self.log.flush()
        os.fsync(self.log.fileno())
        had = self.pending
        self.pending = 0
        self.last_commit = time.monotonic()
        if self.flags.kill_in_commit and had:
            self._commit_and_die(had)
        started = time.monotonic()
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            _emit("commit_failed", error=str(exc), records=had)
            return
        self.commit_s = 0.9 * self.commit_s + 0.1 * (time.monotonic() - started)
        self.commits += 1
        _emit("commit", records=had, processed=self.processed)

    def _commit_and_die(self, had: int) -> None:
        """SIGKILL this process while a commit is in flight, one of three ways:

        * ``async``: an asynchronous commit, then SIGKILL at once: the OffsetCommit requests
          are queued or on the wire, and the broker may or may not apply them;
        * ``between``: after the child's checkpoint commit returned, before the group commit
          (the two commit logs then disagree, the case the restart merge exists for); when
          this commit carries no checkpoint, right after the group commit instead;
        * ``timer``: a synchronous commit, with a timer firing a random fraction of a typical
          commit's duration into it.
        """
        mode = self.rng.choice(("async", "between", "timer"))
        _emit("commit_kill", mode=mode, records=had)
        if mode == "async":
            try:
                self.consumer.commit(asynchronous=True)
            finally:
                _die()
        if mode == "timer":
            threading.Timer(self.rng.uniform(0.0, 1.5 * self.commit_s), _die).start()
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
            self.consumer.commit(asynchronous=False)
        finally:
            _die()

    def report_catchup(self) -> None:
        status = self.consumer.catchup_status()
        active = any(s.child_position is not None for s in status.values())
        if active != self.catchup:
            self.catchup = active
            _emit(
                "catchup",
                active=active,
                pending={str(k[1]): s.records_remaining for k, s in status.items()},
            )

    def run(self) -> int:
        self.consumer.subscribe(
            [self.args.topic],
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_lost=self.on_lost,
        )
        _emit("started", pid=os.getpid(), log=self.args.log)
        try:
            while not self.flags.stop:
                msgs = self.consumer.consume(500, 0.1)
                if msgs:
                    self.process(msgs)
                now = time.monotonic()
                since = now - self.last_commit
                if (
                    self.pending >= COMMIT_RECORDS
                    or (self.pending and since >= COMMIT_INTERVAL_S)
                    or since >= IDLE_COMMIT_INTERVAL_S
                ):
                    self.checkpoint()
                self.report_catchup()
            self.checkpoint()
        finally:
            self.log.flush()
            os.fsync(self.log.fileno())
            self.log.close()
            self.consumer.close()
        _emit("closed", processed=self.processed, commits=self.commits)
        return 0


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
    parser.add_argument("--threshold", type=int, default=20)
    parser.add_argument(
        "--protocol", choices=("classic", "cooperative", "consumer"), default="cooperative"
    )
    parser.add_argument("--work-us", type=int, default=0, help="simulated work per record (µs)")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--max-poll-interval-ms", type=int, default=300000)
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

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGUSR2, on_usr2)
    # every thread's stack to stderr, even with the GIL held: what the harness asks for
    # before it SIGKILLs a worker whose close() does not return
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    return Worker(args, flags).run()


if __name__ == "__main__":
    sys.exit(main())
