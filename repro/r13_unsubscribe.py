"""A member that unsubscribe()s while it holds chunks, and keeps polling (say to subscribe
to another topic later). What does poll() return after unsubscribe()? A plain consumer
returns nothing. Does it keep claiming new chunks of the topic it left?

Usage: BOOTSTRAP=... python repro/r13_unsubscribe.py
"""
from __future__ import annotations

import time

from _common import base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, Member, wait

BACKLOG, CHUNK = 40000, 1000
topic, other, group = name("r13"), name("r13other"), name("g13")
create_topic(topic)
create_topic(other)
commit_zero(group, topic)
produce(topic, BACKLOG)
ledger = Ledger()
after = {"records": 0, "topics": set(), "won_at_unsub": None}


def step(c, msgs, me):
    time.sleep(0.0005 * len(msgs))
    ledger.add(msgs)
    if msgs:
        c.commit(asynchronous=False)
    if me.name == "A" and me.ticks == 30:
        after["won_at_unsub"] = c._group.chunks_won
        c.unsubscribe()
        me.unsub_at = time.monotonic()
    elif me.name == "A" and me.ticks > 30:
        after["records"] += len(msgs)
        after["topics"] |= {m.topic() for m in msgs}


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False})
a = Member("A", conf, [topic], ledger, step, batch=100)
b = Member("B", conf, [topic], ledger, step, batch=100)
a.start(); b.start()
time.sleep(15)
ga = a.consumer._group
print(f"A after unsubscribe(): {after['records']} records of {after['topics']} handed out; "
      f"chunks won {after['won_at_unsub']} at unsubscribe, {ga.chunks_won} now; assignment "
      f"{a.consumer.assignment()}")
wait(lambda: group_offsets(group, topic)[0] >= BACKLOG, 90)  # B drains the rest
for m in (a, b):
    m.halt.set()
for m in (a, b):
    m.join(30)
print(f"group offset {group_offsets(group, topic)[0]}/{BACKLOG}; processed "
      f"{len(ledger.processed(topic, 0))}; duplicates {ledger.duplicates()}")
