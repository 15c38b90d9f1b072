"""Manual assignment with group-wide catch-up: member A assign()s partition 0 (planned: its
backlog offered in chunks), B assign()s partition 1 (same group.id: B helps with 0's
chunks and A with 1's). While chunks are held, A seek()s partition 0 back to 500 (into
the backlog), later incremental_assign()s partition 2 too. Commits by message per batch.
Everything processed, offsets at the end, never past an unprocessed record?

Usage: BOOTSTRAP=... python repro/r15_assign_seek.py
"""
from __future__ import annotations

import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, wait
from confluent_kafka import TopicPartition

from fastrebalance import Consumer

BACKLOG, CHUNK, PARTS = 12000, 1000, 3
topic, group = name("r15"), name("g15")
create_topic(topic, PARTS)
commit_zero(group, topic, PARTS)
for q in range(PARTS):
    produce(topic, BACKLOG, q)
ledger, lock = Ledger(), threading.Lock()
processed = [set() for _ in range(PARTS)]
halt = threading.Event()
conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False})
events = []


def run(name_: str, first: int) -> None:
    c = Consumer(conf)
    c.assign([TopicPartition(topic, first)])
    n = 0
    while not halt.is_set():
        msgs = [m for m in c.consume(100, 0.1) if m.error() is None]
        time.sleep(0.0003 * len(msgs))
        ledger.add(msgs)
        with lock:
            for m in msgs:
                processed[m.partition()].add(m.offset())
        last = {}
        for m in msgs:
            last[(m.topic(), m.partition())] = m
        for m in last.values():
            c.commit(message=m, asynchronous=False)
        n += 1
        if name_ == "A" and n == 20:
            c.seek(TopicPartition(topic, 0, 500))
            events.append(f"A seek(0, 500) with {len(c._group._held)} chunks held")
        if name_ == "A" and n == 40:
            c.incremental_assign([TopicPartition(topic, 2)])
            events.append("A incremental_assign(2)")
    c.close()


threads = [threading.Thread(target=run, args=a, daemon=True) for a in (("A", 0), ("B", 1))]
sampler = Sampler(group, topic, PARTS, processed, lock, [BACKLOG] * PARTS)
t0 = time.monotonic()
for t in threads:
    t.start()
sampler.start()
ok = wait(lambda: all(x >= BACKLOG for x in sampler.last), 90)
halt.set()
for t in threads:
    t.join(30)
sampler.stop()
missing = [BACKLOG - len(ledger.processed(topic, q)) for q in range(PARTS)]
print(f"{events}; at end={ok} after {time.monotonic() - t0:.0f}s; offsets "
      f"{group_offsets(group, topic, PARTS)}; missing {missing}; duplicates "
      f"{ledger.duplicates()}; unsafe {len(sampler.unsafe)}/{sampler.samples} "
      f"{sorted(set(sampler.unsafe))[:4]}")
