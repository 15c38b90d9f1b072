"""The source's options, parsed and validated once, with Spark's Kafka source as the model.

Pure (no Spark, no Kafka) so that every rejection can be unit tested, and so that a typo fails
the query when it starts, on the driver, rather than in an executor task four retries later.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
#: measured yet at that point, so it is a guess: about the target's worth on a 2-core machine
#: with a light job. Much smaller wastes batches (each has a fixed cost of about a second:
#: with 100,000 the drain took twice as long as reading the backlog in order).
FIRST_CATCHUP_BUDGET = 500_000
#: What the adaptive backlog budget aims a batch at: long enough that a batch's fixed cost is
#: a small share of it, short enough that the live records sharing it stay reasonably fresh.
DEFAULT_TARGET_BATCH_MS = 10_000
#: How long cached watermarks are trusted: latestOffset() is called every ~10 ms while idle.
DEFAULT_WATERMARK_CACHE_MS = 100
#: How long the first batch after a restart may wait for a live record (see _source.py).
DEFAULT_FIRST_BATCH_WAIT_MS = 2000
#: Spark's own default for kafkaConsumer.pollTimeoutMs.
DEFAULT_POLL_TIMEOUT_MS = 120_000

# Option name (as documented) -> (default, meaning), for docs/spark.md and error messages.
OPTIONS: dict[str, tuple[str, str]] = {
    "kafka.bootstrap.servers": ("(required)", "Kafka brokers, host:port[,host:port]"),
    "subscribe": ("(required)", "comma-separated topic list"),
    "startingOffsets": (
        "latest",
        'earliest, latest, or JSON {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest);'
        " only for a new query (a checkpoint wins)",
    ),
    "maxOffsetsPerTrigger": ("(none)", "live records per micro-batch, over all partitions"),
    "failOnDataLoss": ("true", "fail when records were deleted before being read"),
    "kafkaConsumer.pollTimeoutMs": (
        str(DEFAULT_POLL_TIMEOUT_MS),
        "a task fails if Kafka returns nothing for this long",
    ),
    "catchup.enabled": ("true", "skip a restart backlog and read it in parallel"),
    "catchup.threshold": (
        str(DEFAULT_THRESHOLD),
        "a partition's lag at restart (records) above which its backlog is skipped",
    ),
    "catchup.maxOffsetsPerTrigger": (
        "(adaptive)",
        "backlog records per micro-batch, on top of maxOffsetsPerTrigger; unset, the first"
        f" backlog batch takes up to {FIRST_CATCHUP_BUDGET} and later ones are sized by"
        " catchup.targetBatchDurationMs",
    ),
    "catchup.targetBatchDurationMs": (
        str(DEFAULT_TARGET_BATCH_MS),
        "how long a backlog batch should take, when catchup.maxOffsetsPerTrigger is not set",
    ),
    "catchup.chunkSize": (
        str(DEFAULT_CHUNK_SIZE),
        "backlog records per input partition (Spark task)",
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
_UNSUPPORTED = {
    "assign": "list the topics with subscribe",
    "subscribepattern": "list the topics with subscribe",
    "endingoffsets": "endingOffsets is for batch queries; use Trigger.AvailableNow",
}


@dataclass(frozen=True)
class StartingOffsets:
    """``earliest``/``latest`` for every partition, or per-partition offsets (-2/-1 allowed)."""

    default: str = "latest"  # "earliest" | "latest" | "specific"
    specific: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def spec(self) -> Any:
        """A JSON form that depends on the options alone, in a fixed order (the initial offset)."""
        if self.default != "specific":
            return self.default
        out: dict[str, dict[str, int]] = {}
        for (topic, p), offset in sorted(self.specific.items()):
            out.setdefault(topic, {})[str(p)] = offset
        return out

    def per_partition(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The wanted offset of each partition: -2 earliest, -1 latest, or an offset.

        As in Spark's Kafka source, specific offsets must name exactly the partitions that
        exist: a partition left out would silently start somewhere, and one that does not
        exist is a typo.
        """
        parts = sorted(set(partitions))
        if self.default != "specific":
            wanted = -2 if self.default == "earliest" else -1
            return dict.fromkeys(parts, wanted)
        missing = [f"{t}-{p}" for t, p in parts if (t, p) not in self.specific]
        unknown = [f"{t}-{p}" for t, p in sorted(set(self.specific) - set(parts))]
        if missing or unknown:
            raise ValueError(
                "startingOffsets must give an offset for exactly the partitions of the"
                f" subscribed topics (as Spark's Kafka source requires); missing: {missing},"
                f" not in Kafka: {unknown}"
            )
        return {tp: self.specific[tp] for tp in parts}


