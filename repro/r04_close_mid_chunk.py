"""Two members (threads). Member A closes cleanly (close()) in the middle of a chunk, after
processing part of it; B goes on alone. With AUTO=1 A uses enable.auto.commit=true (close()
commits what was handed out), with AUTO=0 A commits every batch it processed itself before
close(). Lost records? Duplicates (no crash here)? Time until B took A's chunks over?

Usage: BOOTSTRAP=... AUTO=1 python repro/r04_close_mid_chunk.py
"""
from __future__ import annotations

import os
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce
from _team import Ledger, Member, wait

AUTO = os.environ.get("AUTO", "1") == "1"
BACKLOG, CHUNK = 30000, 5000
topic, group = name("r04"), name("g04")
create_topic(topic)
commit_zero(group, topic)
produce(topic, BACKLOG)
ledger = Ledger()
processed = [set()]
lock = threading.Lock()
seen_a = [0]


def step(c, msgs, me):
    ledger.add(msgs)
    with lock:
        processed[0].update(m.offset() for m in msgs)
    if me.name == "A":
        seen_a[0] += sum(1 for m in msgs if m.offset() < BACKLOG)
        if seen_a[0] >= 700:
            me.halt.set()  # close() follows, mid-chunk
    if msgs and not AUTO:
        c.commit(asynchronous=False)


conf = base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                           "parallel.rebalance.group.claim.timeout.ms": 10000,
                           "enable.auto.commit": AUTO})
a = Member("A", conf, [topic], ledger, step, batch=100)
b = Member("B", {**conf, "enable.auto.commit": False}, [topic], ledger,
           lambda c, msgs, me: (ledger.add(msgs), processed[0].update(m.offset() for m in msgs),
                                msgs and c.commit(asynchronous=False)))
sampler = Sampler(group, topic, 1, processed, lock, [BACKLOG])
t0 = time.monotonic()
a.start(); b.start(); sampler.start()
a.join(60)
closed_at = time.monotonic() - t0
ok = wait(lambda: sampler.last[0] >= BACKLOG and len(processed[0]) >= BACKLOG, 90)
done_at = time.monotonic() - t0
b.halt.set(); b.join(30); sampler.stop()
g = a.consumer._group
ga = f"A won {g.chunks_won} done {g.chunks_done}" if g else "group catch-up off"
missing = BACKLOG - len({o for o in processed[0] if o < BACKLOG})
print(f"auto_commit={AUTO} A closed at {closed_at:.1f}s having seen {seen_a[0]} backlog records; "
      f"drained={ok} at {done_at:.1f}s group offset {group_offsets(group, topic)[0]}/{BACKLOG} "
      f"missing={missing} duplicates={ledger.duplicates()} unsafe={len(sampler.unsafe)}/"
      f"{sampler.samples}; {ga}; errors {a.error} {b.error}")
