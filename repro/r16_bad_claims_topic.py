"""parallel.rebalance.group.claims.topic set to a name Kafka refuses ("a b/c"): accepted
by the constructor; what happens to a backlog? (one member, 20 s)

Usage: BOOTSTRAP=... python repro/r16_bad_claims_topic.py
"""
from __future__ import annotations

import time

from _common import base_conf, commit_zero, create_topic, group_offsets, name, produce

from fastrebalance import Consumer

topic, group = name("r16"), name("g16")
create_topic(topic)
commit_zero(group, topic)
produce(topic, 5000)
c = Consumer(base_conf(group, **{"parallel.rebalance.group.claims.topic": "a b/c",
                                 "enable.auto.commit": False}))
c.subscribe([topic])
got = 0
t0 = time.monotonic()
while time.monotonic() - t0 < 20:
    msgs = [m for m in c.consume(500, 0.2) if m.error() is None]
    got += len(msgs)
    if msgs:
        c.commit(asynchronous=False)
print(f"records handed out in 20 s: {got}/5000; group offset {group_offsets(group, topic)[0]}")
c.close()
