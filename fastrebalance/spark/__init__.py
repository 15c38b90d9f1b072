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
#: Why 4.0 and 4.1 cannot run the streaming source (docs/spark.md, "Supported Spark versions").
OLD_PYSPARK_REASON = (
    "pyspark 4.0 and 4.1 call DataSourceStreamReader.latestOffset() without the start offset"
    " and without a read limit (SupportsAdmissionControl's latestOffset(start, limit),"
    " getDefaultReadLimit(), the pyspark.sql.streaming.datasource module and"
    " SupportsTriggerAvailableNow came in 4.2, SPARK-55304): after a restart the source"
    " cannot know where the checkpoint left off when it plans the first batch, which is"
    " where it must skip the backlog, nor apply maxOffsetsPerTrigger or Trigger.AvailableNow"
)


def register(
    spark: SparkSession, *, on_backlog_dropped: str = "log", check_workers: bool = True
) -> None:
    """Make ``spark.readStream.format("fastrebalance")`` available in this session.

    Checks the versions first: on an older PySpark the import of the admission-control API
    fails with a bare ImportError, and without pyarrow the query dies much later with a
    misleading "Python worker failed to connect back".

    Also adds, once per session, a listener that logs an ERROR when an event-time query's
    watermark drops rows while a restart backlog is read (Spark only counts them), and with
    ``on_backlog_dropped="stop"`` stops that query too (see ``_watch`` and docs/spark.md,
    "Event time"). Calling it again changes that choice for the session's listener.

    With ``check_workers`` (once per session), runs a one-row Spark job to ask the Python that
    Spark's workers run whether it can import this version of fastrebalance and pyarrow, and
    raises RuntimeError naming that interpreter and PYSPARK_PYTHON / spark.pyspark.python if
    not: otherwise the mistake shows as ``No module named 'fastrebalance'`` deep in a
    worker's traceback when the query starts (see ``_workers``).
    """
    from ._watch import ON_BACKLOG_DROPPED

    if on_backlog_dropped not in ON_BACKLOG_DROPPED:
        raise ValueError(
            f"on_backlog_dropped={on_backlog_dropped!r} must be one of {ON_BACKLOG_DROPPED}"
        )
    import pyspark

    version = tuple(int(x) for x in pyspark.__version__.split(".")[:2] if x.isdigit())
    if version < MIN_PYSPARK:
        raise RuntimeError(
            f"fastrebalance.spark needs pyspark >= {'.'.join(map(str, MIN_PYSPARK))};"
            f" found {pyspark.__version__}: {OLD_PYSPARK_REASON}"
        )
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "fastrebalance.spark needs pyarrow: pip install 'fastrebalance[spark]'"
        ) from None
    from ._source import FastRebalanceDataSource
    from ._watch import CatchupWatermarkWatch

    if check_workers and not getattr(spark, _CHECKED_ATTR, False):
        from ._workers import check_workers as check

        check(spark)
        setattr(spark, _CHECKED_ATTR, True)

    spark.dataSource.register(FastRebalanceDataSource)
    watch = getattr(spark, _WATCH_ATTR, None)
    if watch is None:
        watch = CatchupWatermarkWatch(spark, on_backlog_dropped)
        spark.streams.addListener(watch)
        setattr(spark, _WATCH_ATTR, watch)
    watch.on_backlog_dropped = on_backlog_dropped


#: Where a session keeps its listener, so that registering twice adds it once.
_WATCH_ATTR = "_fastrebalance_watch"
#: Set on a session whose worker Python passed the check.
_CHECKED_ATTR = "_fastrebalance_workers_checked"


def __getattr__(name: str) -> Any:
    if name in ("SCHEMA", "FastRebalanceDataSource"):
        from . import _source

        return getattr(_source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
