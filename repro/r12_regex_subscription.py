"""A pattern subscription that also matches the claims topic: group.id "orders-<x>" and
subscribe(["^orders-.*"]) (the claims topic is "<group.id>.catchup.claims"). Does the
application get records it never produced? Does the backlog drain?

Usage: BOOTSTRAP=... python repro/r12_regex_subscription.py
"""
from __future__ import annotations

import time
import uuid

from _common import base_conf, commit_zero, create_topic, group_offsets, produce

from fastrebalance import Consumer

tag = uuid.uuid4().hex[:6]
topic, group = f"orders-{tag}-data", f"orders-{tag}-app"
create_topic(topic)
commit_zero(group, topic)
produce(topic, 5000)
c = Consumer(base_conf(group, **{"parallel.rebalance.group.chunk.records": 1000,
                                 "enable.auto.commit": False,
                                 "topic.metadata.refresh.interval.ms": 1000}))
c.subscribe([f"^orders-{tag}.*"])
seen: dict[str, int] = {}
sample = {}
t0 = time.monotonic()
while time.monotonic() - t0 < 25:
    msgs = [m for m in c.consume(500, 0.2) if m.error() is None]
    for m in msgs:
        seen[m.topic()] = seen.get(m.topic(), 0) + 1
        sample.setdefault(m.topic(), m.value()[:80])
    if msgs:
        c.commit(asynchronous=False)
print(f"records per topic handed to the application: {seen}")
print(f"a record of each: {sample}")
print(f"assignment: {sorted((tp.topic, tp.partition) for tp in c.assignment())}")
print(f"group offset of the data topic {group_offsets(group, topic)[0]}/5000")
c.close()
