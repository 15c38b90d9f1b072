"""The Spark source over Spark Connect: a client with no JVM, the source in the server.

A Connect server is started the way docs/spark.md ("Spark Connect") tells a user to, from
the pyspark install's own ``sbin/start-connect-server.sh`` (``--wait``: in the foreground),
on 127.0.0.1, in a session of its own, and SIGKILLed with every JVM and Python worker of
that session when the module ends, even when a test fails. The client registers the source
over the wire; the source's code runs in the server's Python workers (this interpreter:
``PYSPARK_PYTHON``), the listener ``register()`` adds runs in the client.

The sink is the parquet file sink (exactly once, no Python process of its own on the
server), with ``current_timestamp()`` as a column: in a micro-batch it is the batch's own
timestamp, the same for every row of a batch and later for each later batch, so the rows
tell which batch delivered them without a ``foreachBatch`` callback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")
# the Spark Connect client's own needs (pyspark[connect], in fastrebalance[spark])
pytest.importorskip("pandas")
pytest.importorskip("grpc")
pytest.importorskip("grpc_status")
pytest.importorskip("zstandard")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

import pyspark
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fastrebalance.spark import register
from fastrebalance.spark._watch import pending_in
from fastrebalance.testing._sparkchaos import kill_session, session_members
from fastrebalance.testing._sparkpython import worker_python

from .test_spark_source import FreshProducer, produce

pytestmark = pytest.mark.integration

SPARK_HOME = Path(pyspark.__file__).parent
#: Where the server may listen: the first of these that is free.
PORTS = range(26015, 26100)
#: What a Connect session leaves in os.environ: with it set, a classic
#: ``SparkSession.builder.master(...)`` in this process (the next Spark module on this
#: worker) would build a Connect session instead.
_CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {PORTS}")


class ConnectServer:
    """``start-connect-server.sh --wait`` on 127.0.0.1, its JVM in a session of its own."""

    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        env = {k: v for k, v in os.environ.items() if k not in _CONNECT_ENV}
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(folder / "logs"),  # not under site-packages
            SPARK_PID_DIR=str(folder),
            # the source runs in the server's Python workers: this interpreter has it
            PYSPARK_PYTHON=worker_python(),  # pyspark with its bytecode cached: _sparkpython
        )
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        }
        command = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait"]
        command += ["--master", "local[2]", "--driver-memory", "1g"]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the gRPC port answers; fails with the log if the server died."""
        began = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the Connect server exited: {self.tail()}")
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise AssertionError(f"no Connect server after {timeout:g}s: {self.tail()}")
            time.sleep(0.25)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def close(self) -> list[int]:
        """SIGKILL the server's session; the processes still alive afterwards."""
        kill_session(self.proc.pid)
        self.proc.wait()
        return session_members(self.proc.pid)


@pytest.fixture(scope="module")
def connect(
    tmp_path_factory: pytest.TempPathFactory, kafka_cluster: Any
) -> Iterator[SparkSession]:
    if kafka_cluster.kind == "embedded":
        # A deployment of Spark, not a behaviour of Kafka: once per CI run is enough, and
        # in make test's serial Spark chain it cost 148 s of the 630 s that kept make test
        # over its 12 minutes. The source's reads are local[2]'s, which make test covers.
        pytest.skip(
            "Spark Connect runs on a real broker (make test-kafka, CI's Kafka 3.9 pass, or "
            "FASTREBALANCE_TEST_BOOTSTRAP)"
        )
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    saved = {k: os.environ.get(k) for k in _CONNECT_ENV}
    try:
        print(f"Connect server up after {server.wait_ready(180):.1f}s")
        session = SparkSession.builder.remote(server.url).getOrCreate()
        try:
            register(session)
            yield session
        finally:
            session.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        left = server.close()
        assert not left, f"processes of the Connect server left behind: {left}"


BACKLOG = 8000  # 2000 per partition, above catchup.threshold
OPTIONS = {
    "startingOffsets": "earliest",
    "kafka.fetch.wait.max.ms": "10",
    "catchup.threshold": "1000",
    "catchup.chunkSize": "1000",
    "catchup.maxOffsetsPerTrigger": "4000",
}


def _log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    # a consumer of the test's own thread, used and closed here
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-ends"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


