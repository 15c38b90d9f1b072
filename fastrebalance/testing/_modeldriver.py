"""A consumer under remote control, for the stateful model-based test (test_model.py).

Run as::

    python -m fastrebalance.testing._modeldriver --topic T --config JSON [--log-level L]

It owns one ``fastrebalance.Consumer`` and executes commands read from stdin, one JSON object
per line, answering each with one JSON line on stdout. The test runs the consumer in its own
process so that a crash is a real crash: SIGKILL, no commit, no leave-group. A second member of
the group is a second driver process.

Every record a ``poll()``/``consume()`` returns is kept here under a *handle* (an integer), so
the test can later say "commit(message=handle 17)" or "store_offsets(message=handle 17)" on the
very ``Message`` object the application received. Records are reported as
``[handle, partition, offset, value]`` in delivery order.

Commands (``op`` plus fields; every answer has ``ok``, and ``error``/``code`` when not ok,
plus ``events`` (rebalance callbacks since the last answer: ``[kind, [partitions]]``) and
``catchup`` (``{partition: [[start, end], ...]}``, the pending ranges ``catchup_status()``
shows for every partition in it, or ``null`` when it is unavailable)):

* ``assign`` / ``incremental_assign`` ``partitions``: partitions without an offset (the
  committed offset applies, so the catch-up plan runs);
* ``unassign``; ``incremental_unassign`` ``partitions``;
* ``subscribe``: subscribe to the topic with on_assign/on_revoke/on_lost callbacks that only
  record events (the library applies its own plan);
* ``consume`` ``max``, ``batch`` (0: use ``poll()``, else ``consume(batch)``), ``call_timeout``,
  ``idle``, ``cap``: call until ``max`` records, or no record for ``idle`` seconds, or ``cap``
  seconds in all; answers ``records``;
* ``commit`` with ``handle`` (commit(message=)), ``offsets`` (``[[partition, offset], ...]``:
  commit(offsets=)) or neither (bare commit()), and ``async``; answers ``result`` (the
  synchronous commit's ``[[partition, offset, error-or-null], ...]``);
* ``store`` with ``handle`` or ``offsets``: store_offsets();
* ``pause`` / ``resume`` ``partitions``;
* ``seek`` ``partition``, ``offset``, ``force``: answers ``before``, the primary's position()
  before the seek (after a seek librdkafka answers -1001 until the next record: the last seek's
  target is answered then; -1001 when nothing was read in this assignment). When that is
  unknown the seek is not made (``ok`` false) unless ``force`` is set;
* ``position`` ``partitions``; ``status`` (assignment and catch-up only);
* ``close``: close() the consumer, answer, exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance import Consumer


class Driver:
    def __init__(self, topic: str, config: dict[str, Any]) -> None:
        self.topic = topic
        self.consumer = Consumer(config)
        self.messages: dict[int, Any] = {}
        self.next_handle = 1
        self.events: list[list[Any]] = []
        # where the last seek() sent the primary, per partition, while position() says -1001
        self.sought: dict[int, int] = {}

    # ------------------------------------------------------------ callbacks
    def _event(self, kind: str) -> Any:
        def cb(_consumer: Any, partitions: list[TopicPartition]) -> None:
            self.events.append([kind, sorted(tp.partition for tp in partitions)])
            for tp in partitions:
                self.sought.pop(tp.partition, None)

        return cb

    # -------------------------------------------------------------- helpers
    def _tps(self, partitions: list[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in partitions]

    def _offsets(self, pairs: list[list[int]]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p, o) for p, o in pairs]

    def catchup(self) -> dict[str, list[list[int]]] | None:
        status = getattr(self.consumer, "catchup_status", None)
        if status is None:
            return None
        try:
            got = status()
        except Exception:  # the library is being rewritten: no catch-up view is no answer
            return None
        out: dict[str, list[list[int]]] = {}
        for key, st in got.items():
            if key[0] == self.topic:
                out[str(key[1])] = [list(r) for r in getattr(st, "pending_ranges", ())]
        return out

    def assignment(self) -> list[int]:
        return sorted(tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic)

    # ------------------------------------------------------------- commands
    def op_assign(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.sought.clear()
        self.consumer.assign(self._tps(cmd["partitions"]))
        return {}

    def op_incremental_assign(self, cmd: dict[str, Any]) -> dict[str, Any]:
        for p in cmd["partitions"]:
            self.sought.pop(p, None)
        self.consumer.incremental_assign(self._tps(cmd["partitions"]))
        return {}

    def op_unassign(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.sought.clear()
        self.consumer.unassign()
        return {}

    def op_incremental_unassign(self, cmd: dict[str, Any]) -> dict[str, Any]:
        for p in cmd["partitions"]:
            self.sought.pop(p, None)
        self.consumer.incremental_unassign(self._tps(cmd["partitions"]))
        return {}

    def op_subscribe(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.consumer.subscribe(
            [self.topic],
            on_assign=self._event("assign"),
            on_revoke=self._event("revoke"),
            on_lost=self._event("lost"),
        )
        return {}

    def op_consume(self, cmd: dict[str, Any]) -> dict[str, Any]:
        want = int(cmd.get("max", 100))
        idle = float(cmd.get("idle", 0.3))
        cap = float(cmd.get("cap", 2.0))
        batch = int(cmd.get("batch", 100))
        call_timeout = float(cmd.get("call_timeout", 0.05))
        records: list[list[Any]] = []
        errors: list[str] = []
        start = last = time.monotonic()
        while len(records) < want:
            if batch > 0:
                got = self.consumer.consume(min(batch, want - len(records)), call_timeout)
            else:
                m = self.consumer.poll(call_timeout)
                got = [] if m is None else [m]
            now = time.monotonic()
            for m in got:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors.append(str(err))
                    continue
                last = now
                h = self.next_handle
                self.next_handle += 1
                self.messages[h] = m
                value = m.value()
                records.append(
                    [h, m.partition(), m.offset(), value.decode() if value is not None else None]
                )
            if now - last >= idle or now - start >= cap:
                break
        return {"records": records, "errors": errors}

    def op_commit(self, cmd: dict[str, Any]) -> dict[str, Any]:
        asynchronous = bool(cmd.get("async", False))
        if cmd.get("handle") is not None:
            got = self.consumer.commit(
                message=self.messages[cmd["handle"]], asynchronous=asynchronous
            )
        elif cmd.get("offsets") is not None:
            got = self.consumer.commit(
                offsets=self._offsets(cmd["offsets"]), asynchronous=asynchronous
            )
        else:
            got = self.consumer.commit(asynchronous=asynchronous)
        result = None
        if got is not None:
            result = [
                [tp.partition, tp.offset, None if tp.error is None else str(tp.error)] for tp in got
            ]
        return {"result": result}

    def op_store(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd.get("handle") is not None:
            self.consumer.store_offsets(message=self.messages[cmd["handle"]])
        else:
            self.consumer.store_offsets(offsets=self._offsets(cmd["offsets"]))
        return {}

    def op_pause(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.consumer.pause(self._tps(cmd["partitions"]))
        return {}

    def op_resume(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.consumer.resume(self._tps(cmd["partitions"]))
        return {}

    def _position(self, partition: int) -> int:
        (tp,) = self.consumer.position([TopicPartition(self.topic, partition)])
        return int(tp.offset)

    def op_seek(self, cmd: dict[str, Any]) -> dict[str, Any]:
        p, target = int(cmd["partition"]), int(cmd["offset"])
        before = self._position(p)
        if before < 0:
            # librdkafka answers -1001 after a seek until the next record: the primary then
            # stands where it was sent
            before = self.sought.get(p, before)
        if before < 0 and not cmd.get("force"):
            return {"ok": False, "error": f"position unknown ({before}): no seek", "before": before}
        self.consumer.seek(TopicPartition(self.topic, p, target))
        self.sought[p] = target
        return {"before": before}

    def op_position(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"positions": {str(p): self._position(p) for p in cmd["partitions"]}}

    def op_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {}

    def op_close(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.consumer.close()
        return {"closed": True}

    # ----------------------------------------------------------------- loop
    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        fn = getattr(self, "op_" + str(cmd.get("op")), None)
        if fn is None:
            return {"ok": False, "error": f"unknown op {cmd.get('op')!r}"}
        try:
            answer: dict[str, Any] = {"ok": True}
            answer.update(fn(cmd))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            answer = {"ok": False, "error": str(exc), "code": code}
        except Exception as exc:  # reported to the test, which decides
            answer = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        if cmd.get("op") != "close":
            try:
                answer["assignment"] = self.assignment()
            except Exception:
                answer["assignment"] = None
            answer["catchup"] = self.catchup()
        answer["events"], self.events = self.events, []
        return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--config", required=True, help="the Consumer config as JSON")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.WARNING),
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    out = sys.stdout
    try:
        driver = Driver(args.topic, json.loads(args.config))
    except Exception as exc:
        out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ok": True, "ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        answer = driver.handle(cmd)
        answer["id"] = cmd.get("id")
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if cmd.get("op") == "close" and answer.get("ok"):
            return 0
    # stdin closed: the test is gone. Leave like a crash would (no commit, no close).
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
