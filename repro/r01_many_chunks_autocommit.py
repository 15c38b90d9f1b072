"""One member, small chunks, the emulated auto-commit (enable.auto.commit=true, its default
5 s interval): does the group's offset reach the log end once every record was handed out?

Usage: BOOTSTRAP=127.0.0.1:39292 python repro/r01_many_chunks_autocommit.py [BACKLOG] [CHUNK]
"""

from __future__ import annotations

import sys
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce

from fastrebalance import Consumer

backlog = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 100
topic, group = name("r01"), name("g01")
create_topic(topic)
commit_zero(group, topic)
produce(topic, backlog)
processed: list[set[int]] = [set()]
lock = threading.Lock()
sampler = Sampler(group, topic, 1, processed, lock, [backlog])
c = Consumer(base_conf(group, **{"parallel.rebalance.group.chunk.records": chunk,
                                 "enable.auto.commit": True}))
c.subscribe([topic])
sampler.start()
t0 = time.monotonic()
all_at = None
while time.monotonic() - t0 < 60:
    m = c.poll(0.1)
    if m is not None and m.error() is None:
        with lock:
            processed[0].add(m.offset())
    if all_at is None and len(processed[0]) >= backlog:
        all_at = time.monotonic() - t0
    if all_at is not None and sampler.last[0] >= backlog:
        break
g = c._group  # for the report only
gs = (f'chunks won {g.chunks_won} done {g.chunks_done} held {len(g._held)}' if g else 'group catch-up off')
print(f"backlog={backlog} chunk={chunk} processed={len(processed[0])} all handed out at "
      f"{all_at and round(all_at, 1)}s; group offset after {time.monotonic() - t0:.0f}s: "
      f"{group_offsets(group, topic)[0]} (want {backlog}); unsafe samples {len(sampler.unsafe)}"
      f"/{sampler.samples}; {gs}")
c.close()
sampler.stop()
