"""Two groups on one topic (2 partitions), two members each, at once. Group X commits by
message; group Y commits only with explicit offsets= (commit(offsets=[m.offset()+1]) per
partition), which design.md says claims no backlog record. Each group: every record
processed, its offset at the end (or where it stays), never past an unprocessed record?

Usage: BOOTSTRAP=... python repro/r14_two_groups_offsets.py
"""
from __future__ import annotations

import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, Member, wait
from confluent_kafka import TopicPartition

BACKLOG, CHUNK, PARTS = 15000, 1000, 2
topic = name("r14")
gx, gy = name("g14x"), name("g14y")
create_topic(topic, PARTS)
for g in (gx, gy):
    commit_zero(g, topic, PARTS)
for q in range(PARTS):
    produce(topic, BACKLOG, q)
runs = {}
for g, style in ((gx, "message"), (gy, "offsets")):
    ledger, lock = Ledger(), threading.Lock()
    processed = [set() for _ in range(PARTS)]

    def step(c, msgs, me, ledger=ledger, lock=lock, processed=processed, style=style):
        ledger.add(msgs)
        with lock:
            for m in msgs:
                processed[m.partition()].add(m.offset())
        last = {}
        for m in msgs:
            last[(m.topic(), m.partition())] = m
        for m in last.values():
            if style == "message":
                c.commit(message=m, asynchronous=False)
            else:
                c.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1)],
                         asynchronous=False)

    conf = base_conf(g, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False})
    members = [Member(f"{style}{i}", conf, [topic], ledger, step) for i in range(2)]
    sampler = Sampler(g, topic, PARTS, processed, lock, [BACKLOG] * PARTS)
    runs[g] = (style, ledger, members, sampler)
t0 = time.monotonic()
for style, ledger, members, sampler in runs.values():
    for m in members:
        m.start()
    sampler.start()
wait(lambda: all(x >= BACKLOG for (_, _, _, s) in runs.values() for x in s.last), 40)
for g, (style, ledger, members, sampler) in runs.items():
    for m in members:
        m.halt.set()
    for m in members:
        m.join(30)
    sampler.stop()
    missing = [BACKLOG - len(ledger.processed(topic, q)) for q in range(PARTS)]
    print(f"group {g} (commits by {style}): offsets {group_offsets(g, topic, PARTS)} (want "
          f"{BACKLOG}); missing {missing}; duplicates {ledger.duplicates()}; unsafe "
          f"{len(sampler.unsafe)}/{sampler.samples} (partition, stored, lowest unprocessed) "
          f"{sorted(set(sampler.unsafe))[:6]}; chunks won/done "
          f"{[(m.consumer._group.chunks_won, m.consumer._group.chunks_done) for m in members]}")
