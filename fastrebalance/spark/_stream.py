"""The streaming reader: where each micro-batch ends (driver), and its records (executors).

Spark runs it in one long-lived Python process on the driver (offsets, planning) and ships a
*pickled copy* to executors for ``read``. So the reader holds only options and small caches,
creates Kafka clients lazily, and keeps the one piece of per-run state that is not in the
offset JSON (the log ends seen at restart) in a form that only ever makes re-planning agree
with the first plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ._fetcher import OffsetFetcher
from ._kafka import read_slices
from ._options import FIRST_CATCHUP_BUDGET, SourceOptions
from ._plan import (
    Marks,
    PartitionPosition,
    Plan,
    TopicPartitionKey,
    batch_zero_end,
    batch_zero_start,
    decode_offset,
    detect_restart,
    encode_offset,
    initial_offset,
    is_initial,
    is_legacy_batch_zero,
    next_catchup_budget,
    pending_count,
    plan_end,
    plan_slices,
    resolve_start,
    tasks_for,
)
from ._source import KafkaSlicePartition

__all__ = ["NO_LIMIT", "FastRebalanceStreamReader", "RefusedStreamReader"]

log = logging.getLogger("fastrebalance.spark")

#: The default read limit when maxOffsetsPerTrigger is not set: no limit, but not
#: ReadAllAvailable, which Spark passes for Trigger.Once only (Java's Long.MAX_VALUE).
NO_LIMIT = 2**63 - 1

#: How long a new query waits for the log ends of all its partitions (a topic just created
#: answers NOT_LEADER for a few seconds) before it fails.
INITIAL_FETCH_S = 60.0

#: How often the restart batch polls the log ends while it waits for a live record.
LIVE_POLL_S = 0.02

#: A gap between two planning calls within this share (and jitter) of the shortest one seen is
#: taken as the trigger's pace, not a batch's duration (see _adapt_budget).
PACE_SLACK = 1.1
PACE_JITTER_S = 0.05

#: A planning call that starts this soon after a whole second of the wall clock may be a
#: processingTime tick (see _on_tick); Spark 4.3 made the call 1-2 ms after the tick on this
#: 2-core machine at load average 3, and started batches up to 46 ms after it at load 8.
TICK_SLACK_S = 0.1

#: Empty tasks in a restart batch, at most, to start executors' Python workers early.
MAX_WARM_TASKS = 8

#: The backlog budget under catchup.splitBacklog=false: everything pending, in one batch.
WHOLE_BACKLOG = 2**63 - 1

#: A backlog at most this share above the adaptive budget is read in one batch (see
#: FastRebalanceStreamReader._batch_budget).
TAIL_SHARE = 0.25

class FastRebalanceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._fetcher = OffsetFetcher(options)
        self._restart_ends: dict[TopicPartitionKey, int] | None = None
        self._target: dict[TopicPartitionKey, int] | None = None
        self._budget = options.catchup_budget or FIRST_CATCHUP_BUDGET
        # The last (start, log ends) that gave nothing new, and the last log ends reported.
        self._idle: tuple[dict[str, Any], dict[TopicPartitionKey, Marks]] | None = None
        self._latest: tuple[dict[TopicPartitionKey, Marks], dict[str, Any]] | None = None
        # When the last batch was planned (minOffsetsPerTrigger's delay counts from it).
        self._fired_at: float | None = None
        # When this run's latestOffset was last called, and the shortest gap between two calls.
        self._last_call: float | None = None
        self._min_gap = float("inf")
        # The last batch planned with backlog: (its end, when it was planned, backlog records
        # it drains, the budget it had), until its duration is known.
        self._timing: tuple[dict[str, Any], float, int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors need the options only; the driver's caches stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- offsets (driver) ------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        # The options, not the log ends they resolve to: see _plan.initial_offset.
        return initial_offset(self.options.starting.spec())

    def getDefaultReadLimit(self) -> ReadLimit:
        # Never ReadAllAvailable: Spark passes that for Trigger.Once only, which must read
        # everything available (the backlog too) in its one batch, so it must be told apart.
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(NO_LIMIT if limit is None else limit)

    def prepareForTriggerAvailableNow(self) -> None:
        # "Everything available now" is the log end at this moment; the backlog already in the
        # offset JSON (or skipped at restart) is below it, so the query still drains it all.
        marks = self._complete(self._fetcher.marks(refresh=True, lows=True))
        self._target = {tp: m.high for tp, m in marks.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        now = time.monotonic()
        self._adapt_budget(start, now)
        first_call = self._restart_ends is None
        marks = self._fetcher.marks(refresh=first_call, lows=first_call)
        new_query = is_initial(start)
        if not first_call and self._idle == (start, marks):
            return start  # nothing moved since the last call found nothing new
        if new_query:
            marks = self._complete(marks)
        begin = self._resolve_initial(marks) if new_query else decode_offset(start)
        # Trigger.Once: one batch, which reads everything there is, backlog included (a skip
        # would leave the backlog for a next run that skips again).
        once = isinstance(limit, ReadAllAvailable)
        if first_call:
            self._restart_ends = {} if once else self._decide_restart(new_query, begin, marks)
        budget = max(pending_count(begin), 1) if once else self._batch_budget(begin)
        fresh_limit = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if fresh_limit is not None and fresh_limit >= NO_LIMIT:
            fresh_limit = None

        def plan_for(marks: dict[TopicPartitionKey, Marks], drain: bool = False) -> Plan:
            return plan_end(
                begin,
                marks,
                restart_ends=self._restart_ends,
                fresh_limit=fresh_limit,
                catchup_budget=budget,
                chunk_size=self.options.slice_size,
                target=self._target,
                drain_on_restart=drain,
            )

        plan = plan_for(marks)
        if plan.restarted:
            plan = self._restart_plan(plan, begin, marks, plan_for)
        elif not (once or new_query) and self._too_few(begin, plan, now):
            return start
        for problem in plan.losses:
            if self.options.fail_on_data_loss:
                raise RuntimeError(problem + " (set failOnDataLoss=false to skip them)")
            log.warning("%s (failOnDataLoss=false)", problem)
        for (topic, p), (a, b) in plan.restarted.items():
            log.info(
                "%s-%d: restart with %d records of backlog: live records from %d on, backlog"
                " [%d, %d) read in parallel chunks",
                topic,
                p,
                b - a,
                b,
                a,
                b,
            )
        if new_query:
            # Batch 0 keeps what the initial offset resolved to (see _plan.initial_offset).
            return batch_zero_end(begin, plan.end)
        if plan.end == begin:
            # Spark asks every ~10 ms while idle, and planning 1,000 partitions costs ~10 ms of
            # Python: the answer stands until the log ends or the start change.
            self._idle = (start, marks)
            return start
        self._fired_at = now
        end = encode_offset(plan.end)
        slices = plan_slices(begin, plan.end, self.options.slice_size)
        drained = sum(s.size for s in slices if s.catchup)
        if drained > 0:
            self._timing = (end, time.monotonic(), drained, budget)
        return end

    def _resolve_initial(
        self, marks: dict[TopicPartitionKey, Marks]
    ) -> dict[TopicPartitionKey, PartitionPosition]:
        """What the initial offset means now: checked against Kafka when the query starts."""
        subscription = self.options.subscription
        missing = subscription.missing(self._fetcher.topics())
        if missing:
            raise ValueError(
                f"option assign names partitions that do not exist in Kafka:"
                f" {[f'{t}-{p}' for t, p in missing]}"
            )
        if not marks:
            log.warning("%s matches no partition yet", subscription.describe())
        wanted = self.options.starting.per_partition(marks, self._fetcher.offsets_for_times)
        begin = resolve_start(wanted, marks, target=self._target)
        for tp, pos in sorted(begin.items()):
            m = marks[tp]
            if pos.next <= m.high:
                continue
            # Not a log that shrank (what planning would say of it): the option asks for
            # offsets Kafka has not written. Spark's Kafka source fails on it per
            # failOnDataLoss too.
            problem = (
                f"option startingOffsets starts {tp[0]}-{tp[1]} at {pos.next}, beyond its log"
                f" end {m.high} (it holds [{m.low}, {m.high})); give an offset within the log,"
                " or -1 for its end"
            )
            if self.options.fail_on_data_loss:
                raise ValueError(
                    problem + " (with failOnDataLoss=false the query starts at the log end)"
                )
            log.warning("%s; the query starts at the log end (failOnDataLoss=false)", problem)
            begin[tp] = PartitionPosition(m.high)
        return begin

    def _complete(self, marks: dict[TopicPartitionKey, Marks]) -> dict[TopicPartitionKey, Marks]:
        """The log ends of every partition, for the initial offset or an AvailableNow target.

        A partition left out (no leader yet, e.g. a topic just created) would later look new
        and be read from its first offset, whatever startingOffsets said, or be left out of
        the run; so ask again, for a while, and fail the query if Kafka still does not answer.
        """
        deadline = time.monotonic() + INITIAL_FETCH_S
        while True:
            missing = sorted(set(self._fetcher.partitions()) - set(marks))
            if not missing:
                return marks
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no log end for {[f'{t}-{p}' for t, p in missing][:10]} after"
                    f" {INITIAL_FETCH_S:g} s: cannot fix where the query starts, or stops"
                )
            time.sleep(0.2)
            marks = self._fetcher.marks(refresh=True, lows=True)

    def _too_few(
        self, begin: dict[TopicPartitionKey, PartitionPosition], plan: Plan, now: float
    ) -> bool:
        """minOffsetsPerTrigger: hold a batch back while fewer live records are there, for at
        most maxTriggerDelay since the last batch (Spark's Kafka source's meaning).

        Counted over the live records available, whatever maxOffsetsPerTrigger lets through.
        Never under Trigger.AvailableNow or Once (they must end), nor while backlog is due:
        draining it is work to do now, not something to wait for.
        """
        wanted = self.options.min_offsets_per_trigger
        if wanted is None or self._target is not None:
            return False
        if pending_count(begin) != pending_count(plan.end):
            return False
        if self._fired_at is None or now - self._fired_at >= self.options.max_trigger_delay_s:
            self._fired_at = now  # as Spark: a run's first call, or a delay over, fires
            return False
        marks = self._fetcher.marks()
        available = sum(max(marks[tp].high - p.next, 0) for tp, p in begin.items() if tp in marks)
        return available < wanted

    def _restart_plan(
        self,
        plan: Plan,
        begin: dict[TopicPartitionKey, PartitionPosition],
        marks: dict[TopicPartitionKey, Marks],
        plan_for: Callable[..., Plan],
    ) -> Plan:
        """The first batch after a restart: live records only, if any come in time.

        Planned at the very instant of the restart, the batch would usually hold no live
        record (its restart point is the log end read by this same call), and returning "no
        new data" to wait for one costs a whole trigger interval under a processingTime
        trigger. So the wait happens here, polling the log ends, for at most
        ``catchup.firstBatchWaitMs``. A restart batch that still has no live record carries
        backlog instead: there is nothing fresh for it to hold back. Trigger.AvailableNow
        never waits: its live span is fixed already.
        """
        deadline = time.monotonic() + self.options.first_batch_wait_s
        while not self._holds_live(begin, plan, marks):
            if self._target is not None or time.monotonic() >= deadline:
                return plan_for(self._fetcher.marks(), drain=True)
            time.sleep(LIVE_POLL_S)
            marks = self._fetcher.marks(refresh=True)
            plan = plan_for(marks)
        return plan

    def _holds_live(
        self,
        begin: dict[TopicPartitionKey, PartitionPosition],
        plan: Plan,
        marks: dict[TopicPartitionKey, Marks],
    ) -> bool:
        """Whether the batch reads a live record. A live span below the log start is not
        one: records deleted while the query was down (failOnDataLoss=false) leave the span
        from the old position to the log start in the batch, and it reads nothing."""
        return any(
            not s.catchup and s.end > marks[(s.topic, s.partition)].low
            for s in plan_slices(begin, plan.end, self.options.slice_size)
            if (s.topic, s.partition) in marks
        )

    def _batch_budget(self, begin: dict[TopicPartitionKey, PartitionPosition]) -> int:
        """The backlog a batch may read: all of it, unless catchup.splitBacklog=true.

        Why all of it: the restart batch holds live records, and at its end Spark moves an
        event-time watermark past the backlog. Spark filters a batch's late rows with the
        watermark of the batch before it (``eventTimeWatermarkForLateEvents``, Spark 3.4 on,
        SPARK-40925), so the batch right after the restart batch still keeps rows older
        than the live ones, and every batch after it drops them. Reading the whole backlog
        in that one batch keeps every backlog row and still puts the live records first,
        whether or not the query has a watermark: the source cannot tell (Spark tells a
        source nothing about the operators downstream of it).

        With catchup.splitBacklog=true: the adaptive budget, stretched to take a small
        remainder along (a backlog a little over the budget would otherwise leave a tail of a
        few records for one more batch, which costs a whole batch's fixed cost for nothing).
        A budget the user set is a cap and is kept exactly.
        """
        if not self.options.split_backlog:
            return WHOLE_BACKLOG
        if self.options.catchup_budget is not None:
            return self.options.catchup_budget
        left = pending_count(begin)
        return left if self._budget < left <= self._budget * (1 + TAIL_SHARE) else self._budget

    def _adapt_budget(self, start: dict[str, Any], now: float) -> None:
        """Size the next backlog batch by how long the last one took (unless the user fixed it).

        Spark plans the next batch only once the previous one has run and committed, so the
        time from planning a batch to the next call that starts at its end is at least that
        batch's duration; no call tells the source when a batch ends. Under a processingTime
        trigger that time also holds the wait for the next tick. Scaling by it shrank the
        budget by target/interval after every batch, however fast the batches were (issue
        19, item 6; issue 33, item 1). So a gap that may hold such a wait says only that the
        batch took at most that long: it may grow the budget, never shrink it. Two signs of
        a wait: the call came on a tick (see _on_tick), or the gap is no longer than the
        shortest gap between two calls of this run (idle polls, the restart batch: the
        trigger's own pace; this alone missed a restart between two ticks, whose first gap is
        a part of an interval, so that a whole interval looked like a slow batch). Only a
        gap that ends off the ticks, when Spark planned the next batch at once because the
        batch outlasted its interval (or there is no interval), is the batch's duration.

        A batch's end is decided here, before Spark logs it, so a budget that depends on
        timing keeps every batch a pure function of its logged offsets: a replay after a
        crash reads the logged batch, whatever the budget.
        """
        gap = None if self._last_call is None else now - self._last_call
        paced = gap is not None and gap <= self._min_gap * PACE_SLACK + PACE_JITTER_S
        paced = paced or _on_tick(_wall_clock())
        if gap is not None:
            self._min_gap = min(self._min_gap, gap)
        self._last_call = now
        if (
            self._timing is None
            or self.options.catchup_budget is not None
            or not self.options.split_backlog
        ):
            return
        end, planned_at, drained, budget = self._timing
        if start != end:
            return
        self._timing = None
        seconds = now - planned_at
        scaled = next_catchup_budget(
            budget, drained, seconds, self.options.target_batch_s, self.options.slice_size
        )
        self._budget = max(scaled, budget) if paced else scaled
        if self._budget != budget:
            log.info(
                "backlog budget %d -> %d records per batch (the last batch drained %d in %.1fs;"
                " catchup.targetBatchDurationMs=%d)",
                budget,
                self._budget,
                drained,
                seconds,
                self.options.target_batch_s * 1000,
            )

    def _decide_restart(
        self,
        new_query: bool,
        begin: dict[TopicPartitionKey, PartitionPosition],
        marks: dict[TopicPartitionKey, Marks],
    ) -> dict[TopicPartitionKey, int]:
        """The log ends to skip to, decided once per query run.

        Only a start restored from a checkpoint is a restart: a new query starting at its
        initial offset reads from there in order, as the user asked with startingOffsets.
        Trigger.AvailableNow reads in order too, as Spark's Kafka source does: its target is
        the log end when the run began, so there is no live record to put first (pending
        ranges left by an earlier run are still drained in parallel chunks).
        """
        if not self.options.catchup_enabled or new_query or self._target is not None:
            return {}
        left = pending_count(begin)
        if left and not self.options.split_backlog:
            # A restart during a catch-up (the driver died after the restart batch, before
            # the backlog batch was logged): Spark's checkpoint already holds the watermark
            # the live records set, and the batch after this one filters late rows with it.
            # So the pending backlog is read now, with everything since, in order.
            log.info(
                "restart with %d backlog records still pending from the last restart: read"
                " in this batch, with the records since, in order (catchup.splitBacklog=false)",
                left,
            )
            return {}
        return detect_restart(begin, marks, self.options.catchup_threshold)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        marks = self._fetcher.marks()
        if self._latest is None or self._latest[0] != marks:
            latest: dict[str, Any] = {}
            for (topic, p), m in sorted(marks.items()):
                latest.setdefault(topic, {})[str(p)] = m.high
            self._latest = (marks, latest)
        return self._latest[1]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if not is_initial(start):
            begin = decode_offset(start)
        elif is_legacy_batch_zero(end):
            # A batch 0 an older version logged, replayed now: its start was never kept, so
            # resolve startingOffsets again, as that version did (best effort, see _plan).
            marks = self._fetcher.marks(refresh=True, lows=True)
            begin = resolve_start(self.options.starting.per_partition(marks), marks)
            ends = decode_offset(end)
            begin = {tp: p for tp, p in begin.items() if tp in ends and p.next <= ends[tp].next}
        else:
            begin = batch_zero_start(end)
        slices = plan_slices(begin, decode_offset(end), self.options.slice_size)
        backlog = [s for s in slices if s.catchup]
        if backlog:
            log.info(
                "batch plan: %d live slice(s), %d backlog chunk(s) of %d records; %d left",
                len(slices) - len(backlog),
                len(backlog),
                sum(s.size for s in backlog),
                pending_count(decode_offset(end)),
            )
        tasks = tasks_for(slices, self.options.slice_size, self.options.min_partitions)
        warm = 0 if backlog else _skipped_partitions(begin, decode_offset(end))
        return [KafkaSlicePartition(t) for t in tasks] + [
            KafkaSlicePartition(()) for _ in range(min(warm, MAX_WARM_TASKS))
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to do: Kafka is never told (the checkpoint is the truth, as in Spark's own
        # Kafka source), and this call arrives a batch late anyway.
        pass

    def stop(self) -> None:
        self._fetcher.close()

    # -- records (executors) ---------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSlicePartition), partition
        return read_slices(partition.slices, self.options)


class RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The reader of a query whose options were refused: it raises their error from Spark's
    first call, so that the error is the last one the user reads (see
    FastRebalanceDataSource.streamReader). It claims what the real reader supports, so that
    Spark asks it something rather than refusing the trigger first."""

    def __init__(self, error: ValueError) -> None:
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, Any]:
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        pass


