"""Offset planning for the Spark source: pure functions, no Spark, no Kafka.

Spark restores exactly one thing after a restart: the offset JSON it logged for each
micro-batch. So everything the KIP-333 catch-up needs to survive a crash lives inside that
JSON, and every decision is a function of it:

* A partition's position is ``next`` (every offset at or above it is unplanned) plus the
  *pending* ranges below ``next`` that no batch has read yet (the backlog).
* A batch from ``start`` to ``end`` reads, per partition,
  ``(start.pending | [start.next, end.next)) - end.pending``. Because that is a function of the
  two JSONs only, Spark can re-plan a batch after a crash (it calls ``partitions`` with the
  logged offsets) and get the very same records; the chunks of one plan are disjoint, so no
  record is read twice within a batch.
* The records that come out of ``start.pending`` are the backlog (``catchup=true``); the rest
  are the live stream.

``plan_end`` is the only place that decides anything (where the next batch ends); ``plan_slices``
just reads the difference back out, so the two can never disagree about what a batch holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastrebalance._ranges import RangeSet

__all__ = [
    "FROM_KEY",
    "INITIAL_KEY",
    "Marks",
    "PartitionPosition",
    "Plan",
    "Slice",
    "TopicPartitionKey",
    "allocate",
    "balance",
    "batch_zero_end",
    "batch_zero_start",
    "decode_offset",
    "detect_restart",
    "encode_offset",
    "even_chunks",
    "initial_offset",
    "is_initial",
    "is_legacy_batch_zero",
    "next_catchup_budget",
    "offset_json",
    "pack_tasks",
    "pending_count",
    "plan_end",
    "plan_slices",
    "resolve_start",
    "spread",
    "tasks_for",
]

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class Marks:
    """A partition's watermarks: ``low`` is the first offset still stored, ``high`` the log end."""

    low: int
    high: int


@dataclass(frozen=True)
class PartitionPosition:
    """Where one partition stands in a source offset.

    ``pending`` holds half-open ``[start, end)`` ranges below ``next``, canonical (sorted,
    disjoint, non-touching), so that equal positions always encode to the same JSON: Spark
    decides "no new data" by comparing offset JSON strings.
    """

    next: int
    pending: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.next, bool) or not isinstance(self.next, int) or self.next < 0:
            raise ValueError(f"offset must be an int >= 0, got {self.next!r}")
        if not self.pending:
            return  # the common case, thousands of times per planning call at scale
        canonical = RangeSet(self.pending).as_tuple()
        if canonical != tuple(tuple(r) for r in self.pending):
            raise ValueError(f"pending ranges must be sorted and disjoint: {self.pending!r}")
        if canonical and canonical[-1][1] > self.next:
            raise ValueError(f"pending ranges {canonical!r} must lie below next={self.next}")

    @classmethod
    def of(cls, next_offset: int, pending: Iterable[tuple[int, int]] = ()) -> PartitionPosition:
        """Build from any ranges (overlapping, unsorted): they are made canonical first."""
        return cls(next_offset, RangeSet(pending).as_tuple())


Offset = Mapping[TopicPartitionKey, PartitionPosition]


# -- the JSON form ---------------------------------------------------------------------------
def encode_offset(offset: Offset) -> dict[str, dict[str, Any]]:
    """The JSON-ready dict, in a fixed key order (topics by name, partitions by number).

    A partition without backlog is a bare int, so the common case reads like Spark's own Kafka
    offsets (``{"orders": {"0": 120}}``); with backlog it is ``[next, [s, e], ...]``.
    """
    out: dict[str, dict[str, Any]] = {}
    for topic, partition in sorted(offset):
        pos = offset[(topic, partition)]
        value: Any = pos.next
        if pos.pending:
            value = [pos.next, *([s, e] for s, e in pos.pending)]
        out.setdefault(topic, {})[str(partition)] = value
    return out


def offset_json(offset: Offset) -> str:
    """The exact string Spark will store (the runner uses ``json.dumps`` with defaults)."""
    return json.dumps(encode_offset(offset))


