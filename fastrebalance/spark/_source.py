"""The Spark-facing data source: its name, its schema, and the reader for each kind of query.

Spark runs a stream reader in one long-lived Python process on the driver (offsets, planning)
and ships a *pickled copy* to executors for ``read``; a batch reader likewise plans on the
driver and reads on executors. Both live in their own modules (_stream, _batch); this one
holds what they share.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._options import parse_options
from ._plan import Slice

__all__ = [
    "HEADERS_FIELD",
    "SCHEMA",
    "FastRebalanceDataSource",
    "KafkaSlicePartition",
    "schema_for",
]

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("catchup", BooleanType()),
    ]
)
#: With includeHeaders=true, before ``catchup``: where Spark's Kafka source has it (last).
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)


def schema_for(include_headers: bool) -> StructType:
    if not include_headers:
        return SCHEMA
    return StructType([*SCHEMA.fields[:-1], HEADERS_FIELD, SCHEMA.fields[-1]])


def _include_headers(options: Mapping[str, str]) -> bool:
    raw = {str(k).lower(): str(v) for k, v in options.items()}.get("includeheaders", "false")
    if raw.strip().lower() not in ("true", "false"):
        raise ValueError(f"option includeHeaders={raw!r} must be true or false")
    return raw.strip().lower() == "true"


class KafkaSlicePartition(InputPartition):
    """One Spark task: offset ranges of Kafka partitions, read together (picklable)."""

    def __init__(self, slices: tuple[Slice, ...]) -> None:
        super().__init__(slices)
        self.slices = slices


class FastRebalanceDataSource(DataSource):
    """``spark.readStream.format("fastrebalance")``: Kafka with KIP-333 catch-up on restart;
    ``spark.read.format("fastrebalance")``: a bounded read, for backfills."""

    @classmethod
    def name(cls) -> str:
        return "fastrebalance"

    def schema(self) -> StructType:
        return schema_for(_include_headers(self.options))

    def _check_schema(self, schema: StructType) -> None:
        expected = self.schema()
        if [f.name for f in schema.fields] != expected.fieldNames():
            raise ValueError(
                f"the fastrebalance source has a fixed schema {expected.simpleString()};"
                f" got {schema.simpleString()}"
            )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A bad option is raised from the reader's first call, not from here: PySpark's
        streaming runner calls ``stop()`` on the reader in a ``finally`` even when this method
        raised, so the user's last line would be its ``UnboundLocalError``, not our message."""
        from ._stream import FastRebalanceStreamReader, RefusedStreamReader

        try:
            self._check_schema(schema)
            options = parse_options(self.options)
        except ValueError as exc:
            return RefusedStreamReader(exc)
        return FastRebalanceStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from ._batch import FastRebalanceBatchReader

        self._check_schema(schema)
        return FastRebalanceBatchReader(parse_options(self.options, batch=True))
