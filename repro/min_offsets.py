"""minOffsetsPerTrigger with a trickle of live records: batches must come every
maxTriggerDelay, and the tail (fewer than the minimum) must arrive within one delay.
Once with the default trigger, once with a processingTime trigger shorter than the delay.

    BS=127.0.0.1:39492 .venv/bin/python repro/min_offsets.py
"""
import os, sys, threading, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, reader, report, spark_session, truth

spark = spark_session()
ok = True
for trig in (sys.argv[1:] and [None if a == "default" else a for a in sys.argv[1:]]) or (None, "1 second"):
    topic = new_topic(2)
    rec = Recorder()
    times = {}
    def sink(df, bid):
        rec(df, bid); times[bid] = time.time()
    w = (reader(spark, topic, startingOffsets="earliest", minOffsetsPerTrigger=500, maxTriggerDelay="4s")
         .writeStream.foreachBatch(sink).option("checkpointLocation", f"/tmp/adv19-ck/{uuid.uuid4().hex}"))
    if trig:
        w = w.trigger(processingTime=trig)
    q = w.start()
    time.sleep(5)
    p = Producer({"bootstrap.servers": BS, "linger.ms": 0})
    t0 = time.time()
    i = 0
    while time.time() - t0 < 20:
        p.produce(topic, value=f"l-{i}".encode(), partition=i % 2); p.poll(0); i += 1; time.sleep(0.05)
    p.flush(10)
    end = time.time()
    want = truth(topic, 2)
    deadline = time.time() + 30
    while time.time() < deadline and not want <= rec.seen(): time.sleep(0.2)
    tail = time.time() - end
    q.stop()
    ts = [times[b] - t0 for b in sorted(times) if rec.attempts[b][-1]]
    sizes = [len(rec.attempts[b][-1]) for b in sorted(times) if rec.attempts[b][-1]]
    print(f"trigger={trig}: produced {i} over 20s; non-empty batches at {[round(t,1) for t in ts]} sizes {sizes}; "
          f"tail in sink {tail:.1f}s after the last produce")
    ok &= report(f"minOffsets trigger={trig}", want, rec) and tail < 12
print("RESULT", "OK" if ok else "FAIL")
