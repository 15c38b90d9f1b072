"""Exactly-once end to end on a broker that stores transactional offsets (issue 20).

Each test runs a read-process-write pipeline (one output record per input, written in the
same producer transaction as both commit logs) through a situation that broke it on Apache
Kafka, then reads the output ``read_committed`` as a downstream consumer would and requires
every input exactly once:

* a worker SIGKILLed after sending its offsets, its transaction left open until it times out,
  while the next owner plans the partition (the broker answers UNSTABLE_OFFSET_COMMIT);
* a pipeline that crash-loops with a backlog pending (a range per restart, until no
  transaction could carry the token);
* one transactional producer per partition, two transactions open at once;
* a transaction held open across a rebalance, without any crash.

librdkafka's mock cluster drops transactional offset commits: these skip there.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Producer

from fastrebalance import Consumer, TopicPartition

from .helpers import base_conf, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.kafka4]

EOS = {
    "parallel.rebalance.transactional": True,
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
    "parallel.rebalance.lag.threshold": 100,
}
#: a dead worker's transaction blocks its group's offsets this long
TXN_TIMEOUT_MS = 10_000


def _producer(bs: str, txn_id: str | None = None) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bs,
            "transactional.id": txn_id or uuid.uuid4().hex,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    return p


def _seed(bs: str, group: str, topic: str, partitions: int = 1, offset: int = 0) -> None:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": group})
    c.commit(
        offsets=[TopicPartition(topic, p, offset) for p in range(partitions)],
        asynchronous=False,
    )
    c.close()


def _process(consumer: Consumer, producer: Producer, out: str, batch: list[Any]) -> None:
    """One transaction: an output per input (its partition and offset), both logs."""
    producer.begin_transaction()
    for m in batch:
        producer.produce(out, value=f"{m.partition()}:{m.offset()}".encode(), partition=0)
    consumer.send_offsets_to_transaction(producer, batch)
    consumer.commit_transaction(producer)


def _outputs(bs: str, out: str) -> Counter[str]:
    """The output topic as a read_committed reader sees it."""
    reader = PlainConsumer(
        {
            "bootstrap.servers": bs,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(out, 0, 0)])
    counts: Counter[str] = Counter()
    try:
        while True:
            m = reader.poll(5)
            if m is None:
                break
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    break
                continue
            counts[m.value().decode()] += 1
    finally:
        reader.close()
    return counts


def _expected(bs: str, topic: str, partitions: int = 1) -> set[str]:
    c = PlainConsumer({"bootstrap.servers": bs, "group.id": "watermarks"})
    try:
        out = set()
        for p in range(partitions):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            out |= {f"{p}:{o}" for o in range(high)}
        return out
    finally:
        c.close()


def _check_exactly_once(bs: str, topic: str, out: str, partitions: int = 1) -> None:
    counts = _outputs(bs, out)
    expected = _expected(bs, topic, partitions)
    twice = {v: n for v, n in counts.items() if n > 1}
    missing = expected - set(counts)
    assert not twice, f"{len(twice)} inputs written more than once, e.g. {sorted(twice)[:5]}"
    assert not missing, f"{len(missing)} inputs never written, e.g. {sorted(missing)[:5]}"
    assert set(counts) == expected


def _drain_exactly(
    consumer: Consumer, producer: Producer, out: str, want: int, timeout: float = 90.0
) -> int:
    """Process until ``want`` records in all went through committed transactions."""
    done = 0
    deadline = time.monotonic() + timeout
    while done < want:
        assert time.monotonic() < deadline, f"only {done} of {want} processed"
        batch = [m for m in consumer.consume(500, 0.2) if m.error() is None]
        if batch:
            _process(consumer, producer, out, batch)
            done += len(batch)
    return done


# ------------------------------------------------ 1. a dead worker's open transaction
_WORKER = """
import sys, time
from confluent_kafka import Producer
from fastrebalance import Consumer, TopicPartition
bs, group, topic, out, txn_id, threshold, txn_timeout = sys.argv[1:8]
c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.parallel.rebalance": True,
              "parallel.rebalance.transactional": True, "enable.auto.commit": False,
              "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
              "parallel.rebalance.lag.threshold": int(threshold)})
p = Producer({"bootstrap.servers": bs, "transactional.id": txn_id,
              "transaction.timeout.ms": int(txn_timeout), "linger.ms": 5})
