"""The Spark source's options a Spark Kafka user reaches for (issue 19, part A, item 5).

Each is either implemented with the meaning it has in Spark's Kafka source or refused when the
query starts, with an error that names it. The option parsing and the planning helpers are
pure; the reader-level checks use a fake Kafka (they need pyspark only to import).
"""

from __future__ import annotations

import pytest

from fastrebalance.spark._batch import plan_batch
from fastrebalance.spark._offsetspec import LATEST
from fastrebalance.spark._options import parse_options
from fastrebalance.spark._plan import Marks, Slice, spread, tasks_for
from fastrebalance.spark._subscription import parse_subscription

BASE = {"kafka.bootstrap.servers": "h:1", "subscribe": "orders"}


def opts(**extra: str):
    return parse_options({**BASE, **extra})


# -- refused, naming the option -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"catchup.treshold": "5"}, r"catchup\.treshold.*catchup\.threshold"),
        ({"catchup.maxOffsetPerTrigger": "5"}, "catchup.maxOffsetsPerTrigger"),
        ({"catchup.whatever": "5"}, "catchup.whatever"),
        ({"endingOffsets": "latest"}, "endingOffsets is for batch reads"),
        ({"endingTimestamp": "5"}, "endingTimestamp"),
        ({"subscribePattern": "o.*"}, "exactly one of"),
        ({"assign": '{"orders": [0]}'}, "exactly one of"),
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"}, "minOffsetsPerTrigger"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"minPartitions": "0"}, "minPartitions"),
        ({"includeHeaders": "yes"}, "includeHeaders"),
        ({"startingTimestamp": "-5"}, "startingTimestamp"),
        ({"startingOffsetsByTimestamp": '{"orders": {"0": -1}}'}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestampStrategy": "newest"}, "startingOffsetsByTimestampStrategy"),
        ({"maxRecordsPerPartition": "x"}, "maxRecordsPerPartition"),
        ({"kafka.isolation.level": "committed"}, "kafka.isolation.level='committed'"),
        # issue 33, item 3: refused by name before any Kafka client is made
        ({"kafka.security.protocol": "SASL_PLAIN"}, r"protocol='SASL_PLAIN'.*SASL_PLAINTEXT\?"),
        ({"kafka.security.protocol": "TLS"}, r"must be one of PLAINTEXT, SSL, SASL_PLAINTEXT"),
    ],
)
def test_refused_options_name_themselves(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        opts(**extra)


def test_unknown_options_that_are_not_ours_are_ignored_as_spark_does() -> None:
    assert opts(someOtherOption="x", checkpointLocation="/tmp/x").subscription.topics == ("orders",)


def test_subscription_forms() -> None:
    meta = {"orders": [0, 1], "orders-eu": [0], "refunds": [0], "__consumer_offsets": [0]}
    assert parse_subscription({"subscribe": "orders, refunds"}).select(meta) == [
        ("orders", 0), ("orders", 1), ("refunds", 0),
    ]  # fmt: skip
    pattern = parse_subscription({"subscribepattern": "orders.*|__.*"})
    assert pattern.select(meta) == [("orders", 0), ("orders", 1), ("orders-eu", 0)]
    assign = parse_subscription({"assign": '{"orders": [1], "refunds": [0, 3]}'})
    assert assign.select(meta) == [("orders", 1), ("refunds", 0)]
    assert assign.missing(meta) == [("refunds", 3)]
    with pytest.raises(ValueError, match="assign"):
        parse_subscription({"assign": '["orders"]'})
    with pytest.raises(ValueError, match="subscribePattern"):
        parse_subscription({"subscribepattern": "(("})
    # startingOffsets may name only topics the query reads
    with pytest.raises(ValueError, match="does not read"):
        parse_options({**BASE, "subscribe": "orders", "startingOffsets": '{"x": {"0": 1}}'})
    by_pattern = {"kafka.bootstrap.servers": "h", "subscribePattern": "o.*"}
    parse_options({**by_pattern, "startingOffsets": '{"ox": {"0": 1}}'})


def test_starting_offsets_must_name_exactly_the_partitions_read() -> None:
    starting = opts(startingOffsets='{"orders": {"0": 5, "1": -2, "7": 3}}').starting
    with pytest.raises(ValueError, match=r"not in Kafka: \['orders-7'\]"):
        starting.per_partition([("orders", 0), ("orders", 1)])
    with pytest.raises(ValueError, match=r"missing: \['orders-2'\]"):
        starting.per_partition([("orders", p) for p in range(3)] + [("orders", 7)])


def test_starting_by_timestamp_and_its_strategy() -> None:
    def lookup(stamps):  # the first offset at or after ts is ts // 10, below 100
        return {tp: ts // 10 if ts // 10 < 100 else -1 for tp, ts in stamps.items()}

    parts = [("orders", 0), ("orders", 1)]
    by_tp = opts(startingOffsetsByTimestamp='{"orders": {"0": 50, "1": 5000}}').starting
    with pytest.raises(ValueError, match="orders-1 has no record at or after timestamp 5000"):
        by_tp.per_partition(parts, lookup)
    lenient = opts(
        startingOffsetsByTimestamp='{"orders": {"0": 50, "1": 5000}}',
        startingOffsetsByTimestampStrategy="latest",
    ).starting
    assert lenient.per_partition(parts, lookup) == {("orders", 0): 5, ("orders", 1): LATEST}
    everywhere = opts(startingTimestamp="300", startingOffsets="earliest").starting
    assert everywhere.per_partition(parts, lookup) == {("orders", 0): 30, ("orders", 1): 30}
    # the initial offset is a function of the options alone
    assert everywhere.spec() == {"timestamp": 300}
    assert by_tp.spec() == {"timestamp": {"orders": {"0": 50, "1": 5000}}}


def test_durations_as_spark_writes_them() -> None:
    assert opts().max_trigger_delay_s == 900
    assert opts(maxTriggerDelay="30s").max_trigger_delay_s == 30
    assert opts(maxTriggerDelay="500ms").max_trigger_delay_s == 0.5
    assert opts(maxTriggerDelay="2m").max_trigger_delay_s == 120
    assert opts(maxTriggerDelay="250").max_trigger_delay_s == 0.25


def test_group_id_prefix_and_slice_size() -> None:
    conf = opts(groupIdPrefix="etl").consumer_config("driver")
    assert conf["group.id"].startswith("etl-driver-")
    assert opts(**{"catchup.chunkSize": "500", "maxRecordsPerPartition": "200"}).slice_size == 200
    assert opts(**{"catchup.chunkSize": "500"}).slice_size == 500


def test_security_protocols_librdkafka_accepts_are_accepted_in_any_case() -> None:
    for value in ("plaintext", "SSL", "sasl_plaintext", "SASL_SSL"):
        assert opts(**{"kafka.security.protocol": value}).kafka["security.protocol"] == value


def test_isolation_level_is_spark_kafka_sources_unless_set() -> None:
    """Issue 33, item 2: librdkafka reads read_committed by default, Spark's Kafka source (the
    Java consumer's default) read_uncommitted; the driver's log ends and the executors' reads
    come from the same config, so they agree either way."""
    for role in ("driver", "executor"):
        assert opts().consumer_config(role)["isolation.level"] == "read_uncommitted"
        chosen = opts(**{"kafka.isolation.level": " READ_COMMITTED"}).consumer_config(role)
        assert chosen["isolation.level"] == "read_committed"


# -- batch reads -----------------------------------------------------------------------------
def test_batch_options() -> None:
    batch = parse_options({**BASE, "endingOffsets": '{"orders": {"0": 50, "1": -1}}'}, batch=True)
    assert batch.starting.kind == "earliest"
    assert batch.ending is not None
    assert batch.ending.per_partition([("orders", 0), ("orders", 1)]) == {
        ("orders", 0): 50,
        ("orders", 1): LATEST,
    }
    with pytest.raises(ValueError, match="startingOffsets=latest is for streams"):
        parse_options({**BASE, "startingOffsets": "latest"}, batch=True)
    with pytest.raises(ValueError, match="startingOffsets"):
        parse_options({**BASE, "startingOffsets": '{"orders": {"0": -1}}'}, batch=True)
    with pytest.raises(ValueError, match="endingOffsets"):
        parse_options({**BASE, "endingOffsets": '{"orders": {"0": -2}}'}, batch=True)


def test_batch_plan_resolves_and_cuts() -> None:
    marks = {("o", 0): (10, 400), ("o", 1): (0, 0), ("o", 2): (0, 90)}
    starts = {("o", 0): -2, ("o", 1): -2, ("o", 2): 30}
    slices = plan_batch(starts, dict.fromkeys(marks, -1), marks, 200)
    got = [(s.partition, s.start, s.end) for s in slices]
    assert got == [(0, 10, 205), (0, 205, 400), (2, 30, 90)]
    assert not any(s.catchup for s in slices)
    with pytest.raises(ValueError, match="o-2: the starting offset 80 is above the ending 50"):
        plan_batch({("o", 2): 80}, {("o", 2): 50}, marks, 200)


# -- minPartitions -------------------------------------------------------------------------------
def test_min_partitions_splits_slices_in_proportion_to_their_size() -> None:
    slices = [Slice("o", 0, 0, 900, False), Slice("o", 1, 0, 100, False), Slice("o", 2, 0, 2, True)]
    out = spread(slices, 10)
    assert len(out) >= 10
    assert sum(1 for s in out if s.partition == 0) == 9
    assert [(s.start, s.end) for s in out if s.partition == 1] == [(0, 100)]
    assert sorted((s.partition, o) for s in out for o in range(s.start, s.end)) == sorted(
        (s.partition, o) for s in slices for o in range(s.start, s.end)
    )
    # packed into fewer tasks without it; each slice its own task with it
    assert len(tasks_for(slices, 1000)) == 2
    assert len(tasks_for(slices, 1000, min_partitions=10)) == len(out)


# -- the stream reader with a fake Kafka -----------------------------------------------------------
class FakeKafka:
    def __init__(self, highs: dict[tuple[str, int], int]) -> None:
        self.highs = highs

    def marks(self, refresh: bool = False, lows: bool = False) -> dict:
        return {tp: Marks(0, h) for tp, h in self.highs.items()}

    def topics(self) -> dict:
        out: dict[str, list[int]] = {}
        for t, p in sorted(self.highs):
            out.setdefault(t, []).append(p)
        return out

    def offsets_for_times(self, stamps: dict) -> dict:
        return dict.fromkeys(stamps, -1)

    def partitions(self) -> list:
        return sorted(self.highs)

    def close(self) -> None:
        pass


def stream_reader(highs: dict, **extra: str):
    pytest.importorskip("pyspark", minversion="4.2")
    from fastrebalance.spark._stream import FastRebalanceStreamReader

    base = {k: v for k, v in BASE.items() if not ("assign" in extra and k == "subscribe")}
    reader = FastRebalanceStreamReader(parse_options({**base, **extra}))
    reader._fetcher = FakeKafka(highs)  # type: ignore[assignment]
    return reader


def default_limit(reader):
    return reader.getDefaultReadLimit()


def test_a_partition_that_does_not_exist_in_starting_offsets_fails_the_query() -> None:
    reader = stream_reader({("orders", 0): 10}, startingOffsets='{"orders": {"0": 1, "5": 2}}')
    with pytest.raises(ValueError, match=r"not in Kafka: \['orders-5'\]"):
        reader.latestOffset(reader.initialOffset(), default_limit(reader))


def test_an_assigned_partition_that_does_not_exist_fails_the_query() -> None:
    reader = stream_reader({("orders", 0): 10}, assign='{"orders": [0, 3]}')
    with pytest.raises(ValueError, match=r"assign names partitions that do not exist.*orders-3"):
        reader.latestOffset(reader.initialOffset(), default_limit(reader))


def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(monkeypatch) -> None:
    from fastrebalance.spark import _stream

    clock = [100.0]
    monkeypatch.setattr(_stream.time, "monotonic", lambda: clock[0])
    kafka = {("orders", 0): 10, ("orders", 1): 10}
    reader = stream_reader(kafka, minOffsetsPerTrigger="50", maxTriggerDelay="30s")
    offset = reader.latestOffset(reader.initialOffset(), default_limit(reader))  # batch 0
    offset = reader.latestOffset(offset, default_limit(reader))  # the run's first call fires
    kafka[("orders", 0)] += 20
    clock[0] += 10
    assert reader.latestOffset(offset, default_limit(reader)) is offset  # 20 < 50: wait
    kafka[("orders", 1)] += 40
    clock[0] += 1
    offset = reader.latestOffset(offset, default_limit(reader))  # 60 >= 50: go
    assert offset == {"orders": {"0": 30, "1": 50}}
    kafka[("orders", 0)] += 1
    clock[0] += 29
    assert reader.latestOffset(offset, default_limit(reader)) is offset
    clock[0] += 1  # 30 s since the last batch: it goes with what there is
    assert reader.latestOffset(offset, default_limit(reader)) == {"orders": {"0": 31, "1": 50}}


def test_min_offsets_per_trigger_never_holds_back_trigger_once() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    kafka = {("orders", 0): 10}
    reader = stream_reader(kafka, minOffsetsPerTrigger="50")
    offset = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    kafka[("orders", 0)] += 5
    reader.latestOffset(offset, ReadAllAvailable())  # the first call fires anyway
    kafka[("orders", 0)] += 5
    assert reader.latestOffset(offset, ReadAllAvailable()) == {"orders": {"0": 20}}


def test_include_headers_changes_the_schema() -> None:
    pytest.importorskip("pyspark", minversion="4.2")
    from pyspark.sql.pandas.types import to_arrow_schema

    from fastrebalance.spark._kafka import ARROW_SCHEMA_WITH_HEADERS
    from fastrebalance.spark._source import FastRebalanceDataSource

    with_headers = FastRebalanceDataSource({**BASE, "includeHeaders": "true"}).schema()
    assert with_headers.fieldNames()[-2:] == ["headers", "catchup"]
    headers_type = with_headers["headers"].dataType.simpleString()
    assert headers_type == "array<struct<key:string,value:binary>>"
    assert to_arrow_schema(with_headers, timezone="UTC").equals(ARROW_SCHEMA_WITH_HEADERS)
    assert "headers" not in FastRebalanceDataSource(dict(BASE)).schema().fieldNames()


def test_a_refused_stream_option_is_raised_by_the_readers_first_call() -> None:
    """PySpark's streaming runner calls ``stop()`` on the reader in a ``finally``, bound or not:
    a refused option must come from a reader's call (with a ``stop()`` that works), or the
    user's last error is the runner's ``UnboundLocalError``."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from fastrebalance.spark._source import SCHEMA, FastRebalanceDataSource

    reader = FastRebalanceDataSource({**BASE, "catchup.thresold": "5"}).streamReader(SCHEMA)
    reader.stop()
    calls = [
        reader.initialOffset,
        reader.getDefaultReadLimit,
        reader.prepareForTriggerAvailableNow,
        lambda: reader.latestOffset({}, ReadMaxRows(1)),
        lambda: reader.partitions({}, {}),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"did you mean catchup\.threshold"):
            call()


@pytest.mark.parametrize(
    ("extra", "batch", "message"),
    [
        ({"startingOffsets": "earlist"}, False, r"earliest, latest or a JSON.*mean earliest"),
        ({"startingOffsets": "Latset"}, False, r"did you mean latest"),
        ({"startingOffsets": "latest"}, True, r"is for streams"),
        ({"startingOffsets": "lastest"}, True, r"must be earliest or a JSON"),
        ({"endingOffsets": "lates"}, True, r"must be latest or a JSON.*did you mean latest"),
    ],
)
def test_a_misspelt_offset_keyword_is_told_what_it_resembles(extra, batch, message) -> None:
    """Issue 33's second adversary: "earlist" was told only that it is not JSON."""
    with pytest.raises(ValueError, match=message):
        parse_options({**BASE, **extra}, batch=batch)


def test_an_unknown_option_like_a_known_one_is_named_in_a_warning(caplog) -> None:
    """Ignored, as Spark's Kafka source ignores what is not its own, but a look-alike of a
    known option is a typo whose default silently holds (no rate limit, here)."""
    with caplog.at_level("WARNING", logger="fastrebalance.spark"):
        parsed = opts(maxOffsetPerTrigger="5", path="/ignored", someOtherSetting="1")
    assert parsed.max_offsets_per_trigger is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "did you mean maxOffsetsPerTrigger" in warned[0], warned
