"""The source's Kafka side: log ends for the driver, offset slices for the executors.

No Spark import: the executor half only needs pyarrow, and both halves can be tested against
the embedded cluster without starting a JVM.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ._options import SourceOptions
from ._plan import Marks, Slice, TopicPartitionKey

__all__ = [
    "ARROW_FIELDS",
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_HEADERS",
    "DataLossError",
    "OffsetFetcher",
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
_PARTITION_REFRESH_S = 5.0


class DataLossError(RuntimeError):
    """Records that should have been read are gone (retention, truncation); see failOnDataLoss."""


class OffsetFetcher:
    """The driver's view of the topics: their partitions and watermarks, cached briefly.

    Spark asks for the latest offset every ~10 ms while a query is idle; a fresh ListOffsets
    per partition each time would be pure overhead, so watermarks are reused for
    ``watermark_cache_s`` and the partition list for a few seconds. The consumer is created on
    first use: this object lives in the reader, which Spark pickles.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._partitions: list[TopicPartitionKey] = []
        self._partitions_at = float("-inf")
        self._marks: dict[TopicPartitionKey, Marks] = {}
        self._marks_at = float("-inf")

    def __getstate__(self) -> dict[str, Any]:
        # Never ship a live handle (or its cache) to an executor.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._options.consumer_config("driver"))
        return self._consumer

    def partitions(self, *, refresh: bool = False) -> list[TopicPartitionKey]:
        """The partitions the subscription reads now: one metadata request for all topics."""
        now = time.monotonic()
        if refresh or now - self._partitions_at > _PARTITION_REFRESH_S:
            self._partitions = self._options.subscription.select(self.topics())
            self._partitions_at = now
        return list(self._partitions)

    def topics(self) -> dict[str, list[int]]:
        """``{topic: partitions}`` of the cluster (topics with an error left out)."""
        md = self._retry(lambda: self._client().list_topics(timeout=10))
        out: dict[str, list[int]] = {}
        for name, meta in md.topics.items():
            if meta.error is not None:
                log.debug("topic %s has no metadata (%s)", name, meta.error)
                continue
            out[name] = sorted(meta.partitions)
        return out

    def marks(self, *, refresh: bool = False) -> dict[TopicPartitionKey, Marks]:
        """Watermarks of every subscribed partition; ``refresh`` bypasses the cache."""
        now = time.monotonic()
        if refresh or now - self._marks_at > self._options.watermark_cache_s:
            client = self._client()
            out: dict[TopicPartitionKey, Marks] = {}
            for topic, p in self.partitions(refresh=refresh):
                low, high = self._retry(
                    lambda t=topic, p=p: client.get_watermark_offsets(
                        TopicPartition(t, p), timeout=10, cached=False
                    )
                )
                out[(topic, p)] = Marks(low, high)
            self._marks, self._marks_at = out, time.monotonic()
        return dict(self._marks)

    def offsets_for_times(
        self, stamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """Each partition's first offset at or after its timestamp (ms), or -1 if none."""
        query = [TopicPartition(t, p, ts) for (t, p), ts in sorted(stamps.items())]
        found = self._retry(lambda: self._client().offsets_for_times(query, timeout=10))
        out: dict[TopicPartitionKey, int] = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
            out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else -1
        return out

    def _retry(self, call: Any) -> Any:
        """fetchOffset.numRetries tries: a broker restart should not fail the whole query."""
        tries = self._options.fetch_retries
        for attempt in range(tries):
            try:
                return call()
            except KafkaException:
                if attempt == tries - 1:
                    raise
                time.sleep(self._options.fetch_retry_interval_s * (attempt + 1))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()


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
    """Every stored record of each slice, in order, as Arrow batches (one task's work)."""
    todo = [sl for sl in slices if sl.size > 0]
    if not todo:
        return
    with _borrow(options) as consumer:
        for sl in todo:
            yield from _read_one(consumer, sl, options, batch_rows)


def read_slice(
    sl: Slice, options: SourceOptions, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    return read_slices([sl], options, batch_rows)


def _read_one(
    consumer: Consumer, sl: Slice, options: SourceOptions, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """Every stored record of ``[sl.start, sl.end)``, then stop.

    Offsets may be missing inside the slice (compaction, transaction markers): the read ends
    at the first record at or past ``end``, or at partition EOF once the log end has reached
    ``end``. Records deleted by retention before they were read (the slice starts below the
    log start, even a replayed slice that lies wholly below it) are data loss, reported per
    ``failOnDataLoss``: the consumer's ``auto.offset.reset=error`` turns an out-of-range
    fetch into an error event instead of a silent jump to the log start.
    """
    tp = TopicPartition(sl.topic, sl.partition)
    consumer.assign([TopicPartition(sl.topic, sl.partition, sl.start)])
    cols = _Columns(options.include_headers)
    waited_since = time.monotonic()
    done = False
    expected = sl.start  # the next offset the slice still needs
    while not done:
        # Never ask for more than the slice still holds: consume() returns only once it has
        # as many messages as asked for, or at the timeout. Asking for 8192 at the tail of a
        # log (a live span, a backlog chunk that ends at the restart point) waited the whole
        # 0.5 s in every such task; the records left, or partition EOF, now fill the request.
        msgs = consumer.consume(min(batch_rows, sl.end - expected, 10_000), timeout=0.5)
        if not msgs:
            if time.monotonic() - waited_since > options.poll_timeout_s:
                raise TimeoutError(
                    f"no record of {sl.topic}-{sl.partition} [{sl.start}, {sl.end}) arrived"
                    f" within kafkaConsumer.pollTimeoutMs={options.poll_timeout_s * 1000:g}"
                )
            continue
        waited_since = time.monotonic()
        for m in msgs:
            if m.partition() != sl.partition or m.topic() != sl.topic:
                continue  # left over from this consumer's previous assignment
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    resume = _deleted_below(consumer, tp, sl, expected, options)
                    if resume is None:
                        done = True
                        break
                    consumer.incremental_unassign([tp])
                    consumer.incremental_assign([TopicPartition(sl.topic, sl.partition, resume)])
                    expected = resume
                    break  # the rest of this call's messages predate the new position
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                eof = m.offset()
                if (eof is not None and eof >= sl.end) or _log_end_below(consumer, tp, sl, options):
                    done = True
                    break
                continue  # e.g. an open transaction: the records up to end will come
            offset: int = m.offset()  # type: ignore[assignment]  # a record: it has one
            if offset < expected:
                continue  # left over from a previous assignment of the same partition
            if offset >= sl.end:
                done = True
                break
            expected = offset + 1
            ts_type, ts = m.timestamp()
            cols.keys.append(m.key())
            cols.values.append(m.value())
            cols.offsets.append(offset)
            cols.ts.append(ts if ts_type else None)
            cols.ts_types.append(ts_type - 1)  # librdkafka 0/1/2 -> Kafka -1/0/1
            if cols.headers is not None:
                cols.headers.append(m.headers() or None)
            if offset + 1 >= sl.end:
                done = True
                break
        if len(cols) >= batch_rows or (done and len(cols)):
            yield cols.batch(sl)
            cols = _Columns(options.include_headers)


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
