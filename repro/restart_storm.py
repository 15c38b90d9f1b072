"""Stop/start storm: a query with live traffic and a 30,000-record restart backlog is stopped
and started again on the same checkpoint 8 times at random points (during the restart batch's
wait, during backlog batches), alternating processingTime and default triggers; a final run
drains. Every record in the sink, every replayed batch identical to its first attempt.

    BS=127.0.0.1:39492 .venv/bin/python repro/restart_storm.py [seed]
"""
import os, random, sys, threading, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, produce, reader, report, spark_session, truth

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rnd = random.Random(seed)
P = 3
topic = new_topic(P)
produce(topic, 300, P, "old")
spark = spark_session()
opts = dict(startingOffsets="earliest", catchup__threshold=2000, catchup__maxOffsetsPerTrigger=4000,
            catchup__chunkSize=1500, catchup__firstBatchWaitMs=1500)
ck = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
rec = Recorder()


class Live(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True); self.halt = threading.Event()
    def run(self):
        p = Producer({"bootstrap.servers": BS, "linger.ms": 0}); i = 0
        while not self.halt.is_set():
            p.produce(topic, value=f"live-{i}".encode(), partition=i % P); p.poll(0); i += 1; time.sleep(0.01)
        p.flush(10)


def start(trigger):
    w = reader(spark, topic, **opts).writeStream.foreachBatch(rec).option("checkpointLocation", ck)
    if trigger:
        w = w.trigger(processingTime=trigger)
    return w.start()


q = start(None)
deadline = time.time() + 60
while rec.count() < 300 and time.time() < deadline: time.sleep(0.5)
q.stop()
live = Live(); live.start()
for n in range(8):
    produce(topic, 10000, P, f"backlog{n}")
    trig = rnd.choice([None, "2 seconds", "500 milliseconds"])
    q = start(trig)
    pause = rnd.uniform(0.5, 6)
    time.sleep(pause)
    q.stop()
    print(f"storm {n}: trigger={trig} ran {pause:.1f}s, batches so far {len(rec.attempts)}", flush=True)
live.halt.set(); live.join()
want = truth(topic, P)
q = start(None)
deadline = time.time() + 300
while time.time() < deadline and not want <= rec.seen(): time.sleep(1)
time.sleep(2); q.stop()
ok = report(f"restart storm seed {seed}", want, rec)
dups = rec.count() - len(rec.seen())
print("rows counted twice across distinct batches:", dups)
bad = [b for b, atts in rec.attempts.items() if any(a != atts[0] for a in atts)]
for b in bad[:5]:
    print("  batch", b, "attempts", [len(a) for a in rec.attempts[b]])
print("RESULT", "OK" if ok and dups == 0 else "FAIL")
