"""Event time during a catch-up: rows a watermark drops are reported, not lost in silence.

By default the source reads a restart's whole backlog in the one batch where Spark's late-row
filter still lets it through (``catchup.splitBacklog=false``, see
``_stream.FastRebalanceStreamReader._batch_budget``). This listener is the guard for the rest:
a query that splits its backlog, or a Spark whose late-row filter differs.

After a restart the first batch holds live records only, and Spark moves the watermark of an
event-time query (``withWatermark``) past them at the end of that batch. Backlog rows read in
the following batches are older than that, so a stateful operator (a windowed aggregation, a
stream-stream join, ``dropDuplicatesWithinWatermark``) drops them as late. Spark counts them
in ``numRowsDroppedByWatermark`` of the query's progress, and says nothing else. A listener is
the only place that sees that number: the source runs in a Python process of its own, which
Spark never tells about operators downstream of it.

``register()`` adds one ``CatchupWatermarkWatch`` per session. It reads each progress event
of a query that reads this source (recognised by its offset JSON) and logs an ERROR the first
time a batch with backlog pending drops rows; with ``on_backlog_dropped="stop"`` it also stops
the query, so that no more backlog is dropped before someone looks. A listener cannot fail a
query, so a stopped query ends without an exception (its log says why).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from ._plan import decode_offset, pending_count

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ON_BACKLOG_DROPPED", "CatchupWatermarkWatch", "backlog_drops", "pending_in"]

log = logging.getLogger("fastrebalance.spark")

#: What the listener does when a watermark drops rows during a catch-up.
ON_BACKLOG_DROPPED = ("log", "stop")

#: Spark's description of every Python streaming source; which one is ours, the offsets tell.
_PYTHON_STREAM = "PythonMicroBatchStream"


def pending_in(offset: str | Mapping[str, Any] | None) -> int | None:
    """Backlog records pending in a source offset as Spark reports it, or None if the offset
    is not this source's (another source, the initial offset, no offset yet).

    ``progress.json`` holds the offset as a JSON object, ``query.lastProgress`` as a string.
    """
    if not offset:
        return None
    try:
        obj = json.loads(offset) if isinstance(offset, str) else offset
        return pending_count(decode_offset(obj))
    except (ValueError, TypeError):
        return None


def backlog_drops(progress: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(rows dropped by the watermark, backlog records pending)`` for a batch that dropped
    rows while one of this source's catch-ups was under way, else None. Pure: a query's
    progress as ``json.loads(progress.json)`` (the shape of ``query.lastProgress``).

    "Under way": the batch started or ended with backlog pending, so it read backlog, or its
    watermark was set by the live records that went first.
    """
    dropped = sum(
        int(op.get("numRowsDroppedByWatermark") or 0) for op in progress.get("stateOperators", [])
    )
    if dropped <= 0:
        return None
    pending = 0
    for source in progress.get("sources", []):
        if _PYTHON_STREAM not in str(source.get("description", "")):
            continue
        counts = [pending_in(source.get(k)) for k in ("startOffset", "endOffset")]
        pending = max(pending, *(c or 0 for c in counts))
    return (dropped, pending) if pending > 0 else None


class CatchupWatermarkWatch(StreamingQueryListener):
    """Logs (and by choice stops) a query whose watermark drops rows during a catch-up.

    Spark calls it on its listener thread; ``told`` (run ids already reported) is touched
    only there. A stop runs on a thread of its own: ``query.stop()`` waits for the query's
    thread, which must not wait for this listener in turn.
    """

    def __init__(self, spark: SparkSession, on_backlog_dropped: str = "log") -> None:
        super().__init__()
        self._session = spark
        self.on_backlog_dropped = on_backlog_dropped
        self.told: set[str] = set()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        found = backlog_drops(progress)
        run = str(progress.get("runId"))
        if found is None or run in self.told:
            return
        self.told.add(run)
        dropped, pending = found
        stop = self.on_backlog_dropped == "stop"
        log.error(
            "query %s, batch %s: the watermark dropped rows as late while a restart backlog"
            " was being read (numRowsDroppedByWatermark=%d, which counts groups, not records,"
            " for an aggregation; %d backlog records pending): the live records read first"
            " moved the watermark past the backlog's event times. Leave catchup.splitBacklog"
            " at false (the default: the whole backlog in the batch after the restart batch),"
            " route rows with catchup=true around the event-time operator, or set"
            " catchup.enabled=false for this query (docs/spark.md, Event time).%s",
            progress.get("name") or progress.get("id"),
            progress.get("batchId"),
            dropped,
            pending,
            " Stopping the query (register(spark, on_backlog_dropped='stop'))." if stop else "",
        )
        if stop:
            threading.Thread(
                target=self._stop, args=(str(progress.get("id")),), daemon=True
            ).start()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.told.discard(str(event.runId))

    def _stop(self, query_id: str) -> None:
        query = self._session.streams.get(query_id)
        if query is not None:
            query.stop()