p.init_transactions(30)
c.assign([TopicPartition(topic, 0)])
print("assigned", flush=True)
fresh = backlog = 0
while True:
    batch = [m for m in c.consume(100, 0.2) if m.error() is None]
    if not batch:
        continue
    p.begin_transaction()
    for m in batch:
        p.produce(out, value=f"0:{m.offset()}".encode(), partition=0)
    c.send_offsets_to_transaction(p, batch)
    if fresh >= 50 and backlog >= 500:
        p.flush(10)
        print("sent", flush=True)  # and never commits: SIGKILL comes
        time.sleep(600)
    c.commit_transaction(p)
    fresh += sum(1 for m in batch if m.offset() >= 3000)
    backlog += sum(1 for m in batch if m.offset() < 3000)
"""


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The worker's lines as they come ("" at its end), so that each wait has a bound: a
    worker stuck before its next line fails the test instead of hanging it."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put("")

    threading.Thread(target=pump, name="eos-worker-lines", daemon=True).start()
    return lines


def test_a_dead_workers_open_transaction_duplicates_nothing(
    transactional_cluster: Any, topic_factory: Any, unique_group: str
) -> None:
    """Issue 20: a worker SIGKILLed after send_offsets_to_transaction() and before its
    commit leaves its transaction open until transaction.timeout.ms; meanwhile the broker
    answers the next owner's offset fetch with UNSTABLE_OFFSET_COMMIT. The next owner used
    to give up planning and resume at the safe offset, re-processing fresh records whose
    output was committed (660 and 1,580 duplicates). It now waits, the partition paused,
    until it can plan from what the logs say, as plain confluent-kafka waits for stable
    offsets: at most the dead transaction's timeout."""
    bs = transactional_cluster.bootstrap_servers
    topic, out = topic_factory(1), topic_factory(1)
    produce(bs, topic, 3000)
    _seed(bs, unique_group, topic)
    # longer than the 30 s the planner used to wait before it gave up (60 s by default)
    args = [bs, unique_group, topic, out, uuid.uuid4().hex, "100", "40000"]
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = _lines(worker)
        assert lines.get(timeout=60) == "assigned"
        produce(bs, topic, 200, start=3000)  # fresh records after the restart
        line = lines.get(timeout=120)
        assert line == "sent", f"the worker ended early: {line!r}"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    killed_at = time.monotonic()

    c = Consumer(base_conf(bs, unique_group, **EOS))
    producer = _producer(bs)  # another transactional.id: nothing fences the dead one
    try:
        c.assign([TopicPartition(topic, 0)])
        assigned_s = time.monotonic() - killed_at
        produce(bs, topic, 100, start=3200)
        deadline = time.monotonic() + 120
        while set(_outputs(bs, out)) != _expected(bs, topic):
            assert time.monotonic() < deadline, "the pipeline did not finish"
            batch = [m for m in c.consume(500, 0.2) if m.error() is None]
            if batch:
                _process(c, producer, out, batch)
    finally:
        c.close()
    _check_exactly_once(bs, topic, out)
    # and the first plan waited no more than its short budget inside assign()
    assert assigned_s < 15, f"assign() took {assigned_s:.1f}s"


# --------------------------------------------------------- 2. a crash loop's ranges
def test_a_crash_loop_never_makes_a_token_no_transaction_can_carry(
    transactional_cluster: Any, topic_factory: Any, unique_group: str
) -> None:
    """Issue 20: each restart with a pending backlog (a poison record, a bad deploy) added a
    range; after ~48 restarts with a 256-byte budget every send_offsets_to_transaction()
    raised OFFSET_METADATA_TOO_LARGE for good. A plan in exactly-once mode now adds a range
    only while the token still fits; past that the primary reads the new backlog in
    order. Here each incarnation processes a few fresh records and dies before the child's
    backlog is done; then a healthy one drains everything, each input written once."""
    bs = transactional_cluster.bootstrap_servers
    topic, out = topic_factory(1), topic_factory(1)
    produce(bs, topic, 1000)
    _seed(bs, unique_group, topic)
    conf = base_conf(
        bs, unique_group, **EOS, **{"parallel.rebalance.metadata.max.bytes": 256}
    )
    producer = _producer(bs)
    end = 1000
    declined = 0
    for _ in range(40):
        produce(bs, topic, 150, start=end)  # the backlog of this restart
        end += 150
        c = Consumer(conf)
        try:
            c.assign([TopicPartition(topic, 0)])
            status = c.catchup_status().get((topic, 0))
            pending = status.pending_ranges if status is not None else ()
            if not pending or pending[-1][1] != end:
                declined += 1  # no new range: the primary reads this backlog in order
            produce(bs, topic, 5, start=end)
            end += 5
            # This incarnation processes what its primary hands out (in order: the fresh
            # records, or the backlog too when no range was added) and dies before any
            # backlog record of the child's is processed.
            mine: list[Any] = []
            deadline = time.monotonic() + 30
            while not mine or mine[-1].offset() < end - 1:
                assert time.monotonic() < deadline, "the primary's records did not come"
                mine += [
                    m
                    for m in c.consume(50, 0.2)
                    if m.error() is None and not any(s <= m.offset() < e for s, e in pending)
                ]
            _process(c, producer, out, mine)
        finally:
            c.close()
    assert declined > 0, "the budget was never reached: the test proves nothing"
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 120
        while set(_outputs(bs, out)) != _expected(bs, topic):
            assert time.monotonic() < deadline, "the healthy run did not finish"
            batch = [m for m in c.consume(500, 0.2) if m.error() is None]
            if batch:
                _process(c, producer, out, batch)  # never OFFSET_METADATA_TOO_LARGE
    finally:
        c.close()
    # every fresh record of the crash loop was processed once; the rest exactly once
    counts = _outputs(bs, out)
    assert max(counts.values()) == 1, [v for v, n in counts.items() if n > 1][:5]


