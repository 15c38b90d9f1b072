"""The batch reader: ``spark.read.format("fastrebalance")``, a bounded read for backfills.

It reads ``[startingOffsets, endingOffsets)`` of every partition once, as Spark's Kafka source
does for ``spark.read.format("kafka")``: starting at earliest by default, ending at the log
ends seen when the read is planned. No catch-up (there is no restart to catch up from): the
``catchup`` column is false throughout. The plan is made on the driver, in ``partitions()``;
executors read their slices exactly as a streaming task does (same failOnDataLoss rules).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ._fetcher import OffsetFetcher
from ._kafka import read_slices
from ._offsetspec import EARLIEST, LATEST
from ._options import SourceOptions
from ._plan import Slice, TopicPartitionKey, even_chunks, tasks_for
from ._source import KafkaSlicePartition

__all__ = ["FastRebalanceBatchReader", "plan_batch"]


def plan_batch(
    starts: dict[TopicPartitionKey, int],
    ends: dict[TopicPartitionKey, int],
    marks: dict[TopicPartitionKey, tuple[int, int]],
    slice_size: int,
) -> list[Slice]:
    """``[start, end)`` per partition, -2/-1 resolved against ``(low, high)``, in slices of
    at most ``slice_size``; pure."""
    out: list[Slice] = []
    for tp in sorted(starts):
        low, high = marks[tp]
        start = low if starts[tp] == EARLIEST else starts[tp]
        end = high if ends[tp] == LATEST else ends[tp]
        if start > end:
            raise ValueError(
                f"{tp[0]}-{tp[1]}: the starting offset {start} is above the ending {end}"
            )
        out.extend(
            Slice(tp[0], tp[1], a, b, False) for a, b in even_chunks(start, end, slice_size)
        )
    return out


class FastRebalanceBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        assert self.options.ending is not None, "a batch read has ending offsets"
        # Thread ownership: this fetcher's consumer is created, used and closed in this call.
        fetcher = OffsetFetcher(self.options)
        try:
            missing = self.options.subscription.missing(fetcher.topics())
            if missing:
                raise ValueError(
                    "option assign names partitions that do not exist in Kafka:"
                    f" {[f'{t}-{p}' for t, p in missing]}"
                )
            marks = fetcher.marks(refresh=True)
            lookup = fetcher.offsets_for_times
            starts = self.options.starting.per_partition(marks, lookup)
            ends = self.options.ending.per_partition(marks, lookup)
        finally:
            fetcher.close()
        bounds = {tp: (m.low, m.high) for tp, m in marks.items()}
        slices = plan_batch(starts, ends, bounds, self.options.slice_size)
        tasks = tasks_for(slices, self.options.slice_size, self.options.min_partitions)
        return [KafkaSlicePartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if type(partition) is InputPartition and partition.value is None:
            # PySpark plans one InputPartition(None) when partitions() returns none (an empty
            # topic, startingOffsets equal to endingOffsets): there is nothing to read.
            return iter(())
        assert isinstance(partition, KafkaSlicePartition), partition
        return read_slices(partition.slices, self.options)
