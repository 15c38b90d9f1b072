"""The restart measured alike by ``fastrebalance demo`` and ``fastrebalance bench``.

Both tell the same story: a group's committed offsets lag the log end by a backlog,
a producer keeps writing fresh timestamped records (``testing._workload``), and a
consumer restarts. The demo shows one plain and one fastrebalance restart; the benchmark
repeats them over backlog sizes and work per record. Sharing the measuring loop keeps
the two from drifting apart: a number printed by the demo means what the same number
means in docs/benchmarks.md.

Thread ownership: the measured consumer and the probe belong to the thread that calls
``measure_restart()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from ..testing._workload import produce_time, watermarks

__all__ = [
    "BATCH",
    "CONSUME_TIMEOUT_S",
    "FETCH_WAIT_MS",
    "SESSION_TIMEOUT_MS",
    "RunResult",
    "busy",
    "format_duration",
    "measure_restart",
    "percentile",
]

#: Records asked per consume() call: every measured consumer uses the same loop and batch.
BATCH = 500
#: consume() returns when it has BATCH records *or* this timeout passed: a longer wait
#: would hold each trickle of fresh records back for the whole timeout and be measured
#: as latency. 10 ms matches fetch.wait.max.ms.
CONSUME_TIMEOUT_S = 0.01
#: Session timeout of every group member, as the embedded-cluster facts were measured.
SESSION_TIMEOUT_MS = 6000
#: The mock holds empty fetches for fetch.wait.max.ms; its 500 ms default would dominate
#: every latency measured here (facts file: p50 250-330 ms instead of ~6 ms).
FETCH_WAIT_MS = 10


# ----------------------------------------------------------------- records
def busy(seconds: float) -> None:
    """Burn CPU like per-record processing would; sleeping would free the GIL and
    flatter whichever consumer does more of its work in librdkafka's threads."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: always a value that was really measured."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def format_duration(seconds: float | None) -> str:
    """A measured time as the demo and the benchmark print it ("-": never happened)."""
    if seconds is None:
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


# ------------------------------------------------------------- one restart
@dataclass(frozen=True)
class RunResult:
    """One restarted consumer, timed from its construction (the restart).

    Times are seconds; None when the event never happened (e.g. no fresh record
    arrived before the run timeout).

    Attributes:
        label: "plain" or "fastrebalance".
        group_id: the group it joined, holding the prepared offsets at the start.
        backlog: records between the committed offsets and the log end at the restart,
            from the real watermarks.
        joined_s: the group assigned it partitions.
        first_fresh_s: it delivered the first record produced after the restart.
        fresh_p50_s, fresh_p99_s: produce-to-delivery latency of fresh records (those
            produced within ``window_s`` of the restart, when a window was given).
        fresh_records: fresh records delivered (within the window, when given).
        fresh_out_of_order: fresh records delivered after a higher offset of their
            partition. For fastrebalance these are the records produced between the
            restart and the moment it read the log end: they lie below where its
            primary starts, so its child delivers them with the backlog. With few
            fresh records in a run, they decide its p99.
        backlog_done_s: every backlog record had been delivered at least once.
        caught_up_s: every record below the final log end had been delivered.
        delivered: records handed to the application, duplicates included.
        expected: distinct records it had to deliver: committed offsets to final log end.
        duplicates: deliveries of an offset already delivered in this run.
        lost: expected records never delivered.
        timed_out: the run hit its timeout.
        errors: error events returned by poll/consume (first few).
        child_alive: fastrebalance only: its child consumer was alive at the end.
        fresh_max_s: the worst fresh latency (same records as p50/p99).
        records_per_s: deliveries up to the end of the backlog divided by the time from
            the restart to that moment, join included: what the restart costs in total.
        window_s: the fresh-latency window, None for the whole run.
        samples: (delivered at, latency) of each fresh record counted, seconds since the
            restart; only when asked for (plots).
        close_s: how long ``close()`` took at the end (commits, leaving the group).
    """

    label: str
    group_id: str
    backlog: int
    joined_s: float | None
    first_fresh_s: float | None
    fresh_p50_s: float | None
    fresh_p99_s: float | None
    fresh_records: int
    fresh_out_of_order: int
    backlog_done_s: float | None
    caught_up_s: float | None
    delivered: int
    expected: int
    duplicates: int
    lost: int
    timed_out: bool
    errors: tuple[str, ...] = ()
    child_alive: bool | None = None
    fresh_max_s: float | None = None
    records_per_s: float | None = None
    window_s: float | None = None
    samples: tuple[tuple[float, float], ...] = ()
    close_s: float | None = None


