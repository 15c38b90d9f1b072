"""The source's options, parsed and validated once, with Spark's Kafka source as the model.

Pure (no Spark, no Kafka) so that every rejection can be unit tested, and so that a typo fails
the query when it starts, on the driver, rather than in an executor task four retries later.
"""

from __future__ import annotations

import difflib
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._offsetspec import EndingOffsets, StartingOffsets, parse_ending, parse_starting
from ._subscription import Subscription, parse_subscription

log = logging.getLogger("fastrebalance.spark")

__all__ = ["OPTIONS", "SourceOptions", "StartingOffsets", "parse_options"]

#: Catch-up starts when a partition's lag at restart exceeds this many records. Higher than
#: the consumer's default (1000): a Spark micro-batch has about a second of fixed cost, so a
#: backlog of a few thousand records is cheaper to replay in order than to skip and revisit.
DEFAULT_THRESHOLD = 10_000
#: Backlog records per catch-up task, at most. A task costs far more than its Kafka reads: a
#: job that parses and writes parquet spent ~0.2 s of a core per task on the Spark side (a
#: file, a commit, a cached block per input partition), so 500,000 records in 24 tasks took
#: 1.3x as long as in 4. Large chunks keep that a small share; a batch still gets about one
#: task per partition with backlog, as Spark's Kafka source reads a live span.
DEFAULT_CHUNK_SIZE = 150_000
#: Backlog records in the first batch that reads backlog, when catchup.maxOffsetsPerTrigger is
#: not set; later batches are sized by duration (DEFAULT_TARGET_BATCH_MS). Nothing has been
#: measured yet at that point, so it is a guess: about the target on a 2-core machine with a
#: job that writes and aggregates each batch (the guess may be far off for a heavier job, and
#: the batch after it is sized from what this one cost). A smaller one splits a backlog the
#: in-order read takes in one batch over several, each with a fixed cost of a second or more:
#: 2,000,000 records took 2 backlog batches at 1,000,000 and 1.26-1.44x the in-order read
#: over 64 partitions, one batch and 1.14x at 2,000,000 (issue 33, docs/spark.md).
FIRST_CATCHUP_BUDGET = 2_000_000
#: What the adaptive backlog budget aims a batch at: long enough that a batch's fixed cost is
#: a small share of it, short enough that the live records sharing it stay reasonably fresh.
#: A job that writes each batch and aggregates it paid about 3 s a batch beyond its records
#: (two Spark jobs, the commit, the next plan), and at 10 s a 2,000,000-record backlog over 8
#: partitions took 4 backlog batches and 1.56-1.66x the in-order read; at 20 s, 2 batches and
#: 1.14-1.48x (two runs each on a quiet machine; issue 33, docs/spark.md).
DEFAULT_TARGET_BATCH_MS = 20_000
#: How long cached watermarks are trusted: latestOffset() is called every ~10 ms while idle.
DEFAULT_WATERMARK_CACHE_MS = 100
#: How long the first batch after a restart may wait for a live record (see _source.py).
DEFAULT_FIRST_BATCH_WAIT_MS = 2000
#: Spark's own defaults for kafkaConsumer.pollTimeoutMs, maxTriggerDelay, groupIdPrefix and
#: the driver's offset fetches (fetchOffset.*).
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY = "15m"
DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"
DEFAULT_FETCH_RETRIES = 3
DEFAULT_FETCH_RETRY_INTERVAL_MS = 10
#: Spark's Kafka source reads with the Java consumer's default, read_uncommitted; librdkafka's
#: default is read_committed. Users moving a query over expect the records Spark gave them.
DEFAULT_ISOLATION_LEVEL = "read_uncommitted"
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
#: What librdkafka accepts for security.protocol (any case). Checked here so that a misspelt
#: value fails the query when it starts, before anything waits on a broker.
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# Option name (as documented) -> (default, meaning), for docs/spark.md and error messages.
OPTIONS: dict[str, tuple[str, str]] = {
    "kafka.bootstrap.servers": ("(required)", "Kafka brokers, host:port[,host:port]"),
    "subscribe": ("(one of three)", "comma-separated topic list"),
    "subscribePattern": ("(one of three)", "regex of the topics to read (whole name)"),
    "assign": ("(one of three)", 'JSON {"topicA": [0, 1]}: exactly these partitions'),
    "startingOffsets": (
        "latest",
        'earliest, latest, or JSON {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest);'
        " only for a new query (a checkpoint wins); earliest for spark.read",
    ),
    "startingOffsetsFromCheckpoint": (
        "(none)",
        'a checkpoint folder of a format("kafka") query (local or mounted): a new query starts'
        " where its last committed batch ended; partitions it does not name from their first"
        " offset",
    ),
    "startingOffsetsByTimestamp": (
        "(none)",
        'JSON {"topic": {"0": 1700000000000}}: each partition starts at its first record at'
        " or after the timestamp (ms); wins over startingOffsets",
    ),
    "startingTimestamp": ("(none)", "one such timestamp for every partition; wins over both"),
    "startingOffsetsByTimestampStrategy": (
        "error",
        "a partition with no record at or after the timestamp: error fails the query,"
        " latest starts it at its log end",
    ),
    "endingOffsets": (
        "latest",
        'spark.read only: latest or JSON {"topic": {"0": 50, "1": -1}} (-1 latest), exclusive',
    ),
    "endingOffsetsByTimestamp": (
        "(none)",
        "spark.read only: JSON of timestamps; each partition ends before its first record at"
        " or after it (its log end if none)",
    ),
    "endingTimestamp": ("(none)", "spark.read only: one such timestamp for every partition"),
    "maxOffsetsPerTrigger": ("(none)", "live records per micro-batch, over all partitions"),
    "minOffsetsPerTrigger": (
        "(none)",
        "live records a micro-batch waits for (up to maxTriggerDelay), over all partitions",
    ),
    "maxTriggerDelay": (
        DEFAULT_MAX_TRIGGER_DELAY,
        "the longest a micro-batch waits for minOffsetsPerTrigger (e.g. 30s, 5m)",
    ),
    "minPartitions": (
        "(none)",
        "at least this many Spark tasks for the live records of a batch (large spans split)",
    ),
    "maxRecordsPerPartition": ("(none)", "records per Spark task, at most (spans split)"),
    "includeHeaders": ("false", "add a headers column: array<struct<key string, value binary>>"),
    "failOnDataLoss": ("true", "fail when records were deleted before being read"),
    "kafkaConsumer.pollTimeoutMs": (
        str(DEFAULT_POLL_TIMEOUT_MS),
        "a task fails if Kafka returns nothing for this long",
    ),
    "fetchOffset.numRetries": (
        str(DEFAULT_FETCH_RETRIES),
        "tries of the driver's metadata and log-end fetches before the query fails",
    ),
    "fetchOffset.retryIntervalMs": (
        str(DEFAULT_FETCH_RETRY_INTERVAL_MS),
        "wait between those tries",
    ),
    "groupIdPrefix": (
        DEFAULT_GROUP_ID_PREFIX,
        "prefix of the consumer group ids the source generates (it never commits)",
    ),
    "catchup.enabled": ("true", "skip a restart backlog and read it in parallel"),
    "catchup.threshold": (
        str(DEFAULT_THRESHOLD),
        "the lag at restart (records, summed over the query's partitions) above which every"
        " lagging partition's backlog is skipped",
    ),
    "catchup.splitBacklog": (
        "false",
        "true lets the backlog budgets spread a restart's backlog over several batches (only"
        " for a query without an event-time watermark over the backlog rows: a watermark"
        " drops what the third batch on reads); false reads it whole in the batch after the"
        " restart batch, where no watermark drops it",
    ),
    "catchup.maxOffsetsPerTrigger": (
        "(adaptive)",
        "with catchup.splitBacklog=true: backlog records per micro-batch, on top of"
        f" maxOffsetsPerTrigger; unset, the first backlog batch takes up to"
        f" {FIRST_CATCHUP_BUDGET} and later ones are sized by catchup.targetBatchDurationMs",
    ),
    "catchup.targetBatchDurationMs": (
        str(DEFAULT_TARGET_BATCH_MS),
        "with catchup.splitBacklog=true: how long a backlog batch should take, when"
        " catchup.maxOffsetsPerTrigger is not set",
    ),
    "catchup.chunkSize": (
        str(DEFAULT_CHUNK_SIZE),
        "records per input partition (Spark task), at most: backlog chunks and large live spans",
    ),
    "catchup.firstBatchWaitMs": (
        str(DEFAULT_FIRST_BATCH_WAIT_MS),
        "after a restart, how long the first batch may wait (inside the planning call) for a"
        " live record, so that it carries live data and the backlog starts with the second"
        " batch; without one by then, the first batch starts the backlog",
    ),
    "catchup.watermarkCacheMs": (
        str(DEFAULT_WATERMARK_CACHE_MS),
        "how long the driver reuses the log ends it fetched",
    ),
    "kafka.isolation.level": (
        DEFAULT_ISOLATION_LEVEL,
        "read_uncommitted (Spark's Kafka source) or read_committed",
    ),
    "kafka.*": ("", "any librdkafka consumer property, e.g. kafka.security.protocol"),
}

