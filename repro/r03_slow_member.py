"""Two members (threads), claim timeout 3 s. Member A, after its first chunk records, stops
calling poll/consume for SLEEP seconds (longer than the claim timeout, shorter than
max.poll.interval.ms), then processes what it held and commits it. Everything processed?
The group's offset never past an unprocessed record? Duplicates (there is no crash)?

Usage: BOOTSTRAP=... python repro/r03_slow_member.py [SLEEP]
"""
from __future__ import annotations

import sys
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, Member, wait

sleep_s = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
BACKLOG, CHUNK = 30000, 1000
topic, group = name("r03"), name("g03")
create_topic(topic)
commit_zero(group, topic)
produce(topic, BACKLOG)
ledger = Ledger()
processed = [set()]
lock = threading.Lock()
slept = threading.Event()


def normal(c, msgs, me):
    ledger.add(msgs)
    with lock:
        processed[0].update(m.offset() for m in msgs)
    if msgs:
        c.commit(asynchronous=False)


def slow(c, msgs, me):
    if msgs and not slept.is_set() and any(m.offset() < BACKLOG for m in msgs):
        slept.set()
        time.sleep(sleep_s)  # holds its chunk records unprocessed, no poll
    normal(c, msgs, me)


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "parallel.rebalance.group.claim.timeout.ms": 3000,
                           "enable.auto.commit": False})
a = Member("A", conf, [topic], ledger, slow)
b = Member("B", conf, [topic], ledger, normal)
sampler = Sampler(group, topic, 1, processed, lock, [BACKLOG])
a.start(); b.start(); sampler.start()
ok = wait(lambda: sampler.last[0] >= BACKLOG and len(processed[0]) >= BACKLOG, 90)
t = time.monotonic()
a.halt.set(); b.halt.set(); a.join(30); b.join(30); sampler.stop()
missing = BACKLOG - len({o for o in processed[0] if o < BACKLOG})
ga, gb = a.consumer._group, b.consumer._group
print(f"sleep={sleep_s}s drained={ok} group offset {group_offsets(group, topic)[0]}/{BACKLOG} "
      f"missing={missing} duplicates={ledger.duplicates()} unsafe={len(sampler.unsafe)}/"
      f"{sampler.samples} A: won {ga.chunks_won} done {ga.chunks_done} lost {ga.chunks_lost}; "
      f"B: won {gb.chunks_won} done {gb.chunks_done} lost {gb.chunks_lost}; errors {a.error} {b.error}")