# ----------------------------------------------- 3. one producer per partition
def test_one_producer_per_partition_two_open_transactions(
    transactional_cluster: Any, topic_factory: Any, unique_group: str
) -> None:
    """Issue 20: with a transactional producer per partition, two transactions are open at
    once. Sending offsets with the second producer used to rewind every partition, and the
    first one's commit never applied its progress (200-625 outputs written more than once).
    Each producer's transaction is now its own; a restart resumes after exactly what both
    committed."""
    bs = transactional_cluster.bootstrap_servers
    topic, out = topic_factory(2), topic_factory(1)
    for p in (0, 1):
        produce(bs, topic, 1500, partition=p)
    _seed(bs, unique_group, topic, partitions=2)
    producers = {p: _producer(bs) for p in (0, 1)}
    c = Consumer(base_conf(bs, unique_group, **EOS))
    try:
        c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        for p in (0, 1):
            produce(bs, topic, 50, partition=p, start=1500)
        processed = 0
        deadline = time.monotonic() + 90
        while processed < 3100:
            assert time.monotonic() < deadline, f"only {processed} of 3100"
            batch = [m for m in c.consume(400, 0.2) if m.error() is None]
            by_partition = {p: [m for m in batch if m.partition() == p] for p in (0, 1)}
            open_now = [p for p in (0, 1) if by_partition[p]]
            for p in open_now:  # both open before either commits
                producers[p].begin_transaction()
                for m in by_partition[p]:
                    producers[p].produce(
                        out, value=f"{p}:{m.offset()}".encode(), partition=0
                    )
                c.send_offsets_to_transaction(producers[p], by_partition[p])
            for p in open_now:
                c.commit_transaction(producers[p])
                processed += len(by_partition[p])
        # two transactions cannot claim one partition: refused, clearly
        more = []
        for p in (0, 1):
            produce(bs, topic, 5, partition=p, start=1550)
        deadline = time.monotonic() + 30
        while not any(m.partition() == 0 for m in more):
            assert time.monotonic() < deadline, "partition 0's new records never came"
            more += [m for m in c.consume(100, 0.5) if m.error() is None]
        first = [m for m in more if m.partition() == 0][:1]
        producers[0].begin_transaction()
        producers[1].begin_transaction()
        c.send_offsets_to_transaction(producers[0], first)
        with pytest.raises(KafkaException) as info:
            c.send_offsets_to_transaction(producers[1], first)
        assert info.value.args[0].code() == KafkaError._STATE
        assert "another open transaction" in info.value.args[0].str()
        c.abort_transaction(producers[0])
        producers[1].abort_transaction(10)
    finally:
        c.close()
    # a restart processes what is left, exactly once
    c = Consumer(base_conf(bs, unique_group, **EOS))
    single = _producer(bs)
    try:
        c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        deadline = time.monotonic() + 60
        while set(_outputs(bs, out)) != _expected(bs, topic, 2):
            assert time.monotonic() < deadline, "the restart did not finish"
            batch = [m for m in c.consume(500, 0.2) if m.error() is None]
            if batch:
                _process(c, single, out, batch)
    finally:
        c.close()
    _check_exactly_once(bs, topic, out, partitions=2)


