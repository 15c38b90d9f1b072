"""Topics and partitions that change: (A) a topic deleted and recreated while the query is
down, (B) partitions added while it is down, with a backlog above the threshold in them,
(C) a subscribePattern topic that appears mid-query already holding a backlog,
(D) headers with a null value, null key and null value.

    BS=127.0.0.1:39492 .venv/bin/python repro/topic_changes.py [A B C D]
"""
import os, shutil, sys, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from _util import BS, Recorder, new_topic, produce, reader, report, spark_session, truth

spark = spark_session()
admin = AdminClient({"bootstrap.servers": BS})
which = sys.argv[1:] or ["A", "B", "C", "D"]
ok = True


class Values:
    def __init__(self): self.v = []
    def __call__(self, df, bid):
        self.v += [r.value.decode() for r in df.select("value").collect()]


def avail(df, sink, ck, timeout=120):
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", ck).trigger(availableNow=True).start()
    try:
        fin = q.awaitTermination(timeout)
    except Exception:
        fin = True
    if not fin:
        q.stop()
    exc = q.exception()
    lines = [l.strip() for l in str(exc).splitlines() if "Error:" in l] if exc else []
    return fin, (lines[-1][:300] if lines else (str(exc)[:200] if exc else None))


if "A" in which:
    root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
    t = new_topic(2)
    produce(t, 500, 2, "first")
    s = Values()
    print("A run1", avail(reader(spark, t, startingOffsets="earliest"), s, root + "/ck"), len(s.v))
    admin.delete_topics([t])[t].result(30)
    time.sleep(3)
    new_topic(2, name=t)
    produce(t, 100, 2, "second")
    for fodl in ("true", "false"):
        ck = f"{root}/{fodl}"; shutil.copytree(root + "/ck", ck)
        s2 = Values()
        fin, exc = avail(reader(spark, t, startingOffsets="earliest", failOnDataLoss=fodl), s2, ck, 60)
        second = sum(1 for v in s2.v if v.startswith("second"))
        print(f"A recreated, failOnDataLoss={fodl}: finished={fin} exc={exc} second-gen records delivered {second}/100")
        ok &= (exc is not None) if fodl == "true" else (exc is None and second == 100)

if "B" in which:
    root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
    t = new_topic(1)
    produce(t, 100, 1, "old")
    rec = Recorder()
    q = reader(spark, t, startingOffsets="earliest").writeStream.foreachBatch(rec).option("checkpointLocation", root).start()
    deadline = time.time() + 60
    while rec.count() < 100 and time.time() < deadline: time.sleep(0.5)
    q.stop()
    admin.create_partitions([NewPartitions(t, 3)])[t].result(30)
    time.sleep(2)
    p = Producer({"bootstrap.servers": BS, "linger.ms": 5})
    for i in range(36000):
        p.produce(t, value=f"n-{i}".encode(), partition=i % 3)
        if i % 5000 == 0: p.poll(0)
    p.flush(30)
    want = truth(t, 3)
    q = reader(spark, t, startingOffsets="earliest").writeStream.foreachBatch(rec).option("checkpointLocation", root).start()
    deadline = time.time() + 180
    while time.time() < deadline and not want <= rec.seen(): time.sleep(1)
    time.sleep(2); q.stop()
    ok &= report("B partitions added while down, 12k backlog each", want, rec)

if "C" in which:
    root = f"/tmp/adv19-ck/{uuid.uuid4().hex}"
    prefix = f"adv19pat{uuid.uuid4().hex[:6]}"
    t1 = new_topic(1, name=prefix + "-a")
    produce(t1, 50, 1, "a")
    rec = Recorder()
    q = (reader(spark, t1, subscribePattern=prefix + "-.*", startingOffsets="earliest", catchup__threshold=1000)
         .writeStream.foreachBatch(rec).option("checkpointLocation", root).start())
    deadline = time.time() + 60
    while rec.count() < 50 and time.time() < deadline: time.sleep(0.5)
    t2 = new_topic(2, name=prefix + "-b")
    produce(t2, 30000, 2, "b")
    produce(t1, 50, 1, "a2")
    want = {("a",) + k for k in truth(t1, 1)} | {("b",) + k for k in truth(t2, 2)}
    seen = set()
    class Rec2:
        def __call__(self, df, bid): pass
    deadline = time.time() + 120
    while time.time() < deadline and rec.count() < len(want): time.sleep(1)
    time.sleep(2); q.stop()
    print(f"C pattern topic appeared with 30000 records: sink rows {rec.count()} want {len(want)} replays_identical={rec.replays_identical()} batches={rec.summary()[:200]}")
    ok &= rec.count() == len(want)

if "D" in which:
    t = new_topic(1)
    p = Producer({"bootstrap.servers": BS})
    p.produce(t, key=None, value=None, headers=[("h1", None), ("h2", b"x"), ("h1", b"dup")])
    p.produce(t, key=b"k", value=b"v", headers=[])
    p.produce(t, key=b"k", value=b"", headers=[("", b"")])
    p.flush(10)
    for kind in ("batch", "stream"):
        try:
            if kind == "batch":
                rows = (spark.read.format("fastrebalance").option("kafka.bootstrap.servers", BS)
                        .option("subscribe", t).option("includeHeaders", "true").load()).collect()
            else:
                got = []
                def keep(df, bid): got.extend(df.collect())
                fin, exc = avail(reader(spark, t, startingOffsets="earliest", includeHeaders="true"), keep,
                                 f"/tmp/adv19-ck/{uuid.uuid4().hex}", 60)
                rows = got
                print("D stream exc", exc)
            for r in rows:
                print(f"D {kind}: offset={r.offset} key={r.key!r} value={r.value!r} headers={r.headers}")
            ok &= len(rows) == 3
        except Exception as e:
            print(f"D {kind} failed: {str(e)[:300]}"); ok = False
print("RESULT", "OK" if ok else "FAIL")
