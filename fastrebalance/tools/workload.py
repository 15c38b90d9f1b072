"""The restart measured alike by ``fastrebalance demo`` and ``fastrebalance bench``: one
measuring loop, so that a number the demo prints means what the same number means in
docs/benchmarks.md.

Thread ownership: the measured consumer and the probe belong to the thread that calls
``measure_restart()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer as PlainConsumer

from ..testing._chaos_check import percentile
from ..testing._workload import produce_time, watermarks

#: Records asked per consume() call: every measured consumer uses the same loop and batch.
BATCH = 500
#: consume() returns when it has BATCH records *or* this timeout passed: a longer wait
#: would hold each trickle of fresh records back for the whole timeout and be measured
#: as latency. 10 ms matches fetch.wait.max.ms.
CONSUME_TIMEOUT_S = 0.01
#: Session timeout of every group member, as the embedded-cluster facts were measured.
SESSION_TIMEOUT_MS = 6000
#: The group protocols a benchmark can measure under (``group.protocol``).
GROUP_PROTOCOLS = ("classic", "consumer")
#: Settings librdkafka refuses under ``group.protocol=consumer`` ("not supported for
#: group.protocol=consumer", _INVALID_ARG at construction): under KIP-848 the broker owns
#: the session, the heartbeat and the assignor. Set only under the classic protocol.
CLASSIC_ONLY_KEYS = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
)
#: The mock holds empty fetches for fetch.wait.max.ms; its 500 ms default would dominate
#: every latency measured here (facts file: p50 250-330 ms instead of ~6 ms).
FETCH_WAIT_MS = 10


def group_conf(protocol: str) -> dict[str, Any]:
    """The membership settings of every consumer a benchmark measures under ``protocol``.

    Classic: the session timeout the embedded-cluster facts were measured with. Consumer
    (KIP-848): only ``group.protocol``; the session and heartbeat are the broker's
    (``group.consumer.*``, or a group's ``consumer.*`` override), since librdkafka refuses
    ``CLASSIC_ONLY_KEYS`` there. A restart in these benchmarks joins a group nobody else is
    in, so the session timeout never decides a measured time.

    Raises:
        ValueError: ``protocol`` is not one of ``GROUP_PROTOCOLS``.
    """
    if protocol == "classic":
        return {"session.timeout.ms": SESSION_TIMEOUT_MS}
    if protocol == "consumer":
        return {"group.protocol": "consumer"}
    raise ValueError(f"group protocol {protocol!r}: expected one of {', '.join(GROUP_PROTOCOLS)}")


def restart_conf(bootstrap: str, group: str, protocol: str) -> dict[str, Any]:
    """The config every restarted consumer of ``measure_restart`` gets, plain or
    fastrebalance alike (``make`` may add to it)."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        **group_conf(protocol),
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "auto.offset.reset": "earliest",
    }


def busy(seconds: float) -> None:
    """Burn CPU like per-record processing would; sleeping would free the GIL and
    flatter whichever consumer does more of its work in librdkafka's threads."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def format_duration(seconds: float | None) -> str:
    """A measured time as the demo and the benchmark print it ("-": never happened)."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


@dataclass(frozen=True)
class RunResult:
    """One restarted consumer, timed in seconds from its construction (None: the event
    never happened). docs/benchmarks.md, What is measured, says what each field means.

    ``fresh_out_of_order``: fresh records delivered after a higher offset of their
    partition. For fastrebalance these were produced between the restart and the moment
    it read the log end: they lie below where its primary starts, so its child delivers
    them with the backlog. With few fresh records in a run, they decide its p99.
    ``child_alive`` is None for a plain consumer. ``samples``: (produced at, latency) of
    each fresh record counted in the statistics, seconds since the restart, oldest first;
    empty unless asked for (``keep_samples``), since only ``bench --plot`` draws them and
    they would fill every --json report.
    """

    backlog: int
    joined_s: float | None
    first_fresh_s: float | None
    fresh_p50_s: float | None
    fresh_p99_s: float | None
    fresh_max_s: float | None
    fresh_records: int
    fresh_out_of_order: int
    backlog_done_s: float | None
    records_per_s: float | None
    expected: int
    duplicates: int
    lost: int
    timed_out: bool
    errors: tuple[str, ...]
    child_alive: bool | None
    close_s: float
    samples: tuple[tuple[float, float], ...] = ()