# Spark's Kafka source rejects these too: the source manages them itself.
_FORBIDDEN_KAFKA = {
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "the source never commits; Spark's checkpoint holds the offsets",
    "enable.partition.eof": "the source needs partition EOF events to end a read",
    "key.deserializer": "keys are delivered as binary",
    "value.deserializer": "values are delivered as binary",
}
_BATCH_ONLY = ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp")
_CATCHUP = {k.lower(): k for k in OPTIONS if k.startswith("catchup.")}
_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}  # fmt: skip


@dataclass(frozen=True)
class SourceOptions:
    subscription: Subscription
    kafka: Mapping[str, str]
    starting: StartingOffsets = field(default_factory=lambda: StartingOffsets("latest"))
    ending: EndingOffsets | None = None  # spark.read only
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = 900.0
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000
    fetch_retries: int = DEFAULT_FETCH_RETRIES
    fetch_retry_interval_s: float = DEFAULT_FETCH_RETRY_INTERVAL_MS / 1000
    group_id_prefix: str = DEFAULT_GROUP_ID_PREFIX
    catchup_enabled: bool = True
    catchup_threshold: int = DEFAULT_THRESHOLD
    #: Whether the budgets may spread a restart's backlog over several batches: unsafe under
    #: an event-time watermark (see _stream.FastRebalanceStreamReader._batch_budget).
    split_backlog: bool = False
    catchup_budget: int | None = None  # None: adaptive, see _plan.next_catchup_budget
    target_batch_s: float = DEFAULT_TARGET_BATCH_MS / 1000
    chunk_size: int = DEFAULT_CHUNK_SIZE
    first_batch_wait_s: float = DEFAULT_FIRST_BATCH_WAIT_MS / 1000
    watermark_cache_s: float = DEFAULT_WATERMARK_CACHE_MS / 1000

    @property
    def slice_size(self) -> int:
        """Records per Spark task, at most (catchup.chunkSize and maxRecordsPerPartition)."""
        cap = self.max_records_per_partition
        return self.chunk_size if cap is None else min(cap, self.chunk_size)

    def consumer_config(self, role: str) -> dict[str, Any]:
        """librdkafka config for an assign-only consumer that never commits.

        Each consumer gets its own group id unless the user chose one: it never subscribes
        or commits, so the id only has to be valid, and a unique one keeps ACLs and quotas
        keyed by group from lumping unrelated queries together.
        """
        conf: dict[str, Any] = {
            "group.id": f"{self.group_id_prefix}-{role}-{uuid.uuid4().hex[:12]}",
            # The driver's log ends and the executors' reads must agree on it: both come from
            # here (the last stable offset under read_committed, the high watermark otherwise).
            "isolation.level": DEFAULT_ISOLATION_LEVEL,
            **self.kafka,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # A read that starts below the log start (retention) must not silently jump to it:
            # an error event says which records are gone (see _kafka, failOnDataLoss).
            "auto.offset.reset": "error",
        }
        return conf


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark hands options over case-insensitively (lower-cased); be the same when called directly.
    return {str(k).lower(): str(v) for k, v in options.items()}


