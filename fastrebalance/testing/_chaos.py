"""The chaos harness: real processes, random faults, and a proof that no record was lost.

``run_chaos(ChaosSettings(...))`` runs, against an embedded (or given) Kafka cluster:

* a producer writing uniquely numbered records (value ``str(i)``) at a steady rate;
* N consumer processes (``fastrebalance.testing._crashworker``: a ``fastrebalance.Consumer``
  with the mode on) in one group, each appending every record it is handed to its own log
  file, which it flushes and fsyncs *before* each commit. Each process is, at random (from
  the seed; each round of starts has every mode once), an *in-order* worker (consume,
  process, fsync, commit) or an *asynchronous pipeline* (batches held and processed out of
  order, commits made seconds late, often after the partition moved: every commit still
  true);
* a fault injector drawing from a seeded ``random.Random`` (the seed is printed first, so
  a failure replays): SIGKILL at random moments, SIGKILL while the child is mid-range (the
  worker kills itself halfway through a batch of backlog records), SIGKILL while a commit is
  in flight (the worker kills itself from a timer started just before its commit), SIGKILL
  of a young process (joining, planning), SIGSTOP/SIGCONT for longer than
  ``session.timeout.ms`` and ``max.poll.interval.ms`` (a zombie that wakes up fenced), clean
  restarts (SIGTERM), members added and removed, and the broker process itself paused
  (SIGSTOP, then SIGCONT: its data survives);
* a sampler reading the group's committed offsets with a plain ``confluent_kafka.Consumer``
  every ``sample_interval_s``, then the size of every worker log;
* optionally a CPU hog (``cpu_hog`` busy processes beside it all: a loaded machine).

At the end it drains (faults stop, everything resumes, the group catches up to the log
end) and checks:

* **at-least-once**: every produced record is in some worker log; a record missing from
  every log counts as *lost*, unless retention deleted it before anyone read it (then it is
  counted apart as *deleted by retention*, never as delivered);
* **duplicates** are counted and reported (at-least-once allows them);
* **the stored offset never ran ahead of processing**: at every sample, every offset the
  bare committed offset declares processed (what any tool sees), and every offset the range
  token plus the child's checkpoint declare processed (what the next owner restores), was
  already in a log at that moment;
* **latency**: produce-to-processing percentiles of each record's first delivery, for the
  records the primary delivered (fresh) and for all of them;
* **shutdown bounds**: every clean shutdown (SIGTERM) is timed step by step from the worker's
  events and held against the library's documented bounds (``documented_bounds``): the call
  under way when SIGTERM came, the final synchronous commit, ``close()``. A worker that does
  not exit in time is reported with the bound it broke and its thread stacks.

Why processes and signals: a crash of the Python process is the event whose consequences
the library's contract is about (two commit logs, checkpointed tokens). Threads cannot be
SIGKILLed, and an in-process broker would die with them.

This module runs the experiment; each concern has its own: ``_chaos_settings`` (what a run
is), ``_chaos_workers`` (the consumer processes, their shutdown bounds), ``_chaos_faults``
(the injector, the CPU hog), ``_chaos_check`` (logs, samples, the checks, the summary).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException, TopicPartition

from fastrebalance.testing._chaos_check import (
    ChaosResult,
    OffsetSampler,
    check,
    check_output,
    format_summary,
)
from fastrebalance.testing._chaos_faults import FaultInjector, start_cpu_hog, stop_cpu_hog
from fastrebalance.testing._chaos_settings import (
    ALL_FAULTS,
    ALL_WORKER_MODES,
    BROKER_FAULTS,
    KILL_FAULTS,
    OUTPUT_SUFFIX,
    WORKER_MODES,
    ChaosSettings,
    parse_duration,
)
from fastrebalance.testing._chaos_workers import Fleet
from fastrebalance.testing._workload import PacedProducer

__all__ = [
    "ALL_FAULTS",
    "ALL_WORKER_MODES",
    "BROKER_FAULTS",
    "KILL_FAULTS",
    "WORKER_MODES",
    "ChaosResult",
    "ChaosSettings",
    "SteadyProducer",
    "format_summary",
    "parse_duration",
    "run_chaos",
]

#: The drain ends when it stalls for drain_timeout_s, and at the latest after this many.
DRAIN_CAP_FACTOR = 10


class SteadyProducer(PacedProducer):
    """Writes value=str(i), i = 0, 1, ..., round-robin over the partitions at a steady rate.

    Idempotent, so a broker pause or a retried request cannot reorder or duplicate records:
    the check maps each value to exactly one (partition, offset).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float,
        linger_ms: int = 5,
        compression: str = "none",
    ) -> None:
        conf = {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "enable.idempotence": True,
            "compression.type": compression,
            "message.timeout.ms": 600000,  # outlast any broker pause
        }
        super().__init__(conf, rate, "chaos-producer")
        self.topic, self.partitions = topic, partitions
        self.delivered: dict[int, tuple[int, int]] = {}  #: value -> (partition, offset)
        self.failed: dict[int, str] = {}

    def record(self, seq: int) -> tuple[str, int, bytes]:
        return self.topic, seq % self.partitions, str(seq).encode()

    def on_delivery(self, err: Any, msg: Any) -> None:
        value = int(msg.value())
        if err is not None:
            self.failed[value] = str(err)
        else:
            self.delivered[value] = (msg.partition(), msg.offset())