def _wall_clock() -> float:
    """Seconds since the epoch, the clock Spark lays its processingTime ticks on."""
    return time.time()


def _on_tick(wall: float) -> bool:
    """Whether a planning call at ``wall`` (s since the epoch) may be a processingTime tick.

    Spark starts a processingTime trigger's batches at whole multiples of its interval since
    the epoch (``ProcessingTimeExecutor.nextBatchTime``), on the same wall clock, a few ms
    late. An interval of whole seconds, as intervals longer than a batch's target are in
    practice, puts every tick just after a whole second. A call that lands there by chance
    (about 1 in 10 under the default trigger) only keeps the budget from shrinking once.
    """
    return wall % 1.0 < TICK_SLACK_S


def _skipped_partitions(
    start: dict[TopicPartitionKey, PartitionPosition],
    end: dict[TopicPartitionKey, PartitionPosition],
) -> int:
    """Partitions whose backlog this batch skipped (a restart batch): each will have a backlog
    task in the next batch.

    The restart batch gets as many empty tasks (up to MAX_WARM_TASKS), so that Spark starts
    the executors' Python workers, and their pooled Kafka consumers, while the live records
    are read: the backlog batch then starts warm on every core, as a batch that reads the
    whole backlog in order does. Pure in the two offsets, as partitions() must be.
    """
    return sum(
        1
        for tp, e in end.items()
        if e.pending and (tp not in start or e.pending[-1][1] > start[tp].next)
    )
