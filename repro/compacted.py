"""Compacted topic: offset gaps (incl. at the log end) and tombstones (null value).

    BS=127.0.0.1:39492 .venv/bin/python repro/compacted.py
"""
import sys, time, uuid
sys.path.insert(0, __import__("os").path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, reader, report, spark_session, truth

topic = new_topic(1, {"cleanup.policy": "compact", "segment.ms": "200", "min.cleanable.dirty.ratio": "0.001",
                      "delete.retention.ms": "600000", "min.compaction.lag.ms": "0", "segment.bytes": "4096"})
p = Producer({"bootstrap.servers": BS, "linger.ms": 0})
for r in range(5):
    for k in range(40):
        p.produce(topic, key=f"k{k}".encode(), value=None if (r == 4 and k % 5 == 0) else f"v{r}-{k}".encode())
    p.flush(10)
    time.sleep(0.3)
# the last records are overwritten too, so the log end sits after a gap once compacted
for k in range(30, 40):
    p.produce(topic, key=f"k{k}".encode(), value=b"final")
p.flush(10)
for i in range(3):
    p.produce(topic, key=b"k-last", value=f"last{i}".encode())
p.flush(10)
deadline = time.time() + 120
while time.time() < deadline:
    want = truth(topic, 1)
    if len(want) < 150:
        break
    time.sleep(5)
hi = max(o for _, o in want) + 1
print(f"compacted: {len(want)} records left of {hi} offsets, top offsets {sorted(want)[-4:]}")

spark = spark_session()
ok = True
rec = Recorder()
t0 = time.time()
q = (reader(spark, topic, startingOffsets="earliest", kafkaConsumer__pollTimeoutMs=20000)
     .writeStream.foreachBatch(rec).option("checkpointLocation", f"/tmp/adv19-ck/{uuid.uuid4().hex}")
     .trigger(availableNow=True).start())
fin = q.awaitTermination(90)
print(f"stream: finished={fin} in {time.time()-t0:.1f}s exc={str(q.exception())[:300] if q.exception() else None}")
if not fin:
    q.stop()
ok &= report("stream availableNow compacted", want, rec)
try:
    df = (spark.read.format("fastrebalance").option("kafka.bootstrap.servers", BS)
          .option("subscribe", topic).option("kafkaConsumer.pollTimeoutMs", "20000").load())
    rows = df.select("partition", "offset", "value").collect()
    got = {(r.partition, r.offset) for r in rows}
    nulls = sum(1 for r in rows if r.value is None)
    print(f"batch: {len(got)} rows, {nulls} null values, want {len(want)}, missing={len(want-got)} invented={len(got-want)}")
    ok &= got == want
    # ending offsets inside a gap
    gaps = [o for o in range(hi) if (0, o) not in want]
    if gaps:
        g = gaps[len(gaps) // 2]
        t0 = time.time()
        df = (spark.read.format("fastrebalance").option("kafka.bootstrap.servers", BS)
              .option("subscribe", topic).option("kafkaConsumer.pollTimeoutMs", "20000")
              .option("endingOffsets", f'{{"{topic}": {{"0": {g + 1}}}}}').load())
        got = {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}
        w = {k for k in want if k[1] <= g}
        print(f"batch ending at gap offset {g}+1: {len(got)} rows in {time.time()-t0:.1f}s want {len(w)}")
        ok &= got == w
except Exception as e:
    print(f"batch: FAILED: {str(e)[:600]}")
    ok = False
print("RESULT", "OK" if ok else "FAIL")
