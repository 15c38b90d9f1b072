"""Records deleted while the query is down, below its next offset, in a lag above (p0) and
below (p1) catchup.threshold: the restart itself meets the deletion. failOnDataLoss=true
must fail; false must deliver every record still stored; catch-up on and off.

    BS=127.0.0.1:39492 .venv/bin/python repro/retention_restart.py
"""
import os, shutil, sys, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from _util import BS, Recorder, new_topic, produce, reader, report, spark_session, truth

topic = new_topic(2)
produce(topic, 200, 2, "old")
spark = spark_session()
base = dict(startingOffsets="earliest", catchup__threshold=1000, catchup__firstBatchWaitMs=1000)
root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
rec = Recorder()
q = reader(spark, topic, **base).writeStream.foreachBatch(rec).option("checkpointLocation", root + "/ck").start()
deadline = time.time() + 120
while rec.count() < 200 and time.time() < deadline: time.sleep(0.5)
q.stop()
p = Producer({"bootstrap.servers": BS, "linger.ms": 5})
for i in range(20000): p.produce(topic, value=f"b-{i}".encode(), partition=0)
for i in range(600): p.produce(topic, value=f"s-{i}".encode(), partition=1)
p.flush(30)
admin = AdminClient({"bootstrap.servers": BS})  # kept: a collected client never completes its futures
for tp, f in admin.delete_records(
        [TopicPartition(topic, 0, 5000), TopicPartition(topic, 1, 400)], request_timeout=60).items():
    print("deleted", tp.partition, "low watermark now", f.result(90).low_watermark)
time.sleep(1)
want = truth(topic, 2)
print("still stored:", len(want))
ok = True
for cu in ("true", "false"):
    for fodl in ("true", "false"):
        ck = f"{root}/{cu}-{fodl}"; shutil.copytree(root + "/ck", ck)
        r = Recorder()
        q = (reader(spark, topic, **base, failOnDataLoss=fodl, catchup__enabled=cu).writeStream.foreachBatch(r)
             .option("checkpointLocation", ck).start())
        deadline = time.time() + 120
        while time.time() < deadline and q.isActive and not want <= (r.seen() | rec.seen()): time.sleep(1)
        time.sleep(1)
        exc = q.exception()
        if q.isActive: q.stop()
        lines = [l.strip() for l in str(exc).splitlines() if "Error:" in l] if exc else []
        got = r.seen() | rec.seen()
        print(f"catchup={cu} failOnDataLoss={fodl}: exc={lines[-1][:250] if lines else exc} "
              f"delivered {len(want & got)}/{len(want)} batches={r.summary()[:150]}")
        ok &= (exc is not None) if fodl == "true" else (exc is None and want <= got)
print("RESULT", "OK" if ok else "FAIL")
