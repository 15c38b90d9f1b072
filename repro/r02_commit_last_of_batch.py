"""One member, the common loop "consume a batch, process it, commit(message=last record of
the batch)" (per partition), auto-commit off: does the group's offset reach the log end?

Usage: BOOTSTRAP=127.0.0.1:39292 python repro/r02_commit_last_of_batch.py [BACKLOG] [CHUNK] [BATCH] [consume|poll]
"""

from __future__ import annotations

import sys
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce

from fastrebalance import Consumer

backlog = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 500
topic, group = name("r02"), name("g02")
create_topic(topic)
commit_zero(group, topic)
produce(topic, backlog)
processed: list[set[int]] = [set()]
lock = threading.Lock()
sampler = Sampler(group, topic, 1, processed, lock, [backlog])
c = Consumer(base_conf(group, **{"parallel.rebalance.group.chunk.records": chunk,
                                 "enable.auto.commit": False}))
c.subscribe([topic])
sampler.start()
t0 = time.monotonic()
all_at = None
mode = sys.argv[4] if len(sys.argv) > 4 else "consume"
held: list = []
while time.monotonic() - t0 < 45:
    if mode == "consume":
        msgs = [m for m in c.consume(batch, 0.2) if m.error() is None]
    else:  # poll() one by one, commit the last of every `batch` records
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            held.append(m)
        if len(held) < batch and (m is not None or not held):
            if all_at is not None and sampler.last[0] >= backlog:
                break
            continue
        msgs, held = held, []
    with lock:
        processed[0].update(m.offset() for m in msgs)
    last = {}
    for m in msgs:
        last[(m.topic(), m.partition())] = m
    for m in last.values():
        c.commit(message=m, asynchronous=False)
    if all_at is None and len(processed[0]) >= backlog:
        all_at = time.monotonic() - t0
    if all_at is not None and sampler.last[0] >= backlog:
        break
g = c._group
gs = (f'chunks won {g.chunks_won} done {g.chunks_done} held {sorted(ck[2:] for ck in g._held)}' if g else 'group catch-up off')
print(f"backlog={backlog} chunk={chunk} batch={batch} processed={len(processed[0])} all handed "
      f"out at {all_at and round(all_at, 1)}s; group offset after {time.monotonic() - t0:.0f}s: "
      f"{group_offsets(group, topic)[0]} (want {backlog}); unsafe samples {len(sampler.unsafe)}"
      f"/{sampler.samples}; {gs}")
c.close()
sampler.stop()
