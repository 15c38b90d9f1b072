"""Batch reads (spark.read) with odd startingOffsets/endingOffsets.

    BS=127.0.0.1:39492 .venv/bin/python repro/batch_edges.py
"""
import os, sys, time
sys.path.insert(0, os.path.dirname(__file__))
from _util import BS, new_topic, produce, spark_session

spark = spark_session()
t = new_topic(2)
produce(t, 20, 2)   # 10 per partition
def read(name, **o):
    r = spark.read.format("fastrebalance").option("kafka.bootstrap.servers", BS).option("subscribe", t) \
        .option("kafkaConsumer.pollTimeoutMs", "15000")
    for k, v in o.items():
        r = r.option(k, v)
    t0 = time.time()
    try:
        rows = r.load().select("partition", "offset").collect()
        print(f"[{name}] {len(rows)} rows in {time.time()-t0:.1f}s: {sorted((x.partition, x.offset) for x in rows)[:6]}...", flush=True)
    except Exception as e:
        lines = [l.strip() for l in str(e).splitlines() if "Error:" in l or "Exception:" in l]
        print(f"[{name}] error after {time.time()-t0:.1f}s: {(lines[-1] if lines else str(e).splitlines()[0])[:300]}", flush=True)
J = lambda a, b: f'{{"{t}": {{"0": {a}, "1": {b}}}}}'
read("ending beyond log end", endingOffsets=J(50, -1))
read("ending below starting", startingOffsets=J(8, 0), endingOffsets=J(3, -1))
read("ending == starting", startingOffsets=J(4, 4), endingOffsets=J(4, 4))
read("ending -2 (earliest)", endingOffsets=J(-2, -1))
read("ending 'earliest'", endingOffsets="earliest")
read("starting latest", startingOffsets="latest")
read("starting -1 in JSON", startingOffsets=J(-1, 0))
read("ending partial JSON", endingOffsets=f'{{"{t}": {{"0": 5}}}}')
read("endingTimestamp 0", endingTimestamp="0")
read("startingOffsets beyond end", startingOffsets=J(50, 0))
