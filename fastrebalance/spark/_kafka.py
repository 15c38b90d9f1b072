"""The executors' side: the records of a task's offset slices, as Arrow batches.

A task may hold the slices of many partitions (the small live spans of a batch over a
topic with many partitions). They are read together, by one consumer assigned to all of them
at once, so that librdkafka fetches them in one request per broker; reading them one after
the other made each wait for the fetch the previous one left in flight, and a batch over
128 partitions took 18.8 s (issue 19). Consumers are pooled per Python worker.

No Spark import: this only needs pyarrow, and it is tested against the clusters directly.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ._options import SourceOptions
from ._plan import Slice

__all__ = [
    "ARROW_FIELDS",
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_HEADERS",
    "DataLossError",
    "read_slice",
    "read_slices",
]

log = logging.getLogger("fastrebalance.spark")

#: The column layout of Spark's Kafka source, plus ``catchup``, as Arrow: Spark checks every
#: batch a Python source yields against the Arrow form of the declared schema (_source.schema;
#: a unit test keeps the two equal), and Arrow batches are far cheaper than tuples. With
#: includeHeaders, ``headers`` comes before ``catchup``, where Spark's Kafka source has it.
ARROW_HEADERS = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
ARROW_FIELDS: list[tuple[str, pa.DataType]] = [
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("catchup", pa.bool_()),
]
ARROW_SCHEMA = pa.schema([pa.field(name, dtype, nullable=True) for name, dtype in ARROW_FIELDS])
ARROW_SCHEMA_WITH_HEADERS = pa.schema(
    [pa.field(name, dtype, nullable=True) for name, dtype in ARROW_FIELDS[:-1]]
    + [pa.field("headers", ARROW_HEADERS, nullable=True), ARROW_SCHEMA.field("catchup")]
)

#: Records per Arrow batch handed to Spark: big enough to amortize the per-batch cost, small
#: enough that a 25k-record chunk streams in a few batches instead of one memory spike.
BATCH_ROWS = 8192


class DataLossError(RuntimeError):
    """Records that should have been read are gone (retention, truncation); see failOnDataLoss."""


class _Columns:
    """Column buffers for one Arrow batch; plain lists, converted once per batch."""

    __slots__ = ("headers", "keys", "offsets", "ts", "ts_types", "values")

    def __init__(self, include_headers: bool) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.ts: list[int | None] = []
        self.ts_types: list[int] = []
        # Spark's Kafka source: null for a record without headers, else (key, value) pairs
        self.headers: list[Any] | None = (
            [] if include_headers else None
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, sl: Slice) -> pa.RecordBatch:
        n = len(self.offsets)
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([sl.topic] * n, pa.string()),
            pa.array([sl.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.ts, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.ts_types, pa.int32()),
        ]
        schema = ARROW_SCHEMA
        if self.headers is not None:
            arrays.append(pa.array(self.headers, ARROW_HEADERS))
            schema = ARROW_SCHEMA_WITH_HEADERS
        arrays.append(pa.array([sl.catchup] * n, pa.bool_()))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


# One idle consumer per configuration, per Python worker process. Spark reuses its Python
# workers across tasks, and a fresh librdkafka handle costs a bootstrap connection and a
# metadata round trip, which dominates a task that reads a few live records. A consumer is
# only put back after a clean read (and after unassign()); any failure closes it instead.
_IDLE: dict[tuple[tuple[str, str], ...], Consumer] = {}


@atexit.register
def _close_idle() -> None:
    while _IDLE:
        _, consumer = _IDLE.popitem()
        consumer.close()


@contextmanager
def _borrow(options: SourceOptions) -> Iterator[Consumer]:
    key = tuple(sorted(options.kafka.items()))
    consumer = _IDLE.pop(key, None) or Consumer(options.consumer_config("executor"))
    clean = False
    try:
        yield consumer
        consumer.unassign()
        clean = True
    finally:
        if clean and key not in _IDLE:
            _IDLE[key] = consumer
        else:
            consumer.close()


def read_slices(
    slices: Iterable[Slice], options: SourceOptions, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Every stored record of each slice, as Arrow batches (one task's work).

    The partitions are read concurrently; the slices of one partition one after the other,
    in offset order. A batch holds the records of one slice.
    """
    todo = [sl for sl in slices if sl.size > 0]
    with _borrow(options) as consumer:
        # A task without slices (a restart batch's warm-up task) only makes sure this worker
        # has a connected consumer in its pool for the batch that follows.
        if todo:
            yield from _Reading(consumer, todo, options, batch_rows).run()