# ---------------------------------------------------------------------------- the run
def _default_seed() -> int:
    return random.SystemRandom().randrange(1 << 32)


def run_chaos(
    settings: ChaosSettings,
    cluster: Any = None,
    out: Callable[[str], None] = print,
) -> ChaosResult:
    """Run one chaos experiment and check it; see the module docstring.

    Args:
        settings: what to run; ``settings.seed`` replays a previous run's fault schedule.
        cluster: a running cluster (``EmbeddedKafka`` enables the broker-pause fault); None
            starts an embedded one, or uses ``settings.bootstrap_servers``.
        out: where progress lines go (the seed first).
    """
    settings.validate()
    seed = settings.seed if settings.seed is not None else _default_seed()
    rng = random.Random(seed)
    workdir = settings.workdir or Path(tempfile.mkdtemp(prefix="fastrebalance-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = ChaosResult(seed, settings, workdir)
    out(f"chaos: seed={seed} (replay with --seed {seed}); logs in {workdir}")
    hogs = start_cpu_hog(settings.cpu_hog)
    if hogs:
        out(f"chaos: CPU hog: {len(hogs)} busy processes (pids {[h.pid for h in hogs]})")
    own_cluster: Any = None
    try:
        if cluster is None:
            if settings.bootstrap_servers:
                from fastrebalance.testing._clusters import ExternalKafka

                own_cluster = cluster = ExternalKafka(settings.bootstrap_servers)
            elif settings.kafka_home is not None:
                from fastrebalance.testing._apache import ApacheKafka

                own_cluster = cluster = ApacheKafka(settings.kafka_home)
                out(f"chaos: Apache Kafka of its own at {cluster.bootstrap_servers}")
            else:
                from fastrebalance.testing._embedded import EmbeddedKafka

                own_cluster = cluster = EmbeddedKafka()
        return _run(settings, cluster, rng, result, out)
    finally:
        stop_cpu_hog(hogs)
        if own_cluster is not None:
            own_cluster.close()


def _run(
    settings: ChaosSettings,
    cluster: Any,
    rng: random.Random,
    result: ChaosResult,
    out: Callable[[str], None],
) -> ChaosResult:
    s = settings
    t0 = time.monotonic()
    bootstrap = cluster.bootstrap_servers
    result.topic = topic = f"chaos-{uuid4().hex[:8]}"
    result.group = group = f"chaos-{uuid4().hex[:8]}"
    if s.eos:
        from fastrebalance.testing._clusters import transactions_supported

        supported, why = transactions_supported(cluster)
        if not supported:
            raise RuntimeError(f"eos workers need transactions: {why}")
        cluster.create_topic(topic + OUTPUT_SUFFIX, s.partitions)
    cluster.create_topic(topic, s.partitions)
    if s.protocol == "consumer" and getattr(cluster, "kind", "") != "embedded":
        # a killed member's partitions move after the group's session timeout: the same as
        # the classic groups' where the broker takes a per-group one (Apache Kafka 4; the
        # embedded cluster has one for all groups and leaves the request unanswered)
        from fastrebalance.testing._clusters import set_consumer_group_timeouts

        took, why = set_consumer_group_timeouts(bootstrap, group, s.session_timeout_ms)
        out(f"chaos: group session timeout {s.session_timeout_ms} ms" if took else
            f"chaos: the broker's group session timeout applies ({why})")
    for kind, method in BROKER_FAULTS.items():
        if kind in s.faults and not hasattr(cluster, method):
            out(f"chaos: {kind} needs a broker of the run's own; skipped on this one")
    producer = SteadyProducer(bootstrap, topic, s.partitions, s.rate, s.linger_ms, s.compression)
    fleet = Fleet(bootstrap, topic, group, s, result.workdir, result.seed)
    injector = FaultInjector(fleet, rng, s, cluster, out)
    sampler = OffsetSampler(
        bootstrap, topic, group, s.partitions, fleet.log_paths, s.sample_interval_s
    )
    probe = PlainConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group + ".probe", "log_level": 2}
    )
    try:
        for _ in range(s.workers):
            fleet.add()
        producer.start()
        sampler.start()
        _warm_up(sampler, s.warmup_timeout_s, out)
        out(
            f"chaos: {s.workers} workers, {s.partitions} partitions, {s.rate:g} records/s, "
            f"faults for {s.duration_s:g}s"
        )
        chaos_start = time.monotonic()
        end = chaos_start + s.duration_s
        hard_end = end + max(60.0, s.duration_s * 0.5)  # room to reach min_faults
        next_fault = time.monotonic() + rng.uniform(*s.fault_gap_s)
        while True:
            now = time.monotonic()
            total = sum(injector.counts.values())
            enough = total >= s.min_faults and not (s.every_fault and injector.missing())
            if now >= hard_end or (now >= end and enough):
                break
            injector.run_due()
            fleet.check_alive()
            if now >= next_fault:
                injector.inject()
                next_fault = time.monotonic() + rng.uniform(*s.fault_gap_s)
            time.sleep(0.05)
        injector.finish()
        chaos_end = time.monotonic()
        result.chaos_seconds = chaos_end - chaos_start
        undelivered = producer.stop(flush_timeout=120.0)
        if producer.error is not None:
            raise RuntimeError(f"the producer failed: {producer.error}") from producer.error
        out(
            f"chaos: faults over after {result.chaos_seconds:.0f}s: {injector.counts.total()} "
            f"faults, {producer.sent:,} records produced ({undelivered} undelivered); draining"
        )
        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(s.partitions)
        }
        high = {p: h for p, (_, h) in marks.items()}

        def committed() -> list[int]:
            """The group's committed offset per partition (-1: unknown or unreadable)."""
            try:
                got = sampler.read_group()
            except KafkaException:
                return [-1] * len(high)
            return [got.get(p, (-1, None))[0] for p in high]

        # The drain fails when it stalls: no committed offset moved for drain_timeout_s.
        # A loaded machine drains slowly, not wrongly; a hard cap still ends a crawl.
        started = time.monotonic()
        stalled_at, seen = started + s.drain_timeout_s, -1
        while True:
            offsets = committed()
            if ok := all(o >= high[p] for p, o in zip(high, offsets, strict=True)):
                break
            now, total = time.monotonic(), sum(max(o, 0) for o in offsets)
            if total > seen:
                seen, stalled_at = total, now + s.drain_timeout_s
            if now >= stalled_at or now >= started + DRAIN_CAP_FACTOR * s.drain_timeout_s:
                break
            fleet.check_alive()
            time.sleep(0.5)
        result.drained = ok
        result.drain_seconds = time.monotonic() - chaos_end
        out(f"chaos: drain {'done' if ok else 'TIMED OUT'} after {result.drain_seconds:.0f}s")
        fleet.check_alive()
        fleet.terminate_all()
        sampler.stop()
        sampler.sample()  # a last one, with every worker stopped
        marks = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(s.partitions)
        }
        result.low_watermarks = {p: low for p, (low, _) in marks.items()}
        result.log_ends = {p: h for p, (_, h) in marks.items()}
    finally:
        if injector.broker_paused and injector.cluster is not None:
            # an error mid-run must not leave the broker stopped
            injector.cluster.resume()
            injector.broker_paused = False
        fleet.kill_everything()
        sampler.stop()
        sampler.close()
        probe.close()

    result.faults = injector.counts
    result.fault_log = injector.log
    result.processes = len(fleet.runs)
    result.deaths = list(fleet.deaths)
    result.bounds_exceeded = list(fleet.slow)
    result.shutdown_seconds = list(fleet.shutdown_s)
    for r in fleet.runs:
        result.modes[r.mode] += 1
        if r.mode == "async":
            result.async_commit_kinds.update(r.commit_kinds)
            result.async_commit_whens.update(r.commit_whens)
    result.samples, result.sample_errors = len(sampler.samples), sampler.errors
    check(
        result, producer.sent, len(producer.failed), producer.delivered, fleet.log_paths(),
        sampler.samples,
    )
    if s.eos:
        check_output(result, producer.delivered, bootstrap, topic + OUTPUT_SUFFIX, s.partitions)
    result.total_seconds = time.monotonic() - t0
    return result


def _warm_up(sampler: OffsetSampler, timeout: float, out: Callable[[str], None]) -> None:
    """Wait until every partition has a committed offset: a partition without one follows
    auto.offset.reset with no catch-up, so faults before that test nothing of ours and
    only inflate the latency figures."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            got = sampler.read_group()
        except KafkaException:
            got = {}
        if got and all(offset >= 0 for offset, _ in got.values()):
            out(f"chaos: group warmed up in {time.monotonic() - started:.0f}s")
            return
        time.sleep(0.5)
    out(f"chaos: not every partition had a commit after {timeout:g}s; injecting faults anyway")
