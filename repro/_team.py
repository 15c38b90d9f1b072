"""Member threads for the multi-member repro scripts: each thread owns its Consumer."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from fastrebalance import Consumer


class Ledger:
    """What every member processed (offsets per (topic, partition)) and how often."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[tuple[str, int, int]] = Counter()

    def add(self, msgs: list[Any]) -> None:
        with self.lock:
            for m in msgs:
                self.count[(m.topic(), m.partition(), m.offset())] += 1

    def processed(self, topic: str, partition: int) -> set[int]:
        with self.lock:
            return {o for (t, p, o) in self.count if t == topic and p == partition}

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.count.values() if n > 1)


class Member(threading.Thread):
    """poll/consume loop; ``step(consumer, msgs, member)`` processes and commits."""

    def __init__(self, name: str, conf: dict[str, Any], topics: list[str], ledger: Ledger,
                 step: Callable[[Consumer, list[Any], Member], None], batch: int = 200) -> None:
        super().__init__(daemon=True, name=name)
        self.conf, self.topics, self.ledger, self.step = conf, topics, ledger, step
        self.batch = batch
        self.halt = threading.Event()
        self.consumer: Consumer | None = None
        self.error: BaseException | None = None
        self.ticks = 0
        self.close_at_end = True

    def run(self) -> None:
        try:
            c = self.consumer = Consumer(self.conf)
            c.subscribe(self.topics)
            while not self.halt.is_set():
                msgs = [m for m in c.consume(self.batch, 0.1) if m.error() is None]
                self.ticks += 1
                self.step(c, msgs, self)
            if self.close_at_end:
                c.close()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
            raise


def wait(what: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.2)
    return what()
