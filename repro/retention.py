"""Records deleted (AdminClient.delete_records) while a query is down: once inside the pending
backlog ranges of a catch-up, once below the next offset of a partition read in order.
failOnDataLoss=true must fail naming the partition; false must deliver every record that
still exists.

    BS=127.0.0.1:39492 .venv/bin/python repro/retention.py
"""
import os, shutil, sys, threading, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from _util import BS, Recorder, new_topic, produce, reader, report, spark_session, truth

P = 2
topic = new_topic(P)
produce(topic, 200, P, "old")
spark = spark_session()
base = dict(startingOffsets="earliest", catchup__threshold=1000, catchup__maxOffsetsPerTrigger=2000,
            catchup__chunkSize=1000, catchup__firstBatchWaitMs=2000)
root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
rec = Recorder()
q = reader(spark, topic, **base).writeStream.foreachBatch(rec).option("checkpointLocation", root + "/ck").start()
deadline = time.time() + 120
while rec.count() < 200 and time.time() < deadline:
    time.sleep(0.5)
q.stop()
# partition 0 gets a backlog above the threshold, partition 1 one below it
p = Producer({"bootstrap.servers": BS, "linger.ms": 5})
for i in range(20000):
    p.produce(topic, value=f"b-{i}".encode(), partition=0)
for i in range(500):
    p.produce(topic, value=f"s-{i}".encode(), partition=1)
p.flush(30)
# run 2: the restart batch only (live records), leaving partition 0's backlog pending
r2 = Recorder()
def one(df, bid):
    r2(df, bid)
q = reader(spark, topic, **base).writeStream.foreachBatch(one).option("checkpointLocation", root + "/ck").start()
time.sleep(1.0)
for i in range(20):
    p.produce(topic, value=f"live-{i}".encode(), partition=i % P)
p.flush(10)
deadline = time.time() + 60
while not r2.attempts and time.time() < deadline:
    time.sleep(0.1)
q.stop()
last = sorted((f for f in os.listdir(root + "/ck/offsets") if f.isdigit()), key=int)[-1]
print("run2 batches", r2.summary(), "logged:", open(f"{root}/ck/offsets/{last}").read().splitlines()[-1][:300])
a = AdminClient({"bootstrap.servers": BS})
fut = a.delete_records([TopicPartition(topic, 0, 5000), TopicPartition(topic, 1, 300)])
for tp, f in fut.items():
    print("delete_records", tp.partition, "->", f.result(30).offset if hasattr(f.result(30), "offset") else f.result(30))
want = truth(topic, P)
print("truth after deletion:", len(want))
ok = True
for fodl in ("true", "false"):
    ck = f"{root}/fodl-{fodl}"
    shutil.copytree(root + "/ck", ck)
    r3 = Recorder()
    t0 = time.time()
    q = (reader(spark, topic, **base, failOnDataLoss=fodl).writeStream.foreachBatch(r3)
         .option("checkpointLocation", ck).start())
    deadline = time.time() + 180
    while time.time() < deadline and q.isActive and not want <= (r3.seen() | rec.seen() | r2.seen()):
        time.sleep(1)
    time.sleep(2)
    exc = q.exception()
    if q.isActive:
        q.stop()
    print(f"failOnDataLoss={fodl}: {time.time()-t0:.1f}s exc={(str(exc).splitlines() or [''])[0][:300] if exc else None}")
    got = r3.seen() | rec.seen() | r2.seen()
    print(f"   delivered still-existing: {len(want & got)}/{len(want)}; of the deleted p0 [200,5000): {len({k for k in got if k[0]==0 and 200<=k[1]<5000})}; p1 [100,300): {len({k for k in got if k[0]==1 and 100<=k[1]<300})}")
    if fodl == "true":
        ok &= exc is not None
    else:
        ok &= exc is None and want <= got
print("RESULT", "OK" if ok else "FAIL")