def measure_restart(
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
    group_protocol: str = "classic",
    on_fresh: Callable[[float, float], None] | None = None,
    keep_samples: bool = False,
    fresh_from_join: bool = False,
    since: float | None = None,
) -> RunResult:
    """Restart ``group`` with the consumer ``make`` builds and time what it delivers.

    The run ends once the backlog is delivered, ``tail_s`` seconds of fresh traffic
    have followed (and the whole window, when one is given, plus ``tail_s``), and every
    offset below the log end read at that point has been delivered; whatever is still
    missing then, or at ``run_timeout_s``, is *lost*.

    ``group_protocol`` is the measured consumer's (``group_conf``); a fastrebalance child
    makes its own choice (it never joins a group).

    ``on_fresh(produced_s, latency_s)`` is told of every fresh record of the window
    (``produced_s`` from the restart, wall clock): where in the run the tail lies, for
    benchmarks/protocol_latency.py.

    ``window_s`` limits the fresh-latency statistics to records produced within that
    many seconds of the restart, so that runs of different lengths (a plain replay of
    a million records takes far longer than fastrebalance) compare the same records.

    ``fresh_from_join``: the backlog ends, and fresh records begin, when the group assigns
    the consumer its partitions rather than when it is built. After a crash into the same
    group the restarted member waits for the dead one's session timeout first, and what
    was produced meanwhile is backlog to it: counting those records as fresh would charge
    the wait to the latency of whichever consumer comes next. Times still count from the
    restart (``joined_s`` is the wait).

    ``since``: a ``time.monotonic()`` instant before the restart (the SIGKILL of the member
    it replaces) to count the times from, instead of the consumer's construction: a user
    measures a recovery from the crash.
    """
    partitions = len(start)
    backlog_end = [high for _low, high in watermarks(probe, topic, partitions)]
    backlog = backlog_left = sum(max(0, e - s) for s, e in zip(start, backlog_end, strict=True))
    conf = restart_conf(bootstrap, group, group_protocol)
    work_s = work_us / 1e6
    min_run_s = 0.0 if window_s is None else window_s + tail_s
    # seen[p][i] != 0 once offset start[p] + i was delivered: C-speed scans later.
    seen = [bytearray(max(0, e - s) + 4096) for s, e in zip(start, backlog_end, strict=True)]
    latencies: list[float] = []
    samples: list[tuple[float, float]] = []
    delivered = duplicates = out_of_order = 0
    delivered_at_backlog_done = 0
    highest = [-1] * partitions  # highest offset delivered so far, per partition
    errors: list[str] = []
    joined: list[float] = []
    first_fresh_s = None
    backlog_done_s = 0.0 if backlog == 0 else None
    final_end: list[int] | None = None
    timed_out = False
    restart_wall = time.time()
    window_end = float("inf") if window_s is None else restart_wall + window_s
    t0 = time.monotonic() if since is None else since
    consumer = make(conf)
    try:

        def on_assign(_consumer: Any, _partitions: Any) -> None:
            nonlocal restart_wall, window_end, backlog, backlog_left, backlog_done_s
            if not joined:
                joined.append(time.monotonic() - t0)
                if fresh_from_join and delivered == 0:
                    # the probe is this thread's own handle: asking it here is safe
                    restart_wall = time.time()
                    window_end = float("inf") if window_s is None else restart_wall + window_s
                    backlog_end[:] = [high for _low, high in watermarks(probe, topic, partitions)]
                    backlog = backlog_left = sum(
                        max(0, e - s) for s, e in zip(start, backlog_end, strict=True)
                    )
                    backlog_done_s = 0.0 if backlog == 0 else None

        consumer.subscribe([topic], on_assign=on_assign)
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
                        if on_fresh is not None:
                            on_fresh(ts - restart_wall, now - ts)
                        if keep_samples:
                            samples.append((ts - restart_wall, now - ts))
                if work_s:
                    busy(work_s)
            elapsed = time.monotonic() - t0
            if backlog_done_s is not None and elapsed >= max(backlog_done_s + tail_s, min_run_s):
                if final_end is None:
                    final_end = [high for _low, high in watermarks(probe, topic, partitions)]
                if all(
                    len(arr) >= e - s and arr.find(0, 0, e - s) == -1
                    for arr, s, e in zip(seen, start, final_end, strict=True)
                ):
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

    expected = lost = 0
    for arr, s, e in zip(seen, start, final_end or backlog_end, strict=True):
        n = max(0, e - s)
        expected += n
        lost += n - min(n, len(arr)) + arr.count(0, 0, n)
    latencies.sort()
    return RunResult(
        backlog=backlog,
        joined_s=joined[0] if joined else None,
        first_fresh_s=first_fresh_s,
        fresh_p50_s=percentile(latencies, 50),
        fresh_p99_s=percentile(latencies, 99),
        fresh_max_s=latencies[-1] if latencies else None,
        fresh_records=len(latencies),
        fresh_out_of_order=out_of_order,
        backlog_done_s=backlog_done_s,
        records_per_s=(
            delivered_at_backlog_done / backlog_done_s
            if backlog_done_s and delivered_at_backlog_done
            else None
        ),
        expected=expected,
        duplicates=duplicates,
        lost=lost,
        timed_out=timed_out,
        errors=tuple(errors),
        child_alive=child_alive,
        close_s=close_s,
        samples=tuple(sorted(samples)),
    )
