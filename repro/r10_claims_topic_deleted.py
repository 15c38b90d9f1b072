"""Two members (threads) reading a backlog; at 3 s the claims topic is deleted (AdminClient).
Later, a third member joins (a fresh reader of the new claims log). Everything processed?
Offsets at the end, never past an unprocessed record? How long?

Usage: BOOTSTRAP=... python repro/r10_claims_topic_deleted.py
"""
from __future__ import annotations

import threading
import time

from _common import (BOOTSTRAP, Sampler, base_conf, commit_zero, create_topic, group_offsets,
                     name, produce)
from _team import Ledger, Member, wait
from confluent_kafka.admin import AdminClient

BACKLOG, CHUNK, PARTS = 20000, 1000, 2
topic, group = name("r10"), name("g10")
create_topic(topic, PARTS)
commit_zero(group, topic, PARTS)
for q in range(PARTS):
    produce(topic, BACKLOG, q)
ledger = Ledger()
lock = threading.Lock()
processed = [set() for _ in range(PARTS)]


def step(c, msgs, me):
    time.sleep(0.0003 * len(msgs))
    ledger.add(msgs)
    with lock:
        for m in msgs:
            processed[m.partition()].add(m.offset())
    if msgs:
        c.commit(asynchronous=False)


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "parallel.rebalance.group.claim.timeout.ms": 3000,
                           "enable.auto.commit": False})
members = [Member(n, conf, [topic], ledger, step) for n in ("A", "B")]
sampler = Sampler(group, topic, PARTS, processed, lock, [BACKLOG] * PARTS)
t0 = time.monotonic()
for m in members:
    m.start()
sampler.start()
time.sleep(3)
admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
admin.delete_topics([f"{group}.catchup.claims"])[f"{group}.catchup.claims"].result(30)
print(f"deleted the claims topic at {time.monotonic() - t0:.1f}s; processed so far "
      f"{[len(p) for p in processed]}")
time.sleep(10)
c3 = Member("C", conf, [topic], ledger, step)
c3.start()
members.append(c3)
ok = wait(lambda: all(x >= BACKLOG for x in sampler.last), 120)
print(f"at end={ok} after {time.monotonic() - t0:.0f}s")
for m in members:
    m.halt.set()
for m in members:
    m.join(30)
sampler.stop()
md = admin.list_topics(f"{group}.catchup.claims", timeout=10).topics.get(f"{group}.catchup.claims")
missing = [BACKLOG - len({o for o in processed[q] if o < BACKLOG}) for q in range(PARTS)]
stats = {m.name: (m.consumer._group.chunks_won, m.consumer._group.chunks_done,
                  m.consumer._group._log.send_failures) for m in members}
print(f"offsets {group_offsets(group, topic, PARTS)} (want {BACKLOG}); missing {missing}; "
      f"duplicates {ledger.duplicates()}; unsafe {len(sampler.unsafe)}/{sampler.samples}; "
      f"(won, done, send failures) {stats}; claims topic now: "
      f"{None if md is None else (len(md.partitions), md.error)}")
