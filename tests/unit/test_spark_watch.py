"""The event-time watch (issue 33, item 4): which query progress reports a catch-up loss.

Progress dicts in the shape of ``query.lastProgress``, as Spark 4.3 reports them for this
source (its description is Spark's, the offsets are ours).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark", minversion="4.2")

from fastrebalance.spark._watch import backlog_drops, pending_in

OURS = "org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream@5d8c391d"


def progress(start: object, end: object, *dropped: int, description: str = OURS) -> dict:
    return {
        "id": "q",
        "runId": "r",
        "batchId": 7,
        "sources": [
            {
                "description": description,
                "startOffset": None if start is None else json.dumps(start),
                "endOffset": json.dumps(end),
            }
        ],
        "stateOperators": [{"numRowsDroppedByWatermark": n} for n in dropped],
    }


def test_pending_backlog_in_an_offset_as_spark_reports_it() -> None:
    assert pending_in('{"orders": {"0": [900, [100, 400]], "1": 50}}') == 300
    assert pending_in('{"orders": {"0": 12}, "@from": {}}') == 0
    assert pending_in('{"@initial": "latest"}') is None  # batch 0's start
    assert pending_in(None) is None and pending_in("not json") is None
    # a listener's progress.json holds the offsets as JSON objects, not strings
    assert pending_in({"orders": {"0": [900, [100, 400]]}}) == 300


def test_offsets_as_json_objects_in_a_listeners_progress() -> None:
    reading = progress({"o": {"0": [900, [100, 400]]}}, {"o": {"0": 950}}, 5)
    for source in reading["sources"]:
        source["startOffset"] = json.loads(source["startOffset"])
        source["endOffset"] = json.loads(source["endOffset"])
    assert backlog_drops(reading) == (5, 300)


def test_a_drop_while_backlog_is_pending_is_reported() -> None:
    # a backlog batch: it starts with backlog pending and drains part of it
    reading = progress({"o": {"0": [900, [100, 400]]}}, {"o": {"0": [950, [300, 400]]}}, 0, 180)
    assert backlog_drops(reading) == (180, 300)
    # the batch that drains the last of it
    last = progress({"o": {"0": [950, [300, 400]]}}, {"o": {"0": 990}}, 40)
    assert backlog_drops(last) == (40, 100)


def test_no_report_without_a_drop_or_without_a_catchup() -> None:
    assert backlog_drops(progress({"o": {"0": [900, [1, 4]]}}, {"o": {"0": 990}}, 0, 0)) is None
    assert backlog_drops(progress({"o": {"0": 900}}, {"o": {"0": 990}}, 25)) is None  # late live
    assert backlog_drops(progress(None, {"o": {"0": 5}, "@from": {}}, 3)) is None  # batch 0
    other = progress({"o": {"0": [900, [1, 4]]}}, {"o": {"0": 990}}, 3, description="Kafka")
    assert backlog_drops(other) is None  # Spark's own Kafka source: not ours to judge
