"""A claim whose record is read back later than the member's 10 s give-up (_CLAIM_GIVE_UP_S):
one member alone reads a backlog; its (own, second) broker is paused (SIGSTOP) for PAUSE
seconds while a claim is in flight, then resumed. Does the group's offset reach the log end?

Needs a broker of its own to pause: BOOTSTRAP=127.0.0.1:39392 BROKER_PID=$(cat DIR/broker.pid)
Usage: python repro/r09_claim_seen_late.py [PAUSE]
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from _common import Sampler, base_conf, commit_zero, create_topic, group_offsets, name, produce

from fastrebalance import Consumer

pause = float(sys.argv[1]) if len(sys.argv) > 1 else 14.0
pid = int(os.environ["BROKER_PID"])
BACKLOG, CHUNK = 40000, 1000
topic, group = name("r09"), name("g09")
create_topic(topic)
commit_zero(group, topic)
produce(topic, BACKLOG)
processed = [set()]
lock = threading.Lock()
sampler = Sampler(group, topic, 1, processed, lock, [BACKLOG])
c = Consumer(base_conf(group, **{"parallel.rebalance.group.chunk.records": CHUNK,
                                 "enable.auto.commit": False, "session.timeout.ms": 45000,
                                 "heartbeat.interval.ms": 3000}))
c.subscribe([topic])
sampler.start()
g = None
t0 = time.monotonic()
paused = resumed = False
while time.monotonic() - t0 < 120:
    msgs = [m for m in c.consume(100, 0.1) if m.error() is None]
    g = c._group
    for m in msgs:
        time.sleep(0.0002)  # work
    with lock:
        processed[0].update(m.offset() for m in msgs)
    if msgs:
        c.commit(asynchronous=True)
    if not paused and len(processed[0]) >= 3000 and g._claiming is not None:
        os.kill(pid, signal.SIGSTOP)
        paused, paused_at, claim_then = True, time.monotonic(), g._claiming
        print(f"paused the broker at {paused_at - t0:.1f}s with claim {claim_then} in flight")
    if paused and not resumed and time.monotonic() - paused_at >= pause:
        os.kill(pid, signal.SIGCONT)
        resumed = True
        print(f"resumed after {pause}s; the member is now claiming {g._claiming}")
    if resumed and sampler.last[0] >= BACKLOG and len(processed[0]) >= BACKLOG:
        break
if paused and not resumed:
    os.kill(pid, signal.SIGCONT)
st = g._state
orphans = [ck for ck in st.held_by(g.member) if ck not in g._held]
print(f"pause={pause}s processed={len(processed[0])}/{BACKLOG} group offset "
      f"{group_offsets(group, topic)[0]} after {time.monotonic() - t0:.0f}s; unsafe "
      f"{len(sampler.unsafe)}/{sampler.samples}; chunks the log says this member holds but it "
      f"does not know: {orphans}; won {g.chunks_won} done {g.chunks_done} claims_lost {g.claims_lost}")
c.close()
sampler.stop()
