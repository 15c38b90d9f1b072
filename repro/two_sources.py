"""Two fastrebalance sources in one query (union of two topics), restarted with a backlog
above the threshold in both and live traffic in one: every record of both in the sink,
replays identical.

    BS=127.0.0.1:39492 .venv/bin/python repro/two_sources.py
"""
import os, sys, threading, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer
from pyspark.sql import functions as F
from _util import BS, new_topic, produce, reader, spark_session, truth

spark = spark_session()
ta, tb = new_topic(2), new_topic(1)
produce(ta, 100, 2, "a"); produce(tb, 100, 1, "b")
opts = dict(startingOffsets="earliest", catchup__threshold=1000, catchup__firstBatchWaitMs=1500,
            catchup__maxOffsetsPerTrigger=3000, catchup__chunkSize=1000)
ck = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
attempts: dict[int, list[list]] = {}
def sink(df, bid):
    attempts.setdefault(bid, []).append(sorted((r.topic, r.partition, r.offset) for r in df.select("topic", "partition", "offset").collect()))
def seen():
    return {k for atts in attempts.values() for a in atts for k in a}
def start():
    df = reader(spark, ta, **opts).unionByName(reader(spark, tb, **opts))
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", ck).start()
q = start()
deadline = time.time() + 90
while len(seen()) < 200 and time.time() < deadline: time.sleep(0.5)
q.stop()
produce(ta, 8000, 2, "a-back"); produce(tb, 6000, 1, "b-back")
halt = threading.Event()
def live():
    p = Producer({"bootstrap.servers": BS, "linger.ms": 0}); i = 0
    while not halt.is_set():
        p.produce(ta, value=f"live-{i}".encode(), partition=i % 2); p.poll(0); i += 1; time.sleep(0.02)
    p.flush(10)
th = threading.Thread(target=live, daemon=True); th.start()
q = start()
time.sleep(20)
halt.set(); th.join()
want = {(ta,) + k for k in truth(ta, 2)} | {(tb,) + k for k in truth(tb, 1)}
deadline = time.time() + 120
while time.time() < deadline and not want <= seen(): time.sleep(1)
time.sleep(2); q.stop()
got = seen()
same = all(all(a == atts[0] for a in atts) for atts in attempts.values())
print(f"two sources: want {len(want)} got {len(got)} missing {len(want-got)} invented {len(got-want)} "
      f"replays_identical={same} batches={[(b, [len(a) for a in atts]) for b, atts in sorted(attempts.items())][:20]}")
print("RESULT", "OK" if want == got and same else "FAIL")
