"""A consumer worker for crash tests: process (log) records, fsync, then commit.

Run as::

    python -m fastrebalance.testing._crashworker --bootstrap B --topic T --group G --log PATH \
        [--threshold N] [--protocol classic|cooperative|consumer] [--work-us N]

It is a ``fastrebalance.Consumer`` with ``enable.parallel.rebalance=true`` and manual commits.
Every record ``consume()`` returns is *processed* by appending ``"partition offset value\\n"``
to the log file; every ~50 ms (or 2000 records) the log is flushed and fsynced and only THEN
``commit()`` is called. That ordering is the at-least-once contract the crash tests check:
a committed offset may only cover records already durable in some worker's log.

The test SIGKILLs these processes at arbitrary moments; SIGTERM asks for a clean close.
Progress events are written to stdout as JSON lines (``{"ev": ..., "t": ...}``) so a test can
time its kills (right after a commit, while a catch-up is running, ...).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import Consumer

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
    except (BrokenPipeError, ValueError):  # the test stopped reading us: keep working
        pass


def build_config(
    bootstrap: str, group: str, threshold: int, protocol: str, client_id: str
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
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf["session.timeout.ms"] = 6000
        conf["heartbeat.interval.ms"] = 1000
        conf["partition.assignment.strategy"] = (
            "cooperative-sticky" if protocol == "cooperative" else "range"
        )
    return conf


def _parts(partitions: list[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = False
        self.consumer = Consumer(
            build_config(
                args.bootstrap,
                args.group,
                args.threshold,
                args.protocol,
                f"crashworker-{os.getpid()}",
            )
        )
        self.log = open(args.log, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        self.pending = 0
        self.processed = 0
        self.commits = 0
        self.last_commit = time.monotonic()
        self.catchup = False

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("assigned", partitions=_parts(partitions))

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("revoked", partitions=_parts(partitions))

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        _emit("lost", partitions=_parts(partitions))

    def process(self, msgs: list[Any]) -> None:
        write = self.log.write
        done = 0
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    _emit("error", error=str(err))
                continue
            value = m.value()
            write(f"{m.partition()} {m.offset()} {value.decode() if value else ''}\n")
            done += 1
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
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            _emit("commit_failed", error=str(exc), records=had)
            return
        self.commits += 1
        _emit("commit", records=had, processed=self.processed)

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
            [self.args.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
            on_lost=self.on_lost,
        )  # fmt: skip
        _emit("started", pid=os.getpid(), log=self.args.log)
        try:
            while not self.stop:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--log", required=True, help="append 'partition offset value' lines here")
    parser.add_argument("--threshold", type=int, default=20)
    parser.add_argument(
        "--protocol", choices=("classic", "cooperative", "consumer"), default="cooperative"
    )
    parser.add_argument("--work-us", type=int, default=0, help="simulated work per record (µs)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    worker = Worker(args)

    def on_term(_signum: int, _frame: Any) -> None:
        worker.stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
