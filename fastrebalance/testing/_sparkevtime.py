"""The Spark crash harness's event-time mode: a windowed count that a restart backlog must
not short (issues 33 and 46).

After a restart the source reads the live records first, so a watermarked operator's
watermark moves past the backlog. Two query shapes are checked. ``event_count_query``, the
default: every row through ``withWatermark`` and a count per ``window("timestamp", W)`` in
append mode, the source left at its defaults, which read the whole backlog in the batch
where Spark's late-row filter still lets it through (docs/spark.md, Event time).
``event_time_query``, the routed shape: live rows (``catchup = false``) feed the count, and
backlog rows (``catchup = true``) go around it, row by row, to the same ``foreachBatch``
sink, so that the source may split the backlog over batches. Either way the check is that
for every window Spark has closed, the count it emitted plus the backlog rows the sink holds
for that window equal the records of the topic whose timestamp (the producer's CreateTime)
falls in it.

Why the backlog is behind the watermark here: a restart's first batch holds records
produced after the driver came back (a JVM start, seconds), while the backlog was produced
before (the down time, a burst): older than that batch's event time minus a delay of
seconds. ``behind`` counts the backlog rows older than the watermark of the batch that read
them, which a watermarked operator over every row would have dropped.

Everything here but the two queries is pure: counts in, verdicts out, no Spark, no
Kafka, so that the check is unit-tested, including that it fails on a short window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "LiveWindows",
    "WindowCheck",
    "bucket",
    "check_windows",
    "event_count_query",
    "event_time_query",
    "merge_live",
    "window_of",
]


def window_of(ts_ms: int, width_ms: int) -> int:
    """The start of the tumbling window holding ``ts_ms``: Spark's ``window(col, W)``, whose
    windows start at multiples of W since the epoch (no start offset given)."""
    return ts_ms - ts_ms % width_ms


def bucket(stamps: Iterable[int], width_ms: int) -> Counter[int]:
    """Records per window start."""
    return Counter(window_of(ts, width_ms) for ts in stamps)


class _Attempt(Protocol):
    @property
    def batch(self) -> int: ...
    @property
    def life(self) -> int: ...
    @property
    def windows(self) -> tuple[tuple[int, int], ...]: ...


@dataclass
class LiveWindows:
    """The windows the watermarked count emitted: start -> count, and what was wrong."""

    counts: dict[int, int] = field(default_factory=dict)
    #: a replayed batch that emitted other windows than its first attempt
    replay_mismatch: list[str] = field(default_factory=list)
    #: a window emitted by two batch ids: append mode emits a window once, when it closes
    emitted_twice: list[str] = field(default_factory=list)


def merge_live(attempts: Sequence[_Attempt]) -> LiveWindows:
    """Each batch's windows from its first attempt (a replay must say the same: a sink that
    overwrites per batch id then ends with them), checked to be emitted once.

    ``attempts`` in (batch, life, call) order, as ``read_sink`` returns them.
    """
    out = LiveWindows()
    first: dict[int, _Attempt] = {}
    owner: dict[int, int] = {}
    for a in attempts:
        if a.batch not in first:
            first[a.batch] = a
            for start, n in a.windows:
                if start in owner:
                    out.emitted_twice.append(
                        f"window {start}: {out.counts[start]} in batch {owner[start]},"
                        f" {n} in batch {a.batch}"
                    )
                    out.counts[start] += n
                else:
                    owner[start], out.counts[start] = a.batch, n
        elif sorted(a.windows) != sorted(first[a.batch].windows):
            was, now = dict(first[a.batch].windows), dict(a.windows)
            diff = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
            out.replay_mismatch.append(
                f"batch {a.batch}: life {a.life} emitted other windows than life"
                f" {first[a.batch].life}: "
                + ", ".join(f"{k}: {was.get(k)} then {now.get(k)}" for k in diff[:5])
            )
    return out


@dataclass
class WindowCheck:
    width_ms: int
    watermark_ms: int  #: the watermark of the last committed batch: windows before it closed
    checked: int = 0  #: closed windows
    open: int = 0  #: windows of the topic not closed yet (not checked)
    #: (window start, records in the topic, counted by the sink) for closed windows
    short: list[tuple[int, int, int]] = field(default_factory=list)
    over: list[tuple[int, int, int]] = field(default_factory=list)
    records: int = 0  #: records in the checked windows
    live: int = 0  #: ... counted by the watermarked count
    backlog: int = 0  #: ... counted as backlog rows
    #: backlog rows older than the watermark of the batch that read them (over all windows)
    behind: int = 0
    #: of the short windows' shortfall, records the query had not read when it stopped
    #: (pending or ahead at its last committed batch: a drain that did not finish); the
    #: rest was read and not counted: dropped
    unread: int = 0

    @property
    def ok(self) -> bool:
        return not (self.short or self.over)


def check_windows(
    expected: Mapping[int, int],
    live: Mapping[int, int],
    backlog: Mapping[int, int],
    width_ms: int,
    watermark_ms: int,
    unread: Mapping[int, int] | None = None,
) -> WindowCheck:
    """Every closed window's count against the topic's.

    A window is closed once Spark emitted it (append mode emits a window when it is final),
    or once it ends before ``watermark_ms``, the watermark the last committed batch ran
    with: that batch, whose output is in the sink, emitted every window ending by then.
    Short: records of the topic that neither the count nor the backlog rows hold (lost).
    Over: more than the topic holds (a record counted twice, or one the topic never had).
    ``unread``: per window, records the query never read, which explain (part of) a
    shortfall without a drop.
    """
    r = WindowCheck(width_ms, watermark_ms)
    for start in sorted(expected.keys() | live.keys() | backlog.keys()):
        if start not in live and start + width_ms >= watermark_ms:
            r.open += 1
            continue
        want, got = expected.get(start, 0), live.get(start, 0) + backlog.get(start, 0)
        r.checked += 1
        r.records += want
        r.live += live.get(start, 0)
        r.backlog += backlog.get(start, 0)
        if got < want:
            r.short.append((start, want, got))
            r.unread += min(want - got, (unread or {}).get(start, 0))
        elif got > want:
            r.over.append((start, want, got))
    return r


def event_time_query(df: Any, width_ms: int, delay_ms: int) -> Any:
    """The recommended shape (docs/spark.md, Event time): live rows through a watermarked
    count per window (append mode: a window once, when the watermark passes its end), backlog
    rows around it, unchanged, in one stream. Columns: ``topic, partition, offset, catchup,
    ms, n``; a window's row has a null topic, its start in ``ms`` and its count in ``n``; a
    backlog row has its timestamp in ``ms``."""
    from pyspark.sql import functions as F

    live = (
        df.where(~F.col("catchup"))
        .withWatermark("timestamp", f"{delay_ms} milliseconds")
        .groupBy(F.window("timestamp", f"{width_ms} milliseconds"))
        .count()
        .select(
            F.lit(None).cast("string").alias("topic"),
            F.lit(-1).alias("partition"),
            F.lit(-1).cast("long").alias("offset"),
            F.lit(False).alias("catchup"),
            F.unix_millis(F.col("window.start")).alias("ms"),
            F.col("count").alias("n"),
        )
    )
    backlog = df.where(F.col("catchup")).select(
        "topic",
        "partition",
        "offset",
        "catchup",
        F.unix_millis(F.col("timestamp")).alias("ms"),
        F.lit(1).cast("long").alias("n"),
    )
    return live.unionByName(backlog)


def event_count_query(df: Any, width_ms: int, delay_ms: int) -> Any:
    """The query a user writes (issue 46): every row through a watermarked count per window,
    append mode, nothing routed. The same columns as ``event_time_query``, windows only: the
    check then finds each window's records in its count alone."""
    from pyspark.sql import functions as F

    return (
        df.withWatermark("timestamp", f"{delay_ms} milliseconds")
        .groupBy(F.window("timestamp", f"{width_ms} milliseconds"))
        .count()
        .select(
            F.lit(None).cast("string").alias("topic"),
            F.lit(-1).alias("partition"),
            F.lit(-1).cast("long").alias("offset"),
            F.lit(False).alias("catchup"),
            F.unix_millis(F.col("window.start")).alias("ms"),
            F.col("count").alias("n"),
        )
    )


def short_summary(check: WindowCheck, limit: int = 5) -> str:
    """``3 short by 412 records: 1700000000000 (400 of 612), ...``"""
    lost = sum(want - got for _, want, got in check.short)
    shown = ", ".join(f"{s} ({got} of {want})" for s, want, got in check.short[:limit])
    why = (
        f" ({check.unread} of them never read: the query stopped with them pending)"
        if check.unread
        else ""
    )
    return f"{len(check.short)} short by {lost} records{why}: {shown}"