def measure_restart(
    label: str,
    make: Callable[[dict[str, Any]], Any],
    *,
    bootstrap: str,
    topic: str,
    group: str,
    start: Sequence[int],
    probe: PlainConsumer,
    work_us: float,
    tail_s: float,
    run_timeout_s: float,
    window_s: float | None = None,
    keep_samples: bool = False,
    progress: Callable[[float, int, int, float | None], None] | None = None,
) -> RunResult:
    """Restart ``group`` with the consumer ``make`` builds and time what it delivers.

    The run ends once the backlog is delivered, ``tail_s`` seconds of fresh traffic
    have followed (and the whole window, when one is given, plus ``tail_s``), and every
    offset below the log end read at that point has been delivered; whatever is still
    missing then, or at ``run_timeout_s``, is *lost*.

    ``window_s`` limits the fresh-latency statistics to records produced within that
    many seconds of the restart, so that runs of different lengths (a plain replay of
    a million records takes far longer than fastrebalance) compare the same records.

    ``progress(elapsed_s, backlog_delivered, backlog, first_fresh_s)`` is called about
    twice a second, for a live display; it must be cheap.
    """
    partitions = len(start)
    backlog_end = [high for _low, high in watermarks(probe, topic, partitions)]
    backlog = sum(max(0, e - s) for s, e in zip(start, backlog_end, strict=True))
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "auto.offset.reset": "earliest",
    }
    work_s = work_us / 1e6
    min_run_s = 0.0 if window_s is None else window_s + tail_s
    # seen[p][i] != 0 once offset start[p] + i was delivered: C-speed scans later.
    seen = [bytearray(max(0, e - s) + 4096) for s, e in zip(start, backlog_end, strict=True)]
    backlog_left = backlog
    latencies: list[float] = []
    samples: list[tuple[float, float]] = []
    delivered = duplicates = out_of_order = 0
    delivered_at_backlog_done: int | None = None
    highest = [-1] * partitions  # highest offset delivered so far, per partition
    errors: list[str] = []
    joined: list[float] = []
    first_fresh_s = backlog_done_s = caught_up_s = None
    final_end: list[int] | None = None
    timed_out = False
    child_alive: bool | None = None

    next_progress = 0.0
    restart_wall = time.time()
    window_end = float("inf") if window_s is None else restart_wall + window_s
    t0 = time.monotonic()
    consumer = make(conf)
    try:

        def on_assign(_consumer: Any, _partitions: list[TopicPartition]) -> None:
            if not joined:
                joined.append(time.monotonic() - t0)

        consumer.subscribe([topic], on_assign=on_assign)
        if backlog == 0:
            backlog_done_s = 0.0
        while True:
            for m in consumer.consume(BATCH, CONSUME_TIMEOUT_S):
                if m.error() is not None:
                    if len(errors) < 10:
                        errors.append(str(m.error()))
                    continue
                now = time.time()
                delivered += 1
                p, off = m.partition(), m.offset()
                behind = off < highest[p]
                if not behind:
                    highest[p] = off
                i = off - start[p]
                if i >= 0:
                    arr = seen[p]
                    if i >= len(arr):
                        arr.extend(bytes(i + 1 - len(arr) + 4096))
                    if arr[i]:
                        duplicates += 1
                    else:
                        arr[i] = 1
                        if off < backlog_end[p]:
                            backlog_left -= 1
                            if backlog_left == 0:
                                backlog_done_s = time.monotonic() - t0
                                delivered_at_backlog_done = delivered
                ts = produce_time(m.value())
                if ts >= restart_wall:
                    if first_fresh_s is None:
                        first_fresh_s = time.monotonic() - t0
                    if ts < window_end:
                        latencies.append(now - ts)
                        out_of_order += behind
                        if keep_samples:
                            samples.append((now - restart_wall, now - ts))
                if work_s:
                    busy(work_s)
            elapsed = time.monotonic() - t0
            if progress is not None and elapsed >= next_progress:
                next_progress = elapsed + 0.5
                progress(elapsed, backlog - backlog_left, backlog, first_fresh_s)
            if (
                backlog_done_s is not None
                and elapsed >= backlog_done_s + tail_s
                and elapsed >= min_run_s
            ):
                if final_end is None:
                    final_end = [high for _low, high in watermarks(probe, topic, partitions)]
                if all(
                    len(arr) >= e - s and arr.find(0, 0, e - s) == -1
                    for arr, s, e in zip(seen, start, final_end, strict=True)
                ):
                    caught_up_s = elapsed
                    break
            if elapsed > run_timeout_s:
                timed_out = True
                break
        alive = getattr(consumer, "child_consumer_is_alive", None)
        child_alive = alive() if alive is not None else None
    finally:
        closing = time.monotonic()
        consumer.close()
        close_s = time.monotonic() - closing

    end = final_end if final_end is not None else backlog_end
    expected = lost = 0
    for arr, s, e in zip(seen, start, end, strict=True):
        n = max(0, e - s)
        expected += n
        lost += n - min(n, len(arr)) + arr.count(0, 0, n)
    rate = None
    if backlog_done_s and delivered_at_backlog_done:
        rate = delivered_at_backlog_done / backlog_done_s
    latencies.sort()
    return RunResult(
        label=label,
        group_id=group,
        backlog=backlog,
        joined_s=joined[0] if joined else None,
        first_fresh_s=first_fresh_s,
        fresh_p50_s=percentile(latencies, 50),
        fresh_p99_s=percentile(latencies, 99),
        fresh_records=len(latencies),
        fresh_out_of_order=out_of_order,
        backlog_done_s=backlog_done_s,
        caught_up_s=caught_up_s,
        delivered=delivered,
        expected=expected,
        duplicates=duplicates,
        lost=lost,
        timed_out=timed_out,
        errors=tuple(errors),
        child_alive=child_alive,
        fresh_max_s=latencies[-1] if latencies else None,
        records_per_s=rate,
        window_s=window_s,
        samples=tuple(samples),
        close_s=close_s,
    )