def _int(options: dict[str, str], key: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"option {key}={raw!r} must be an integer >= {minimum}") from None
    if value < minimum:
        raise ValueError(f"option {key}={raw!r} must be an integer >= {minimum}")
    return value


def _bool(options: dict[str, str], key: str, default: bool) -> bool:
    raw = options.get(key.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {key}={raw!r} must be true or false")
    return value == "true"


def _duration_s(options: dict[str, str], key: str, default: str) -> float:
    """Spark's time strings: ``500ms``, ``30s``, ``15m``, ``1h``; a bare number is ms."""
    raw = options.get(key.lower(), default).strip().lower()
    match = re.fullmatch(r"(\d+)\s*(us|ms|s|m|min|h|d)?", raw)
    if match is None:
        raise ValueError(f"option {key}={raw!r} must be a duration such as 500ms, 30s, 15m, 1h")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"] / 1000


def _check_catchup_names(opts: dict[str, str]) -> None:
    """A misspelt catchup option would silently leave its default in force: refuse it."""
    for key in opts:
        if key.startswith("catchup.") and key not in _CATCHUP:
            close = difflib.get_close_matches(key, list(_CATCHUP), n=1)
            hint = f"; did you mean {_CATCHUP[close[0]]}?" if close else ""
            raise ValueError(
                f"unknown option {key}{hint} (the catch-up options are:"
                f" {', '.join(sorted(_CATCHUP.values()))})"
            )


def _warn_lookalikes(options: Mapping[str, str]) -> None:
    """Another unknown option is ignored, as Spark's Kafka source ignores what is not its own;
    one that looks like a known name is most likely a typo whose default now silently holds
    (``maxOffsetPerTrigger``: no rate limit), so it is named in a warning."""
    known = {name.lower(): name for name in OPTIONS}
    for key in map(str, options):
        lower = key.lower()  # as _lower: Spark hands the keys over lower-cased
        if lower in known or lower.startswith(("kafka.", "catchup.")):
            continue
        close = difflib.get_close_matches(lower, list(known), n=1, cutoff=0.85)
        if close:
            log.warning(
                "option %s is not one this source knows and is ignored; did you mean %s?",
                key,
                known[close[0]],
            )


def parse_options(options: Mapping[str, str], *, batch: bool = False) -> SourceOptions:
    """Validate the user's options; every error names the option and what it accepts.

    ``batch`` is a ``spark.read`` (endingOffsets allowed, startingOffsets=latest not). Other
    options Spark's Kafka source would ignore are ignored too, except a misspelt catch-up
    option, which is ours.
    """
    opts = _lower(options)
    _check_catchup_names(opts)
    _warn_lookalikes(options)
    if not batch:
        for key in _BATCH_ONLY:
            if key in opts:
                name = next(k for k in OPTIONS if k.lower() == key)
                raise ValueError(
                    f"option {name} is for batch reads (spark.read.format('fastrebalance'));"
                    " a stream has no end: use Trigger.AvailableNow to stop at the log end"
                )
    servers = opts.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise ValueError("option kafka.bootstrap.servers is required")
    subscription = parse_subscription(opts)
    kafka: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            name = key[len("kafka.") :]
            if name in _FORBIDDEN_KAFKA:
                raise ValueError(f"option {key} is not supported: {_FORBIDDEN_KAFKA[name]}")
            kafka[name] = value
    protocol = kafka.get("security.protocol")
    if protocol is not None and protocol.strip().upper() not in _SECURITY_PROTOCOLS:
        close = difflib.get_close_matches(protocol.strip().upper(), _SECURITY_PROTOCOLS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(
            f"option kafka.security.protocol={protocol!r} must be one of"
            f" {', '.join(_SECURITY_PROTOCOLS)}{hint}"
        )
    level = kafka.get("isolation.level")
    if level is not None:
        kafka["isolation.level"] = level = level.strip().lower()
        if level not in _ISOLATION_LEVELS:
            raise ValueError(
                f"option kafka.isolation.level={level!r} must be one of"
                f" {', '.join(_ISOLATION_LEVELS)}"
            )
    chunk_size = _int(opts, "catchup.chunkSize", DEFAULT_CHUNK_SIZE, 1)
    target_ms = _int(opts, "catchup.targetBatchDurationMs", DEFAULT_TARGET_BATCH_MS, 1)
    retries = _int(opts, "fetchOffset.numRetries", DEFAULT_FETCH_RETRIES, 1)
    retry_ms = _int(opts, "fetchOffset.retryIntervalMs", DEFAULT_FETCH_RETRY_INTERVAL_MS, 0)
    assert None not in (chunk_size, target_ms, retries, retry_ms)
    max_rows = _int(opts, "maxOffsetsPerTrigger", None, 1)
    min_rows = _int(opts, "minOffsetsPerTrigger", None, 1)
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise ValueError(
            f"option minOffsetsPerTrigger={min_rows} is above maxOffsetsPerTrigger={max_rows}"
        )
    prefix = opts.get("groupidprefix", DEFAULT_GROUP_ID_PREFIX).strip()
    return SourceOptions(
        subscription=subscription,
        kafka=kafka,
        starting=parse_starting(opts, subscription.covers_topic, batch=batch),
        ending=parse_ending(opts, subscription.covers_topic) if batch else None,
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_s=_duration_s(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
        min_partitions=_int(opts, "minPartitions", None, 1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", None, 1),
        include_headers=_bool(opts, "includeHeaders", False),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        poll_timeout_s=(_int(opts, "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, 1) or 1)
        / 1000,
        fetch_retries=retries or DEFAULT_FETCH_RETRIES,
        fetch_retry_interval_s=(retry_ms or 0) / 1000,
        group_id_prefix=prefix or DEFAULT_GROUP_ID_PREFIX,
        catchup_enabled=_bool(opts, "catchup.enabled", True),
        catchup_threshold=_int(opts, "catchup.threshold", DEFAULT_THRESHOLD, 0) or 0,
        split_backlog=_bool(opts, "catchup.splitBacklog", False),
        catchup_budget=_int(opts, "catchup.maxOffsetsPerTrigger", None, 1),
        target_batch_s=(target_ms or DEFAULT_TARGET_BATCH_MS) / 1000,
        chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
        first_batch_wait_s=(
            _int(opts, "catchup.firstBatchWaitMs", DEFAULT_FIRST_BATCH_WAIT_MS, 0) or 0
        )
        / 1000,
        watermark_cache_s=(
            _int(opts, "catchup.watermarkCacheMs", DEFAULT_WATERMARK_CACHE_MS, 0) or 0
        )
        / 1000,
    )
