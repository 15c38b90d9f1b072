"""Transactional topic (commit markers, aborted transactions): stream and batch read,
read_uncommitted and read_committed. Real broker only (the mock sends no aborted-txn list).

    BS=127.0.0.1:39492 .venv/bin/python repro/txn_topic.py
"""
import sys, time, uuid
sys.path.insert(0, __import__("os").path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, reader, report, spark_session, truth

topic = new_topic(2)
p = Producer({"bootstrap.servers": BS, "transactional.id": "adv19-" + uuid.uuid4().hex})
p.init_transactions(30)
for t in range(6):
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, value=f"t{t}-{i}".encode(), partition=i % 2)
    p.flush(30)  # abort_transaction purges what is not sent yet
    if t % 3 == 1:
        p.abort_transaction(30)
    else:
        p.commit_transaction(30)

spark = spark_session()
ok = True
for iso in ("read_uncommitted", "read_committed"):
    want = truth(topic, 2, iso)
    rec = Recorder()
    t0 = time.time()
    q = (reader(spark, topic, startingOffsets="earliest", kafka__isolation__level=iso,
                kafkaConsumer__pollTimeoutMs=20000)
         .writeStream.foreachBatch(rec).option("checkpointLocation", f"/tmp/adv19-ck/{uuid.uuid4().hex}")
         .trigger(availableNow=True).start())
    fin = q.awaitTermination(90)
    print(f"stream {iso}: finished={fin} in {time.time()-t0:.1f}s exc={str(q.exception())[:300] if q.exception() else None}")
    if not fin:
        q.stop()
    ok &= report(f"stream availableNow {iso}", want, rec)
    t0 = time.time()
    try:
        df = (spark.read.format("fastrebalance").option("kafka.bootstrap.servers", BS)
              .option("subscribe", topic).option("kafka.isolation.level", iso)
              .option("kafkaConsumer.pollTimeoutMs", "20000").load())
        rows = {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}
        print(f"batch {iso}: {len(rows)} rows in {time.time()-t0:.1f}s, want {len(want)}, "
              f"missing={len(want-rows)} invented={len(rows-want)}")
        ok &= rows == want
    except Exception as e:
        print(f"batch {iso}: FAILED after {time.time()-t0:.1f}s: {str(e)[:400]}")
        ok = False
print("RESULT", "OK" if ok else "FAIL")