# -------------------------------------- 4. a transaction held across a rebalance
def test_a_transaction_held_across_a_rebalance_duplicates_nothing(
    transactional_cluster: Any, topic_factory: Any, unique_group: str
) -> None:
    """Issue 20: a healthy worker keeps its transaction open across several consume() calls
    while a second worker joins. Both used to stall 30 s planning (the open transaction
    blocks the offset read, the first worker's own included), then 2,480 outputs were
    committed twice. Partitions whose offsets are held by an open transaction now wait,
    paused, while every call returns; the first worker commits, and the plans read what
    it committed. No stall, no duplicate."""
    bs = transactional_cluster.bootstrap_servers
    topic, out = topic_factory(4), topic_factory(1)
    for p in range(4):
        produce(bs, topic, 1000, partition=p)
    _seed(bs, unique_group, topic, partitions=4)
    conf = base_conf(bs, unique_group, **EOS, **{"partition.assignment.strategy": "range"})
    first, second = Consumer(conf), Consumer(conf)
    producers = {first: _producer(bs), second: _producer(bs)}
    open_txn = {first: [], second: []}  # records in each worker's open transaction
    slowest = 0.0

    def step(c: Consumer, hold: bool) -> None:
        nonlocal slowest
        began = time.monotonic()
        batch = [m for m in c.consume(200, 0.1) if m.error() is None]
        slowest = max(slowest, time.monotonic() - began)
        p = producers[c]
        if batch:
            if not open_txn[c]:
                p.begin_transaction()
            for m in batch:
                p.produce(out, value=f"{m.partition()}:{m.offset()}".encode(), partition=0)
            try:
                c.send_offsets_to_transaction(p, batch)
            except KafkaException:  # a partition left meanwhile: its records come again
                c.abort_transaction(p)
                open_txn[c] = []
                return
            open_txn[c] += batch
        if open_txn[c] and not hold:
            c.commit_transaction(p)
            open_txn[c] = []

    try:
        first.subscribe([topic])
        for p in range(4):
            produce(bs, topic, 50, partition=p, start=1000)
        deadline = time.monotonic() + 60
        while len(open_txn[first]) < 300:  # the transaction stays open meanwhile
            assert time.monotonic() < deadline, "the first worker got nothing"
            step(first, hold=True)
        second.subscribe([topic])
        for _ in range(10):  # the rebalance happens while the transaction is open
            step(first, hold=True)
            step(second, hold=False)
        deadline = time.monotonic() + 120
        while set(_outputs(bs, out)) != _expected(bs, topic, 4):
            assert time.monotonic() < deadline, "the group did not finish"
            for _ in range(20):
                step(first, hold=False)
                step(second, hold=False)
    finally:
        for c in (first, second):
            c.close()
    assert slowest < 10, f"a consume(0.1) took {slowest:.1f}s"
    _check_exactly_once(bs, topic, out, partitions=4)


# ----------------------------------- 5. aborting one of several producers' transactions
def test_aborting_one_producers_transaction_rewinds_only_its_partitions(
    transactional_cluster: Any, topic_factory: Any, unique_group: str
) -> None:
    """Adversary round 6: one producer per partition; producer 0's transaction is aborted
    before producer 1 sent its offsets. The abort rewound every partition no open
    transaction had claimed yet, partition 1 included, whose records producer 1 then
    committed twice (20 outputs twice per run). An abort now rewinds what its
    ``messages`` held; without them (a later batch here), the partitions its own
    transactions claimed last, never another producer's."""
    bs = transactional_cluster.bootstrap_servers
    topic, out = topic_factory(2), topic_factory(1)
    for p in (0, 1):
        produce(bs, topic, 300, partition=p)
    _seed(bs, unique_group, topic, partitions=2)
    producers = {p: _producer(bs) for p in (0, 1)}
    conf = base_conf(bs, unique_group, **{**EOS, "parallel.rebalance.lag.threshold": 100_000})
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        batches = 0
        deadline = time.monotonic() + 90
        while set(_outputs(bs, out)) != _expected(bs, topic, 2):
            assert time.monotonic() < deadline, "the pipeline did not finish"
            msgs = [m for m in c.consume(60, 0.3) if m.error() is None]
            while batches == 0 and msgs and len({m.partition() for m in msgs}) < 2:
                assert time.monotonic() < deadline, "the first batch never held both partitions"
                msgs += [m for m in c.consume(60, 0.3) if m.error() is None]
            if not msgs:
                continue
            batches += 1
            by_partition: dict[int, list[Any]] = {}
            for m in msgs:
                by_partition.setdefault(m.partition(), []).append(m)
            for p, ms in by_partition.items():
                producers[p].begin_transaction()
                for m in ms:
                    producers[p].produce(out, value=f"{p}:{m.offset()}".encode(), partition=0)
            if batches in (1, 3) and 0 in by_partition:
                # an application error while processing partition 0: on the first batch
                # the abort says what it held; on the third it relies on ownership
                held = by_partition.pop(0)
                c.abort_transaction(producers[0], messages=held if batches == 1 else None)
            for p, ms in by_partition.items():
                c.send_offsets_to_transaction(producers[p], ms)
                c.commit_transaction(producers[p])
    finally:
        c.close()
    _check_exactly_once(bs, topic, out, partitions=2)
