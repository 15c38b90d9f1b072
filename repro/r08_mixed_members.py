"""Two topics (3 + 2 partitions), a backlog on every partition, members that commit
differently while the group rebalances under them:
A: store_offsets(message=) after processing, enable.auto.offset.store=false, the
   emulated auto-commit every 500 ms;
B: a one-batch pipeline: processes the previous batch after the next consume(), then
   commit(message=last of it per partition, asynchronous=True), across revokes;
C: joins at 1.5 s, commits synchronously, close()s at 4 s;
D: joins at 5 s, bare commit() after each batch.
Everything processed? Offsets at the log ends, never past an unprocessed record?

Usage: BOOTSTRAP=... WORK=0.0005 python repro/r08_mixed_members.py
"""
from __future__ import annotations

import os
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, Member, wait

PER_PART, CHUNK = 8000, 1000
WORK = float(os.environ.get("WORK", "0.0005"))  # seconds of work per record
t1, t2, group = name("r08a"), name("r08b"), name("g08")
parts = {t1: 3, t2: 2}
for t, n in parts.items():
    create_topic(t, n)
    commit_zero(group, t, n)
    for q in range(n):
        produce(t, PER_PART, q)
ledger = Ledger()
lock = threading.Lock()
processed = {t: [set() for _ in range(n)] for t, n in parts.items()}


def record(msgs):
    time.sleep(WORK * len(msgs))
    ledger.add(msgs)
    with lock:
        for m in msgs:
            processed[m.topic()][m.partition()].add(m.offset())


def step_a(c, msgs, me):
    record(msgs)
    for m in msgs:
        c.store_offsets(message=m)


held: list = []


def step_b(c, msgs, me):
    global held
    prev, held = held, msgs
    record(prev)
    last = {}
    for m in prev:
        last[(m.topic(), m.partition())] = m
    for m in last.values():
        c.commit(message=m, asynchronous=True)


def step_c(c, msgs, me):
    record(msgs)
    if msgs:
        c.commit(asynchronous=False)


def step_d(c, msgs, me):
    record(msgs)
    if msgs:
        c.commit()


base = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False})
a = Member("A", {**base, "enable.auto.commit": True, "auto.commit.interval.ms": 500,
                 "enable.auto.offset.store": False}, [t1, t2], ledger, step_a)
b = Member("B", base, [t1, t2], ledger, step_b)
c = Member("C", base, [t1, t2], ledger, step_c)
d = Member("D", base, [t1, t2], ledger, step_d)
samplers = [Sampler(group, t, n, processed[t], lock, [PER_PART] * n) for t, n in parts.items()]
t0 = time.monotonic()
a.start(); b.start()
for s in samplers:
    s.start()
time.sleep(1.5); c.start()
time.sleep(2.5); c.halt.set()
time.sleep(1.0); d.start()
ok = wait(lambda: all(x >= PER_PART for s in samplers for x in s.last), 120)
for m in (a, b, d):
    m.halt.set()
for m in (a, b, c, d):
    m.join(30)
for s in samplers:
    s.stop()
missing = {t: [PER_PART - len(processed[t][q]) for q in range(n)] for t, n in parts.items()}
offs = {t: group_offsets(group, t, n) for t, n in parts.items()}
stats = {m.name: (m.consumer._group.chunks_won, m.consumer._group.chunks_done,
                  m.consumer._group.chunks_lost) for m in (a, b, c, d) if m.consumer}
print(f"at end={ok} after {time.monotonic() - t0:.0f}s: offsets {offs}; missing {missing}; "
      f"duplicates {ledger.duplicates()}; unsafe {[len(s.unsafe) for s in samplers]} of "
      f"{[s.samples for s in samplers]} {[s.unsafe[:2] for s in samplers]}; (won, done, lost) "
      f"{stats}; errors {[m.error for m in (a, b, c, d)]}")
