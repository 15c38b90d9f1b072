"""Odd option values and small admission limits, each as a new availableNow query.
Prints, per case, the error (first line) or what the sink got.

    BS=127.0.0.1:39492 .venv/bin/python repro/odd_options.py
"""
import sys, time, uuid
sys.path.insert(0, __import__("os").path.dirname(__file__))
from confluent_kafka import Producer
from _util import BS, Recorder, new_topic, reader, report, spark_session, truth

t4 = new_topic(4)
p = Producer({"bootstrap.servers": BS, "linger.ms": 5})
for i in range(1000):
    p.produce(t4, value=f"a-{i}".encode(), partition=0)
for q in (1, 2, 3):
    p.produce(t4, value=b"x", partition=q)
p.flush(10)
want4 = truth(t4, 4)
tiny = new_topic(1)
p.produce(tiny, value=b"only", partition=0); p.flush(10)
empty = new_topic(1)

spark = spark_session()

def why(exc):
    lines = [l.strip() for l in str(exc).splitlines() if "Error:" in l or "Exception:" in l]
    return (lines[-1] if lines else (str(exc).splitlines() or [""])[0])[:300]


def run(name, topic, want=None, timeout=120, **opts):
    rec = Recorder()
    t0 = time.time()
    try:
        q = (reader(spark, topic, **opts).writeStream.foreachBatch(rec)
             .option("checkpointLocation", f"/tmp/adv19-ck/{uuid.uuid4().hex}")
             .trigger(availableNow=True).start())
        fin = q.awaitTermination(timeout)
        if not fin:
            q.stop()
        exc = q.exception()
        print(f"[{name}] finished={fin} {time.time()-t0:.1f}s batches={len(rec.attempts)} rows={rec.count()}"
              f" exc={why(exc) if exc else None}", flush=True)
        if want is not None and exc is None:
            report(name, want, rec)
    except Exception as e:
        print(f"[{name}] raised at start: {why(e)}", flush=True)

run("maxOffsetsPerTrigger=10 skewed 1000/1/1/1", t4, want4, startingOffsets="earliest", maxOffsetsPerTrigger=10, timeout=240)
run("maxOffsetsPerTrigger=1", t4, None, startingOffsets="earliest", maxOffsetsPerTrigger=1, timeout=20)
run("maxOffsetsPerTrigger=0", t4, None, startingOffsets="earliest", maxOffsetsPerTrigger=0, timeout=20)
run("maxOffsetsPerTrigger=-5", t4, None, startingOffsets="earliest", maxOffsetsPerTrigger=-5, timeout=20)
run("one record", tiny, truth(tiny, 1), startingOffsets="earliest")
run("empty topic earliest", empty, set(), startingOffsets="earliest")
run("empty topic latest", empty, set())
run("offset beyond end", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": 999}}}}', timeout=30)
run("offset as string", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": "0"}}}}', timeout=30)
run("offset float", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": 0.5}}}}', timeout=30)
run("offset bool", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": true}}}}', timeout=30)
run("offset -3", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": -3}}}}', timeout=30)
run("partition 5 absent", tiny, None, startingOffsets=f'{{"{tiny}": {{"0": 0, "5": 0}}}}', timeout=30)
run("partition key ' 0'", tiny, None, startingOffsets=f'{{"{tiny}": {{" 0": 0}}}}', timeout=30)
run("partition key '00'", tiny, None, startingOffsets=f'{{"{tiny}": {{"00": 0}}}}', timeout=30)
run("other topic in JSON", tiny, None, startingOffsets=f'{{"{empty}": {{"0": 0}}}}', timeout=30)
run("JSON list", tiny, None, startingOffsets='[1,2]', timeout=30)
run("startingOffsets EARLIEST", tiny, None, startingOffsets='EARLIEST', timeout=30)
run("ts in future, error", tiny, None, startingTimestamp=str(int(time.time()*1000) + 10**8), timeout=30)
run("ts in future, latest", tiny, set(), startingTimestamp=str(int(time.time()*1000) + 10**8), startingOffsetsByTimestampStrategy="latest", timeout=30)
run("ts 0", tiny, truth(tiny, 1), startingTimestamp="0", timeout=30)
run("ts negative", tiny, None, startingTimestamp="-5", timeout=30)
run("subscribe missing topic", "adv19-does-not-exist-" + uuid.uuid4().hex[:6], None, timeout=30)
run("assign missing partition", tiny, None, assign=f'{{"{tiny}": [0, 3]}}', timeout=30)
run("assign empty", tiny, None, assign='{}', timeout=30)
run("subscribe ' , '", tiny, None, subscribe=' , ', timeout=30)
run("subscribe with spaces", tiny, truth(tiny, 1), subscribe=f' {tiny} , ', startingOffsets="earliest", timeout=30)
run("subscribePattern matches none", tiny, None, subscribePattern='zzz-nothing-.*', timeout=30)
run("minPartitions=0", tiny, None, minPartitions=0, startingOffsets="earliest", timeout=30)
run("minPartitions=50 skewed", t4, want4, minPartitions=50, startingOffsets="earliest", timeout=60)
run("maxRecordsPerPartition=7", t4, want4, maxRecordsPerPartition=7, startingOffsets="earliest", timeout=120)
run("catchup.chunkSize=0", t4, None, catchup__chunkSize=0, startingOffsets="earliest", timeout=30)
run("maxTriggerDelay=abc", t4, None, maxTriggerDelay="abc", startingOffsets="earliest", timeout=30)
run("failOnDataLoss=maybe", t4, None, failOnDataLoss="maybe", startingOffsets="earliest", timeout=30)
run("includeHeaders=yes", t4, None, includeHeaders="yes", startingOffsets="earliest", timeout=30)
