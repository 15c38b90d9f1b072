"""PySpark Structured Streaming source for Kafka with KIP-333 catch-up after a restart.

    from fastrebalance.spark import register
    register(spark)
    df = (spark.readStream.format("fastrebalance")
          .option("kafka.bootstrap.servers", "localhost:9092")
          .option("subscribe", "orders")
          .load())

After a restart with a large backlog the first micro-batch carries fresh records, and the
backlog is drained over the following batches in parallel chunks (see docs/spark.md).

Spark itself is imported lazily: the planning code (``fastrebalance.spark._plan``) is pure and
must stay importable, and testable, without pyspark installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA", "FastRebalanceDataSource", "register"]


#: Admission control (ReadLimit) and Trigger.AvailableNow for Python streaming sources.
MIN_PYSPARK = (4, 2)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("fastrebalance")`` available in this session.

    Checks the versions first: on an older PySpark the import of the admission-control API
    fails with a bare ImportError, and without pyarrow the query dies much later with a
    misleading "Python worker failed to connect back".
    """
    import pyspark

    version = tuple(int(x) for x in pyspark.__version__.split(".")[:2] if x.isdigit())
    if version < MIN_PYSPARK:
        raise RuntimeError(
            f"fastrebalance.spark needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))}"
            f" (Python streaming sources with admission control); found {pyspark.__version__}"
        )
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "fastrebalance.spark needs pyarrow: pip install 'fastrebalance[spark]'"
        ) from None
    from ._source import FastRebalanceDataSource

    spark.dataSource.register(FastRebalanceDataSource)


def __getattr__(name: str) -> Any:
    if name in ("SCHEMA", "FastRebalanceDataSource"):
        from . import _source

        return getattr(_source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