def read_slice(
    sl: Slice, options: SourceOptions, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    return read_slices([sl], options, batch_rows)


class _PartitionRead:
    """One partition's slices, read in order; ``expected`` is the next offset still needed."""

    __slots__ = ("cols", "expected", "queue", "slice", "tp", "tp_key")

    def __init__(self, slices: list[Slice], include_headers: bool) -> None:
        self.queue = sorted(slices, key=lambda s: s.start)
        self.slice = self.queue.pop(0)
        self.expected = self.slice.start
        self.tp = TopicPartition(self.slice.topic, self.slice.partition)
        self.tp_key = (self.slice.topic, self.slice.partition)
        self.cols = _Columns(include_headers)

    @property
    def left(self) -> int:
        return self.slice.end - self.expected


class _Reading:
    """The read loop of one task over one consumer (its thread owns the consumer)."""

    def __init__(
        self, consumer: Consumer, slices: list[Slice], options: SourceOptions, batch_rows: int
    ) -> None:
        self.consumer, self.options, self.batch_rows = consumer, options, batch_rows
        by_tp: dict[tuple[str, int], list[Slice]] = {}
        for sl in slices:
            by_tp.setdefault((sl.topic, sl.partition), []).append(sl)
        self.active = {
            key: _PartitionRead(group, options.include_headers) for key, group in by_tp.items()
        }

    def run(self) -> Iterator[pa.RecordBatch]:
        """Offsets may be missing inside a slice (compaction, transaction markers): a slice
        ends at its first record at or past ``end``, or at partition EOF once the log end has
        reached ``end``. Records deleted by retention before they were read (a slice that
        starts below the log start, even a replayed one wholly below it) are data loss, per
        ``failOnDataLoss``: ``auto.offset.reset=error`` turns an out-of-range fetch into an
        error event instead of a silent jump to the log start."""
        self.consumer.incremental_assign(
            [TopicPartition(r.tp.topic, r.tp.partition, r.expected) for r in self.active.values()]
        )
        waited_since = time.monotonic()
        while self.active:
            # Never ask for more than the slices still hold: consume() returns only once it
            # has as many messages as asked for, or at the timeout; asking for more at the
            # tail of a log waited out the whole timeout in every such task.
            want = min(self.batch_rows, sum(r.left for r in self.active.values()), 10_000)
            msgs = self.consumer.consume(max(want, 1), timeout=0.5)
            if not msgs:
                if time.monotonic() - waited_since > self.options.poll_timeout_s:
                    raise TimeoutError(
                        f"no record of {self._pending()} arrived within"
                        f" kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_s * 1000:g}"
                    )
                continue
            waited_since = time.monotonic()
            # The hot path, per record: kept inline (no call, no generator per record).
            active, batch_rows = self.active, self.batch_rows
            for m in msgs:
                read = active.get((m.topic(), m.partition()))  # type: ignore[arg-type]
                if read is None:
                    continue  # a partition this task is done with, fetched before it let go
                if m.error() is not None:
                    yield from self._event(read, m)
                    continue
                offset: int = m.offset()  # type: ignore[assignment]  # a record has one
                if offset < read.expected:
                    continue  # fetched before a re-position, or left over from a previous read
                if offset >= read.slice.end:
                    # The first record past the slice's end (its last offsets hold no record:
                    # a transaction marker, an aborted or compacted record) may be the next
                    # slice's own: it is read again against that slice, never dropped.
                    while offset >= read.slice.end and read.tp_key in active:
                        yield from self._finish(read, passed=offset)
                    if read.tp_key not in active or offset < read.expected:
                        continue
                read.expected = offset + 1
                cols = read.cols
                ts_type, ts = m.timestamp()
                cols.keys.append(m.key())
                cols.values.append(m.value())
                cols.offsets.append(offset)
                cols.ts.append(ts if ts_type else None)
                cols.ts_types.append(ts_type - 1)  # librdkafka 0/1/2 -> Kafka -1/0/1
                if cols.headers is not None:
                    cols.headers.append(m.headers() or None)
                if read.expected >= read.slice.end:
                    yield from self._finish(read, passed=offset)
                elif len(cols.offsets) >= batch_rows:
                    yield cols.batch(read.slice)
                    read.cols = _Columns(self.options.include_headers)

    def _pending(self) -> str:
        return ", ".join(
            f"{r.slice.topic}-{r.slice.partition} [{r.expected}, {r.slice.end})"
            for r in list(self.active.values())[:5]
        )

    def _event(self, read: _PartitionRead, m: Any) -> Iterator[pa.RecordBatch]:
        """An error event: records gone (out of range), partition EOF, or a real error."""
        sl, err = read.slice, m.error()
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            resume = _deleted_below(self.consumer, read.tp, sl, read.expected, self.options)
            if resume is None:
                yield from self._finish(read)
            else:
                self._seek(read, resume)
            return
        if err.code() != KafkaError._PARTITION_EOF:
            raise KafkaException(err)
        eof = m.offset()
        # One EOF may end several slices: the next one goes on from where the consumer is,
        # without a seek (see _finish), and no other EOF comes until the log grows.
        while True:
            if eof is not None and eof >= read.slice.end:
                yield from self._finish(read, passed=eof - 1)
            elif _log_end_below(self.consumer, read.tp, read.slice, self.options):
                yield from self._finish(read)
                return
            else:
                return  # e.g. an open transaction: the records up to end will come
            if read.tp_key not in self.active or eof is None or read.expected > eof:
                return  # done, or re-positioned ahead: that fetch sends its own EOF

    def _finish(self, read: _PartitionRead, passed: int | None = None) -> Iterator[pa.RecordBatch]:
        """The current slice is done: hand over its records, go on with the partition's next
        slice, or stop fetching the partition.

        ``passed``: the consumer has delivered every record of the partition up to this
        offset (the record just seen, or the log end minus one at partition EOF). A next
        slice that starts at or below ``passed + 1`` is read on from there without a seek:
        the records below ``passed`` that it covers do not exist (they would have come
        before), and the one at ``passed`` is the caller's to read again. A seek there
        would drop what the consumer already fetched, that record included (issue 33's
        adversary: two adjacent chunks of a partition in one task, the first ending on a
        transaction marker, lost the record after the marker). Further on, a seek skips
        the gap.
        """
        if len(read.cols):
            yield read.cols.batch(read.slice)
            read.cols = _Columns(self.options.include_headers)
        if read.queue:
            read.slice = read.queue.pop(0)
            if passed is not None and read.slice.start <= passed + 1:
                read.expected = read.slice.start
            else:
                self._seek(read, read.slice.start)
        else:
            del self.active[read.tp_key]
            self.consumer.incremental_unassign([read.tp])

    def _seek(self, read: _PartitionRead, offset: int) -> None:
        # A seek fails on a partition in the error state an out-of-range fetch leaves behind;
        # assigning it again at the new offset always works.
        self.consumer.incremental_unassign([read.tp])
        self.consumer.incremental_assign([TopicPartition(read.tp.topic, read.tp.partition, offset)])
        read.expected = offset


def _loss(message: str, options: SourceOptions) -> None:
    if options.fail_on_data_loss:
        raise DataLossError(message + " (set failOnDataLoss=false to skip them)")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def _deleted_below(
    consumer: Consumer, tp: TopicPartition, sl: Slice, at: int, options: SourceOptions
) -> int | None:
    """The fetch at ``at`` was out of range: report the loss, and where to go on (None: stop).

    Below the log start, the records up to it were deleted (retention, DeleteRecords). Above
    the log end, the log was truncated (or the topic recreated) under the slice.
    """
    low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    if at >= low:
        _loss(
            f"{sl.topic}-{sl.partition}: the log ends at {high}, below offset {at} of the"
            f" planned range [{sl.start}, {sl.end}) (truncated, or the topic was recreated)",
            options,
        )
        return None
    _loss(
        f"{sl.topic}-{sl.partition}: offsets [{at}, {min(low, sl.end)}) were deleted before"
        f" they were read (the log now starts at {low})",
        options,
    )
    return low if low < sl.end else None


def _log_end_below(
    consumer: Consumer, tp: TopicPartition, sl: Slice, options: SourceOptions
) -> bool:
    """At EOF before ``end``: True (stop) when the log really ends below it (truncation)."""
    _, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    if high < sl.end:
        _loss(
            f"{sl.topic}-{sl.partition}: the log ends at {high}, below the planned end {sl.end}",
            options,
        )
        return True
    return False