#: Spark waits 10 s (hard-coded) for a Python process it starts to connect back; one that
#: compiles pyspark from its zip (no bytecode there) on a machine at load average 15-20
#: takes longer, and the query fails as it starts. Seen in this test's query start and in a
#: foreachBatch worker's.
_SLOW_WORKER = "Python worker failed to connect back"


def _until(start: Any, q: Any, done: Any, timeout: float = 120) -> Any:
    """Wait until ``done(q)``; a query that failed because Spark gave up on a slow Python
    worker starts again from its checkpoint (at most 4 times: a restart is what the test is
    about, and any other failure fails the test). Returns the query that got there."""
    deadline, retries = time.monotonic() + timeout, 4
    while not done(q):
        if not q.isActive:
            error = str(q.exception())
            if _SLOW_WORKER not in error or retries == 0:
                raise AssertionError(f"the query ended: {error}")
            print(f"the query ended ({_SLOW_WORKER}): starting it again")
            retries -= 1
            q = start()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s: {q.status}")
        time.sleep(0.2)
    return q


def test_restart_over_connect_reads_fresh_records_first_and_loses_nothing(
    connect: SparkSession, kafka_cluster: Any, topic_factory: Any, tmp_path: Path
) -> None:
    """Run, stop, 8000 records pile up, restart from the same checkpoint with live traffic:
    the first batch after the restart holds live records only, the backlog follows as
    catch-up, and every record of the topic is in the sink exactly once."""
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(4)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "ck")

    def start() -> Any:
        source = connect.readStream.format("fastrebalance").options(
            **{"kafka.bootstrap.servers": bs, "subscribe": topic, **OPTIONS}
        )
        rows = source.load().select(
            "partition",
            "offset",
            "catchup",
            F.substring_index(F.col("value").cast("string"), "-", 1).alias("tag"),
            F.current_timestamp().alias("batch_at"),
        )
        return (
            rows.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    began = time.monotonic()
    produce(bs, topic, 4, 400, "old")
    q = start()
    try:
        q = _until(start, q, lambda q: any(p["sources"][0]["endOffset"] for p in q.recentProgress))
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None

    produce(bs, topic, 4, BACKLOG, "backlog")
    fresh = FreshProducer(bs, topic, 4)
    fresh.start()
    restarted = time.monotonic()
    q = start()

    def drained(q: Any) -> bool:
        pending = [pending_in(p["sources"][0]["endOffset"]) for p in q.recentProgress]
        return any(pending) and pending[-1] == 0

    try:
        q = _until(start, q, drained)
        fresh.stop()
        q.processAllAvailable()
    finally:
        fresh.stop()
        with contextlib.suppress(Exception):
            q.stop()
    assert q.exception() is None
    caught_up = time.monotonic() - restarted

    rows = connect.read.parquet(out).collect()
    # every record of the topic, once: nothing missing, nothing twice
    seen = Counter((r.partition, r.offset) for r in rows)
    assert [k for k, n in seen.items() if n > 1] == []
    ends = _log_ends(bs, topic, 4)
    for p, end in ends.items():
        got = sorted(o for (q_, o) in seen if q_ == p)
        assert got == list(range(end)), f"partition {p}: {len(got)} of {end} records"
    tags = Counter(r.tag for r in rows)
    assert tags == {"old": 400, "backlog": BACKLOG, "fresh": fresh.sent}, tags

    # fresh records first: the restart's first batch holds live records only, and the
    # backlog (every record of it caught up: 2000 per partition > catchup.threshold)
    # comes in the batches after it
    assert all(r.catchup for r in rows if r.tag == "backlog")
    after = sorted({r.batch_at for r in rows if r.tag != "old"})
    first = [r for r in rows if r.batch_at == after[0]]
    assert any(r.tag == "fresh" for r in first) and not any(r.catchup for r in first), Counter(
        (r.tag, r.catchup) for r in first
    )
    backlog_batches = sorted({r.batch_at for r in rows if r.tag == "backlog"})
    assert backlog_batches[0] > after[0]
    print(
        f"restart: {len(after)} batches, backlog in {len(backlog_batches)};"
        f" caught up {caught_up:.1f}s after the restart; test {time.monotonic() - began:.1f}s"
    )
