"""Retention deletes records of chunks not read yet (DeleteRecords up to CUT while two
members read a backlog slowly). Every record that still exists processed? The group's
offset never past an unprocessed existing record? Where does it end (design.md: a chunk
whose records are gone is never done, the offset stays below it)? Then all members close
and one restarts: does the offset move on?

Usage: BOOTSTRAP=... python repro/r11_retention.py
"""
from __future__ import annotations

import threading
import time

from _common import (BOOTSTRAP, Sampler, base_conf, commit_zero, create_topic, group_offsets,
                     name, produce)
from _team import Ledger, Member, wait
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

BACKLOG, CHUNK, CUT = 30000, 1000, 15500
topic, group = name("r11"), name("g11")
create_topic(topic)
commit_zero(group, topic)
produce(topic, BACKLOG)
ledger = Ledger()
lock = threading.Lock()
processed = [set()]


def step(c, msgs, me):
    time.sleep(0.001 * len(msgs))
    ledger.add(msgs)
    with lock:
        processed[0].update(m.offset() for m in msgs)
    if msgs:
        c.commit(asynchronous=False)


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "enable.auto.commit": False})
members = [Member(n, conf, [topic], ledger, step, batch=50) for n in ("A", "B")]
t0 = time.monotonic()
for m in members:
    m.start()
time.sleep(2.5)
admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
with lock:
    before = len(processed[0])
    # deleted records count as processed for the safety check (nobody can read them)
    gone = set(range(CUT)) - processed[0]
    processed[0] |= gone
admin.delete_records([TopicPartition(topic, 0, CUT)])[TopicPartition(topic, 0, CUT)].result(30)
print(f"deleted offsets < {CUT} at {time.monotonic() - t0:.1f}s; {before} processed before, "
      f"{len(gone)} never read")
sampler = Sampler(group, topic, 1, processed, lock, [BACKLOG])
sampler.start()
ok = wait(lambda: set(range(CUT, BACKLOG)) <= ledger.processed(topic, 0), 60)
time.sleep(5)
print(f"existing records all processed={ok} at {time.monotonic() - t0:.0f}s; offset "
      f"{group_offsets(group, topic)[0]}; held chunks "
      f"{[sorted(ck[2:] for ck in m.consumer._group._held) for m in members]}")
for m in members:
    m.halt.set()
for m in members:
    m.join(30)
again = Member("R", conf, [topic], ledger, step)
again.start()
moved = wait(lambda: sampler.last[0] >= BACKLOG, 40)
again.halt.set(); again.join(30); sampler.stop()
missing = len(set(range(CUT, BACKLOG)) - ledger.processed(topic, 0))
print(f"after a restart: offset {group_offsets(group, topic)[0]} (log end {BACKLOG}) "
      f"reached={moved}; missing existing {missing}; unsafe {len(sampler.unsafe)}/"
      f"{sampler.samples}; duplicates {ledger.duplicates()}")
