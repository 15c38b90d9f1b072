"""Backlogs whose offsets do not all hold records an application sees, read by two members:
MODE=txn: transactional input (every 3rd transaction of 37 records aborted) read with
isolation.level=read_committed; MODE=compact: a compacted topic (keys repeat) compacted
before the members start. Every visible record processed? The group's offset at the log
end (markers, aborted and compacted offsets included) and never past an unprocessed one?

Usage: BOOTSTRAP=... MODE=txn|compact python repro/r06_txn_compact.py
"""
from __future__ import annotations

import os
import threading
import time

from _common import (BOOTSTRAP, Sampler, base_conf, commit_zero, create_topic, group_offsets,
                     name)
from _team import Ledger, Member, wait
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition

MODE = os.environ.get("MODE", "txn")
PARTS, PER_PART, CHUNK = 2, 15000, 1000
topic, group = name(f"r06{MODE}"), name("g06")
if MODE == "compact":
    create_topic(topic, PARTS, {"cleanup.policy": "compact", "segment.ms": "1000",
                                "min.cleanable.dirty.ratio": "0.01", "segment.bytes": "100000"})
else:
    create_topic(topic, PARTS)
commit_zero(group, topic, PARTS)
if MODE == "txn":
    p = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": name("tx")})
    p.init_transactions(30)
    for part in range(PARTS):
        n, t = 0, 0
        while n < PER_PART:
            p.begin_transaction()
            for _ in range(37):
                p.produce(topic, value=str(n).encode(), partition=part)
                n += 1
            p.flush(30)  # the aborted records are written, then aborted
            if t % 3 == 2:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
            t += 1
else:
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for part in range(PARTS):
        for i in range(PER_PART):
            p.produce(topic, key=str(i % 3000).encode(), value=str(i).encode(), partition=part)
    p.flush(60)
    time.sleep(20)  # segments roll (segment.ms) and the cleaner compacts
    p.produce(topic, key=b"roll", value=b"x", partition=0)
    p.produce(topic, key=b"roll", value=b"x", partition=1)
    p.flush(10)
    time.sleep(15)


def visible() -> tuple[list[set[int]], list[int]]:
    c = PlainConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": name("check"),
                       "isolation.level": "read_committed", "enable.partition.eof": True,
                       "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, q, 0) for q in range(PARTS)])
    got: list[set[int]] = [set() for _ in range(PARTS)]
    eof: set[int] = set()
    while len(eof) < PARTS:
        for m in c.consume(1000, 1):
            if m.error() is None:
                got[m.partition()].add(m.offset())
            elif m.error().code() == -191:
                eof.add(m.partition())
    ends = [c.get_watermark_offsets(TopicPartition(topic, q))[1] for q in range(PARTS)]
    c.close()
    return got, ends


expected, ends = visible()
print(f"mode={MODE} log ends {ends}, visible records {[len(e) for e in expected]}")
ledger = Ledger()
lock = threading.Lock()
# offsets holding no visible record count as processed for the safety check
processed = [set(range(ends[q])) - expected[q] for q in range(PARTS)]


def step(c, msgs, me):
    ledger.add(msgs)
    with lock:
        for m in msgs:
            processed[m.partition()].add(m.offset())
    last = {}
    for m in msgs:
        last[(m.topic(), m.partition())] = m
    for m in last.values():
        c.commit(message=m, asynchronous=False)


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False, "isolation.level": "read_committed"})
members = [Member(n, conf, [topic], ledger, step) for n in ("A", "B")]
sampler = Sampler(group, topic, PARTS, processed, lock, ends)
for m in members:
    m.start()
sampler.start()
t0 = time.monotonic()
ok = wait(lambda: all(sampler.last[q] >= ends[q] for q in range(PARTS)), 90)
for m in members:
    m.halt.set()
for m in members:
    m.join(30)
sampler.stop()
missing = [len(expected[q] - ledger.processed(topic, q)) for q in range(PARTS)]
stats = [(m.consumer._group.chunks_won, m.consumer._group.chunks_done) for m in members]
print(f"at end={ok} after {time.monotonic() - t0:.0f}s: group offsets "
      f"{group_offsets(group, topic, PARTS)} (log ends {ends}); missing {missing}; duplicates "
      f"{ledger.duplicates()}; unsafe {len(sampler.unsafe)}/{sampler.samples} "
      f"{sampler.unsafe[:3]}; (won, done) per member {stats}")
