"""A query that fails (foreachBatch raises) inside a batch that drains backlog, with pending
backlog ranges left in its offset log; the checkpoint is then copied and restarted under
changed triggers and options. Each variant must replay the failed batch with the same records
and deliver every record of the topic.

    BS=127.0.0.1:39492 .venv/bin/python repro/restart_variants.py [variant ...]
"""
import json, os, shutil, sys, threading, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, produce, reader, report, spark_session, truth

P = 2
topic = new_topic(P)
produce(topic, 200, P, "old")
spark = spark_session()
base = dict(startingOffsets="earliest", catchup__threshold=1000, catchup__maxOffsetsPerTrigger=2000,
            catchup__chunkSize=1000, catchup__firstBatchWaitMs=3000)
root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
rec = Recorder()
q = reader(spark, topic, **base).writeStream.foreachBatch(rec).option("checkpointLocation", root + "/ck").start()
deadline = time.time() + 120
while rec.count() < 200 and time.time() < deadline:
    time.sleep(0.5)
q.stop()
print("run1", rec.summary())
produce(topic, 20000, P, "backlog")


class Live(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True); self.halt = threading.Event()
    def run(self):
        p = Producer({"bootstrap.servers": BS, "linger.ms": 0}); i = 0
        while not self.halt.is_set():
            p.produce(topic, value=f"live-{i}".encode(), partition=i % P); p.poll(0); i += 1; time.sleep(0.02)
        p.flush(10)


live = Live(); live.start()
failed = {}
def failing(df, bid):
    rows = df.select("partition", "offset", "catchup").collect()
    if any(r.catchup for r in rows) and bid not in failed and len(failed) == 0 and sum(1 for _ in rec.attempts) >= 0:
        # fail the second batch that carries backlog
        failing.seen += 1
        if failing.seen == 2:
            failed[bid] = sorted((r.partition, r.offset) for r in rows)
            raise RuntimeError("sink fails once")
    rec.attempts.setdefault(bid, []).append(sorted((r.partition, r.offset) for r in rows))
failing.seen = 0
q = (reader(spark, topic, **base).writeStream.foreachBatch(failing).option("checkpointLocation", root + "/ck")
     .trigger(processingTime="1 second").start())
try:
    q.awaitTermination(180)
except Exception as e:
    print("run2 failed as planned:", str(e).splitlines()[0][:120])
live.halt.set(); live.join()
print("run2", rec.summary(), "failed batch", {b: len(v) for b, v in failed.items()})
last = sorted((f for f in os.listdir(root + "/ck/offsets") if f.isdigit()), key=int)[-1]
print("logged offsets of batch", last, ":", open(f"{root}/ck/offsets/{last}").read().splitlines()[-1][:400])
produce(topic, 3000, P, "late")   # below the threshold: a small restart lag
want = truth(topic, P)

variants = {
    "same-options-default-trigger": (dict(base), "default"),
    "catchup-disabled-default": (dict(base, catchup__enabled="false"), "default"),
    "once": (dict(base), "once"),
    "availableNow": (dict(base), "availableNow"),
    "catchup-disabled-availableNow": (dict(base, catchup__enabled="false"), "availableNow"),
    "smaller-chunks-maxOffsets": (dict(base, catchup__chunkSize=300, maxOffsetsPerTrigger=500, catchup__maxOffsetsPerTrigger=700), "default"),
}
chosen = sys.argv[1:] or list(variants)
ok = True
for name in chosen:
    opts, trig = variants[name]
    ck = f"{root}/{name}"
    shutil.copytree(root + "/ck", ck)
    r2 = Recorder()
    r2.attempts = {b: [list(a) for a in atts] for b, atts in rec.attempts.items()}
    for b, rows in failed.items():
        r2.attempts.setdefault(b, []).insert(0, rows)  # the failed first attempt
    w = reader(spark, topic, **opts).writeStream.foreachBatch(r2).option("checkpointLocation", ck)
    w = {"default": w, "once": w.trigger(once=True), "availableNow": w.trigger(availableNow=True)}[trig]
    t0 = time.time()
    q = w.start()
    if trig == "default":
        deadline = time.time() + 240
        while time.time() < deadline and not want <= r2.seen():
            time.sleep(1)
        time.sleep(3)
        q.stop()
    else:
        q.awaitTermination(240)
    exc = q.exception()
    print(f"variant {name}: {time.time()-t0:.1f}s exc={(str(exc).splitlines() or [''])[0][:200] if exc else None}")
    ok &= report(name, want, r2)
print("RESULT", "OK" if ok else "FAIL")