def decode_offset(obj: Mapping[str, Any]) -> dict[TopicPartitionKey, PartitionPosition]:
    """Parse an offset dict as Spark hands it back (JSON keys are strings).

    Keys starting with ``@`` are not topics (a topic name cannot hold ``@``): they carry the
    initial offset's bookkeeping (see ``initial_offset``) and are skipped here.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"source offset must be a JSON object, got {obj!r}")
    if INITIAL_KEY in obj:
        raise ValueError("the initial offset names no positions: resolve it first")
    out: dict[TopicPartitionKey, PartitionPosition] = {}
    for topic, parts in obj.items():
        if str(topic).startswith("@"):
            continue
        if not isinstance(parts, Mapping):
            raise ValueError(f"offsets of topic {topic!r} must be an object, got {parts!r}")
        for key, value in parts.items():
            try:
                partition = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"partition {key!r} of topic {topic!r} is not an int") from None
            out[(topic, partition)] = _decode_position(topic, partition, value)
    return out


def _decode_position(topic: str, partition: int, value: Any) -> PartitionPosition:
    where = f"{topic}-{partition}"
    if isinstance(value, int) and not isinstance(value, bool):
        return PartitionPosition(value)
    if isinstance(value, list) and value:
        ranges = []
        for r in value[1:]:
            if not (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)):
                raise ValueError(f"bad pending range {r!r} in the offset of {where}")
            ranges.append((r[0], r[1]))
        try:
            return PartitionPosition(value[0], tuple(ranges))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad offset for {where}: {exc}") from None
    raise ValueError(f"bad offset for {where}: {value!r}")


# -- the initial offset -----------------------------------------------------------------------
#: The key of the initial offset: ``{"@initial": <startingOffsets, as options gave them>}``.
INITIAL_KEY = "@initial"
#: The key, in batch 0's end offset, of where batch 0 began reading each partition.
FROM_KEY = "@from"


def initial_offset(spec: Any) -> dict[str, Any]:
    """The initial offset: the user's startingOffsets themselves, not what they resolve to.

    Spark asks a new query for its initial offset more than once (to plan batch 0, then again
    to run it, and again on a new driver that replays batch 0 after a crash), and a Python
    source has no checkpoint folder to keep a first answer in, as Spark's Kafka source does
    (``sources/0/0``). Log ends move between those calls, so an answer resolved from them
    would differ each time and the records in between would be lost. A function of the
    options alone is the same every time; it is resolved once, when batch 0 is planned, and
    batch 0's end offset (which Spark logs before running it) keeps the result.
    """
    return {INITIAL_KEY: spec}


def is_initial(obj: Mapping[str, Any]) -> bool:
    return isinstance(obj, Mapping) and INITIAL_KEY in obj


def batch_zero_end(start: Offset, end: Offset) -> dict[str, Any]:
    """Batch 0's end offset, with the resolved start of each partition it reads from.

    ``start`` is what the initial offset resolved to when batch 0 was planned. A partition
    that batch 0 reads (its start below its end) has its start kept under ``@from``, so
    that running batch 0, or replaying it on a new driver, reads the very same records.
    """
    out: dict[str, Any] = encode_offset(end)
    began = {tp: start[tp].next for tp in sorted(end) if tp in start and start[tp] != end[tp]}
    # Present even when empty: it tells this form from a batch 0 logged by an older version,
    # whose start must still be resolved when it is replayed (see is_legacy_batch_zero).
    out[FROM_KEY] = {
        topic: {str(p): began[(t, p)] for (t, p) in began if t == topic}
        for topic in sorted({t for t, _ in began})
    }
    return out


def is_legacy_batch_zero(end: Mapping[str, Any]) -> bool:
    """Batch 0 logged before its end kept where it began (fastrebalance before issue 19)."""
    return FROM_KEY not in end


def batch_zero_start(end: Mapping[str, Any]) -> dict[TopicPartitionKey, PartitionPosition]:
    """Where batch 0 began, from its end offset: ``@from``, or the end itself (nothing read)."""
    positions = decode_offset(end)
    began = end.get(FROM_KEY) or {}
    if not isinstance(began, Mapping):
        raise ValueError(f"bad {FROM_KEY} in batch 0's offset: {began!r}")
    out: dict[TopicPartitionKey, PartitionPosition] = {}
    for tp, pos in positions.items():
        offset = (began.get(tp[0]) or {}).get(str(tp[1]))
        if offset is None:
            out[tp] = pos
        elif type(offset) is int and 0 <= offset <= pos.next and not pos.pending:
            out[tp] = PartitionPosition(offset)
        else:
            raise ValueError(f"bad {FROM_KEY} offset {offset!r} for {tp[0]}-{tp[1]}")
    return out


def resolve_start(
    wanted: Mapping[TopicPartitionKey, int],
    marks: Mapping[TopicPartitionKey, Marks],
    target: Mapping[TopicPartitionKey, int] | None = None,
) -> dict[TopicPartitionKey, PartitionPosition]:
    """Starting offsets (-2 earliest, -1 latest, or an offset) as positions, now.

    Under Trigger.AvailableNow, "latest" is the run's target: the log end when the run began.
    An offset outside the log is kept as given, so that planning reports it (records deleted
    below the log start, or a log that ends below it) per failOnDataLoss. A new query's
    offset beyond the log end is the user's, not a shrunk log: the stream reader reports it
    as startingOffsets' before planning (FastRebalanceStreamReader._resolve_initial).
    """
    out: dict[TopicPartitionKey, PartitionPosition] = {}
    for tp, offset in wanted.items():
        m = marks.get(tp)
        if m is None:
            continue
        high = m.high if target is None else min(m.high, target.get(tp, m.high))
        out[tp] = PartitionPosition(m.low if offset == -2 else high if offset == -1 else offset)
    return out


def pending_count(offset: Offset) -> int:
    """Backlog records still to read, over all partitions (for progress reporting)."""
    return sum(e - s for pos in offset.values() for s, e in pos.pending)


# -- planning the next batch -------------------------------------------------------------------
def detect_restart(
    start: Offset, marks: Mapping[TopicPartitionKey, Marks], threshold: int
) -> dict[TopicPartitionKey, int]:
    """The partitions whose backlog a restart skips, each with the log end to skip to.

    ``threshold`` is the restart's lag summed over the query's partitions, not one
    partition's: the first fresh record waits behind the whole batch an in-order read would
    plan, and 2,000,000 records delay it as much over 256 partitions (7,812 each) as over 8.
    Past it, every lagging partition is skipped, so that the restart batch holds live records
    only.

    The caller snapshots this once per query run (the first planning call after a restart), so
    that re-planning from the same logged start always skips to the same point.
    """
    ends: dict[TopicPartitionKey, int] = {}
    total = 0
    for tp, pos in start.items():
        m = marks.get(tp)
        if m is not None and m.high > max(pos.next, m.low):
            ends[tp] = m.high
            total += m.high - max(pos.next, m.low)
    return ends if total > threshold else {}


def allocate(
    lags: Mapping[TopicPartitionKey, int], limit: int | None
) -> dict[TopicPartitionKey, int]:
    """Split a record budget over partitions in proportion to their lag (largest remainder).

    Proportional, like Spark's Kafka source, so the partitions furthest behind get the most and
    none starves; largest remainder so the total is exactly ``min(limit, total lag)``.
    """
    lags = {tp: max(lag, 0) for tp, lag in lags.items()}
    total = sum(lags.values())
    if limit is None or total <= limit:
        return dict(lags)
    limit = max(limit, 0)
    shares = {tp: limit * lag // total for tp, lag in lags.items()}
    left = limit - sum(shares.values())
    by_remainder = sorted(lags, key=lambda tp: (-(limit * lags[tp] % total), tp))
    for tp in by_remainder[:left]:
        shares[tp] += 1
    return shares


@dataclass
class Plan:
    """Where the next batch ends, and what the planner noticed on the way."""

    end: dict[TopicPartitionKey, PartitionPosition]
    restarted: dict[TopicPartitionKey, tuple[int, int]] = field(default_factory=dict)
    """Partitions whose backlog was skipped in this plan: tp -> the skipped ``[from, to)``."""
    losses: list[str] = field(default_factory=list)
    """Human-readable descriptions of records that are gone (retention, topic recreated)."""


def plan_end(
    start: Offset,
    marks: Mapping[TopicPartitionKey, Marks],
    *,
    restart_ends: Mapping[TopicPartitionKey, int] | None = None,
    fresh_limit: int | None = None,
    catchup_budget: int = 100_000,
    chunk_size: int = 25_000,
    target: Mapping[TopicPartitionKey, int] | None = None,
    new_partitions_from_earliest: bool = True,
    drain_on_restart: bool = False,
) -> Plan:
    """The end offset of the next batch.

    * A partition in ``restart_ends`` that has not yet passed that point moves its backlog
      ``[next, restart_end)`` into pending and continues from ``restart_end``: the live stream
      flows at once. A plan that skips any backlog drains none (unless ``drain_on_restart``:
      the caller found no live record to hold back), so the first batch after a restart only
      carries live records.
    * The live stream advances to the log end (capped by ``target`` for Trigger.AvailableNow:
      a partition the target does not name, one that appeared after it was fixed, is neither
      added nor read on), at most ``fresh_limit`` records in total (``maxOffsetsPerTrigger``).
    * Otherwise up to ``catchup_budget`` backlog records leave pending, lowest offsets first,
      one chunk per partition in turn (largest backlog first), so the partitions' backlogs
      progress in parallel and a batch is never held hostage by backlog work.
    * A partition seen for the first time is added at its first offset (or its log end), so it
      is read from the next batch on.
    """
    if catchup_budget < 1 or chunk_size < 1:
        raise ValueError("catchup_budget and chunk_size must be >= 1")
    restart_ends = restart_ends or {}
    plan = Plan(end={})
    nexts: dict[TopicPartitionKey, int] = {}
    highs: dict[TopicPartitionKey, int] = {}
    pendings: dict[TopicPartitionKey, RangeSet] = {}
    # Partitions whose pending gained ranges below the start's next offset (a recreated
    # topic): plan_slices derives a batch from start and end, and reads a drained range only
    # if the start had it pending or it lies in [start.next, end.next), so those ranges must
    # wait for the next batch.
    held: set[TopicPartitionKey] = set()

    for tp in sorted(set(start) | set(marks)):
        m = marks.get(tp)
        if tp not in start:
            assert m is not None
            if target is not None and tp not in target:
                continue  # appeared after the run's target was fixed: the next run reads it
            first = m.low if new_partitions_from_earliest else m.high
            if target is not None:
                first = min(first, target[tp])
            plan.end[tp] = PartitionPosition(first)
            continue
        pos = start[tp]
        if m is None:  # no watermarks this time (metadata hiccup, topic deleted): stand still
            plan.end[tp] = pos
            continue
        nxt = pos.next
        skip_to = restart_ends.get(tp)
        # Under a target (Trigger.AvailableNow), a partition it does not name is not read on.
        high = m.high if target is None else min(m.high, target.get(tp, nxt))
        if not pos.pending and m.low <= nxt <= m.high and skip_to is None:
            # The common case, kept free of range bookkeeping: planning runs every ~10 ms
            # while data flows, over every partition (1,000 at scale).
            nexts[tp], highs[tp] = nxt, max(high, nxt)
            continue
        pending = RangeSet(pos.pending)
        where = f"{tp[0]}-{tp[1]}"
        if m.high < nxt:
            # The topic was recreated (or its log truncated): what the log holds now is, as far
            # as offsets can tell, unread. It becomes backlog, read from the next batch on, so
            # that failOnDataLoss=false skips only what is gone (fastrebalance.Consumer reads a
            # recreated topic's new log from its start too; Spark's Kafka source skips it).
            plan.losses.append(
                f"{where}: log end {m.high} is below the next offset {nxt}"
                " (topic recreated or truncated); with failOnDataLoss=false the query reads"
                f" the records the log holds now, [{m.low}, {m.high}), as backlog and goes on"
                " from the log end"
            )
            pending.truncate_from(m.high)
            if m.low < m.high:
                pending.add(m.low, m.high)
                held.add(tp)
            nxt = m.high
            high = min(high, nxt)
        gone = [(s, min(e, m.low)) for s, e in pending if s < m.low]
        if nxt < m.low:
            gone.append((nxt, m.low))
        if gone:
            plan.losses.append(
                f"{where}: offsets {', '.join(f'[{s}, {e})' for s, e in gone)} were deleted"
                f" (retention or DeleteRecords) before they were read (first stored offset is"
                f" {m.low})"
            )
            pending.remove_below(m.low)
            nxt = max(nxt, m.low)
        if skip_to is not None and nxt < skip_to <= m.high:
            pending.add(nxt, skip_to)
            plan.restarted[tp] = (nxt, skip_to)
            nxt = skip_to
        nexts[tp], highs[tp] = nxt, max(high, nxt)
        if pending:
            pendings[tp] = pending

    grants = allocate({tp: highs[tp] - nexts[tp] for tp in nexts}, fresh_limit)
    if not plan.restarted or drain_on_restart:
        _drain(
            {tp: rs for tp, rs in pendings.items() if tp not in held}, catchup_budget, chunk_size
        )
    for tp in nexts:
        ranges = pendings[tp].as_tuple() if tp in pendings else ()
        plan.end[tp] = PartitionPosition(nexts[tp] + grants[tp], ranges)
    plan.end = dict(sorted(plan.end.items()))
    return plan


def _drain(pendings: Mapping[TopicPartitionKey, RangeSet], budget: int, chunk_size: int) -> None:
    """Take up to ``budget`` backlog offsets out of pending: one chunk per partition per round.

    Rounds start with the partition that has the most backlog, so that when the budget is
    smaller than one chunk per partition the largest backlogs shrink first and the partitions
    even out over the batches, instead of the same few always going first.
    """
    order = sorted(
        (tp for tp, rs in pendings.items() if rs), key=lambda tp: (-pendings[tp].count(), tp)
    )
    while budget > 0 and order:
        still = []
        for tp in order:
            if budget <= 0:
                break
            rs = pendings[tp]
            first, range_end = next(iter(rs))
            take = min(chunk_size, budget, range_end - first)
            rs.remove(first, first + take)
            budget -= take
            if rs:
                still.append(tp)
        order = still


#: How much the adaptive backlog budget may grow from one batch to the next. A batch's duration
#: is measured on a shared machine; one short measurement should not blow up the next batch.
BUDGET_GROWTH = 4


def next_catchup_budget(
    budget: int, drained: int, seconds: float, target_s: float, floor: int
) -> int:
    """The backlog budget for the next batch, scaled from what the last one cost.

    Every micro-batch has a fixed cost (scheduling, the sink's commit, the offset log) of
    about a second on a small cluster, so a budget fixed in records either wastes most of
    each batch on that cost (a large cluster, a cheap job) or holds the live stream back for
    long (a small cluster, an expensive job). Scaling by duration aims every backlog batch at
    ``target_s``: the fixed cost stays a small share of it, and the live records in the batch
    are at most about that old. Only a batch that used its whole budget says how fast the
    backlog reads; the remainder of a backlog says nothing. Growth is capped per batch,
    shrinking is not: a too-large batch delays the live stream, a too-small one only costs a
    little extra time.
    """
    if drained < budget or seconds <= 0:
        return budget
    scaled = int(drained * target_s / seconds)
    return max(floor, min(scaled, budget * BUDGET_GROWTH))


# -- reading a planned batch back out ----------------------------------------------------------
@dataclass(frozen=True)
class Slice:
    """One Spark input partition: the offsets ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int
    catchup: bool

    @property
    def size(self) -> int:
        return self.end - self.start


def plan_slices(start: Offset, end: Offset, chunk_size: int) -> list[Slice]:
    """What the batch ``start → end`` reads, as input partitions; pure in its arguments.

    Live spans come first (so Spark schedules them first) and backlog after them; both are
    cut into chunks of at most ``chunk_size`` records (a large live span, e.g. a new query
    from the earliest offsets, is read in parallel like the backlog). A partition absent
    from ``start`` is read from the next batch on (its first plan only records where it starts).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    live: list[Slice] = []
    backlog: list[Slice] = []
    for (topic, partition), e in sorted(end.items()):
        s = start.get((topic, partition))
        if s is None:
            continue
        if not s.pending and not e.pending:  # the common case: a live span, if anything
            live.extend(
                Slice(topic, partition, a, b, False)
                for a, b in even_chunks(s.next, e.next, chunk_size)
            )
            continue
        still_pending = RangeSet(e.pending)
        spans = RangeSet()
        if e.next > s.next:
            spans.add(s.next, e.next)
        drained = RangeSet(s.pending)
        for a, b in still_pending:
            spans.remove(a, b)
            drained.remove(a, b)
        for a, b in spans:
            live.extend(
                Slice(topic, partition, c, d, False) for c, d in even_chunks(a, b, chunk_size)
            )
        for a, b in drained:
            backlog.extend(
                Slice(topic, partition, c, d, True) for c, d in even_chunks(a, b, chunk_size)
            )
    return live + backlog


def even_chunks(start: int, end: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` in as few chunks of at most ``chunk_size`` as possible, sized alike.

    Cutting at multiples of ``chunk_size`` left a remainder chunk of a few records whenever a
    range was a little over a multiple (a restart backlog always is: it ends where the live
    records began), and each such crumb costs a whole Spark task.
    """
    if end <= start:
        return
    count = -(-(end - start) // chunk_size)
    base, extra = divmod(end - start, count)
    at = start
    for i in range(count):
        size = base + (i < extra)
        yield at, at + size
        at += size


def pack_tasks(slices: Iterable[Slice], max_records: int) -> list[tuple[Slice, ...]]:
    """Group slices into Spark tasks of at most ``max_records`` records.

    A task costs far more than reading a few thousand records: each one is a Python task,
    a consumer assignment and its first fetch, and in the job one output file, one cached
    block, one shuffle map task. So the slices of several Kafka partitions share a task, up
    to the same record budget whatever they hold, and a batch has about as many tasks as
    its records fill. Backlog chunks used to be a task each: a 2,000,000-record backlog over
    64 partitions made 64 tasks of ~31,000 records and drained 3.4 times slower than the
    in-order read of the same records, which this packing made 14 tasks (issue 33).

    A batch with backlog is cut into tasks of equal size, live spans first (``balance``):
    the live records of such a batch reach the sink with the batch, whichever task read
    them, and a live task of its own beside an even number of backlog tasks made an odd
    count, so one core read the last task alone (stage metrics of a 2,000,000-record drain
    over 8 partitions: a task of 26,630 live records, 2.8 s, beside six of 116,250, 3.4-4.9
    s each; one core idled the last 1.3 s of the 15.4 s batch). A batch of live
    records only is packed in order (``_fill``), a large span alone. The executor reads a
    task's slices with one consumer assigned to all at once.
    """
    ordered = sorted(slices, key=lambda sl: sl.catchup)  # stable: live spans first
    if ordered and ordered[-1].catchup:
        return balance(ordered, max_records)
    return _fill(ordered, max_records)


def _fill(slices: list[Slice], max_records: int) -> list[tuple[Slice, ...]]:
    """Consecutive slices, in order, into tasks of at most ``max_records`` (a larger slice
    alone)."""
    tasks: list[tuple[Slice, ...]] = []
    group: list[Slice] = []
    size = 0
    for sl in slices:
        if group and size + sl.size > max_records:
            tasks.append(tuple(group))
            group, size = [], 0
        group.append(sl)
        size += sl.size
    if group:
        tasks.append(tuple(group))
    return tasks


def balance(slices: list[Slice], max_records: int) -> list[tuple[Slice, ...]]:
    """A batch as an even number of tasks of equal size, at most ``max_records``.

    A backlog batch lasts as long as its most loaded core. Packed whole, the slices of a
    500,000-record batch over 8 partitions (the drain takes one 150,000-record chunk per
    partition per round) made tasks of 150, 150, 150 and 50 thousand: on 2 cores one read
    300,000 while the other idled for a third of the batch, and the drain of 2,000,000 took
    1.38x the in-order read's time (issue 33). Cut into equal tasks, an even number of them
    (the tasks of a 2-core executor, Spark's ``local[2]``, pair up; on more cores an odd one
    out costs a round), every core ends together. Slices are cut where a task is full, so a
    task may hold the end of one partition's chunk and the start of the next; pure, so that
    a replayed batch gets the same tasks.
    """
    total = sum(sl.size for sl in slices)
    if total == 0:
        return []
    count = -(-total // max_records)
    if count % 2 and total > max_records // 2:
        count = min(count + 1, total)  # never a task of no records
    base, extra = divmod(total, count)
    tasks: list[tuple[Slice, ...]] = []
    group: list[Slice] = []
    room = base + (extra > 0)
    for sl in slices:
        at = sl.start
        while at < sl.end:
            take = min(room, sl.end - at)
            group.append(Slice(sl.topic, sl.partition, at, at + take, sl.catchup))
            at += take
            room -= take
            if room == 0:
                tasks.append(tuple(group))
                group = []
                room = base + (len(tasks) < extra)
    return tasks


def spread(slices: list[Slice], min_partitions: int | None) -> list[Slice]:
    """At least ``min_partitions`` slices (Spark's minPartitions), large ones split first.

    As Spark's Kafka source does: with fewer slices than asked for, each is cut into a
    number of even parts proportional to its size (at least one), so the work spreads over
    the tasks however uneven the partitions are.
    """
    if min_partitions is None or len(slices) >= min_partitions:
        return slices
    total = sum(s.size for s in slices)
    if total == 0:
        return slices
    out: list[Slice] = []
    for s in slices:
        parts = min(max(round(s.size * min_partitions / total), 1), s.size)
        size = -(-s.size // parts)
        out.extend(
            Slice(s.topic, s.partition, a, b, s.catchup)
            for a, b in even_chunks(s.start, s.end, size)
        )
    return out


def tasks_for(
    slices: list[Slice], max_records: int, min_partitions: int | None = None
) -> list[tuple[Slice, ...]]:
    """The Spark tasks of a batch: ``minPartitions`` honoured, else small live spans packed."""
    if min_partitions is not None:
        return [(s,) for s in spread(slices, min_partitions)]
    return pack_tasks(slices, max_records)