@dataclass(frozen=True)
class SourceOptions:
    topics: tuple[str, ...]
    kafka: Mapping[str, str]
    starting: StartingOffsets = StartingOffsets()
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_s: float = DEFAULT_POLL_TIMEOUT_MS / 1000
    catchup_enabled: bool = True
    catchup_threshold: int = DEFAULT_THRESHOLD
    catchup_budget: int | None = None  # None: adaptive, see _plan.next_catchup_budget
    target_batch_s: float = DEFAULT_TARGET_BATCH_MS / 1000
    chunk_size: int = DEFAULT_CHUNK_SIZE
    first_batch_wait_s: float = DEFAULT_FIRST_BATCH_WAIT_MS / 1000
    watermark_cache_s: float = DEFAULT_WATERMARK_CACHE_MS / 1000

    def consumer_config(self, role: str) -> dict[str, Any]:
        """librdkafka config for an assign-only consumer that never commits.

        Each consumer gets its own group id unless the user chose one: it never subscribes
        or commits, so the id only has to be valid, and a unique one keeps ACLs and quotas
        keyed by group from lumping unrelated queries together.
        """
        conf: dict[str, Any] = {
            "group.id": f"spark-fastrebalance-{role}-{uuid.uuid4().hex[:12]}",
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


def _starting(raw: str | None, topics: tuple[str, ...]) -> StartingOffsets:
    if raw is None or raw.strip().lower() in ("latest", "earliest"):
        return StartingOffsets((raw or "latest").strip().lower())
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(
            f"option startingOffsets={raw!r} must be earliest, latest or a JSON object"
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(f"option startingOffsets={raw!r} must be a JSON object")
    specific: dict[tuple[str, int], int] = {}
    for topic, parts in parsed.items():
        if topic not in topics:
            raise ValueError(f"startingOffsets names topic {topic!r}, not in subscribe={topics}")
        if not isinstance(parts, dict):
            raise ValueError(f"startingOffsets for topic {topic!r} must be an object")
        for p, off in parts.items():
            if not (str(p).isdigit() and type(off) is int and off >= -2):
                raise ValueError(
                    f"startingOffsets {topic}[{p!r}]={off!r}: partitions are ints, offsets"
                    " are >= 0, or -2 (earliest) / -1 (latest)"
                )
            specific[(topic, int(p))] = off
    return StartingOffsets("specific", specific)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the user's options; every error names the option and what it accepts."""
    opts = _lower(options)
    for key, why in _UNSUPPORTED.items():
        if key in opts:
            raise ValueError(f"option {key} is not supported by the fastrebalance source: {why}")
    servers = opts.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise ValueError("option kafka.bootstrap.servers is required")
    topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
    if not topics:
        raise ValueError("option subscribe is required: a comma-separated list of topics")
    kafka: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            name = key[len("kafka.") :]
            if name in _FORBIDDEN_KAFKA:
                raise ValueError(f"option {key} is not supported: {_FORBIDDEN_KAFKA[name]}")
            kafka[name] = value
    chunk_size = _int(opts, "catchup.chunkSize", DEFAULT_CHUNK_SIZE, 1)
    target_ms = _int(opts, "catchup.targetBatchDurationMs", DEFAULT_TARGET_BATCH_MS, 1)
    assert chunk_size is not None and target_ms is not None
    return SourceOptions(
        topics=topics,
        kafka=kafka,
        starting=_starting(opts.get("startingoffsets"), topics),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        poll_timeout_s=(_int(opts, "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, 1) or 1)
        / 1000,
        catchup_enabled=_bool(opts, "catchup.enabled", True),
        catchup_threshold=_int(opts, "catchup.threshold", DEFAULT_THRESHOLD, 0) or 0,
        catchup_budget=_int(opts, "catchup.maxOffsetsPerTrigger", None, 1),
        target_batch_s=target_ms / 1000,
        chunk_size=chunk_size,
        first_batch_wait_s=(
            _int(opts, "catchup.firstBatchWaitMs", DEFAULT_FIRST_BATCH_WAIT_MS, 0) or 0
        )
        / 1000,
        watermark_cache_s=(
            _int(opts, "catchup.watermarkCacheMs", DEFAULT_WATERMARK_CACHE_MS, 0) or 0
        )
        / 1000,
    )
