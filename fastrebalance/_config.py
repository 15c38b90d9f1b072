"""Split the user's config into ours and librdkafka's, validate ours, derive the child's.

Our keys are popped from a *copy* before librdkafka sees the rest (librdkafka
rejects unknown properties). Every rejection names the key and the accepted values,
because a consumer that silently ignores ``enable.parallel.rebalance=ture`` would
leave its user without the latency they configured for.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ._token import DEFAULT_METADATA_MAX_BYTES

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_LAG_THRESHOLD",
    "ConfigError",
    "ParallelConfig",
    "child_config",
    "default_claims_topic",
    "split_config",
]

ENABLE_KEY = "enable.parallel.rebalance"
THRESHOLD_KEY = "parallel.rebalance.lag.threshold"
CATCHUP_GROUP_KEY = "parallel.rebalance.catchup.group.id"
METADATA_MAX_KEY = "parallel.rebalance.metadata.max.bytes"
TRANSACTIONAL_KEY = "parallel.rebalance.transactional"
GROUP_KEY = "parallel.rebalance.group.catchup"
CLAIM_TIMEOUT_KEY = "parallel.rebalance.group.claim.timeout.ms"
CHUNK_KEY = "parallel.rebalance.group.chunk.records"
CLAIMS_TOPIC_KEY = "parallel.rebalance.group.claims.topic"
REMOVE_DEAD_KEY = "parallel.rebalance.remove.dead.members"
STATE_DIR_KEY = "parallel.rebalance.state.dir"
UNCOMMITTED_KEY = "parallel.rebalance.catchup.uncommitted"
_PREFIX = "parallel.rebalance."

log = logging.getLogger("fastrebalance.consumer")

#: A member's chunks are free again this long (log time) after its last record in the
#: claims log: a dead member's backlog is read again after at most about this long.
DEFAULT_CLAIM_TIMEOUT_MS = 10_000
#: Records per chunk: about 0.5 s of reading at 50 us of work per record; small enough
#: that three members share a 300k backlog evenly, large enough that the claims log sees
#: a few records per second.
DEFAULT_CHUNK_RECORDS = 10_000
CLAIMS_TOPIC_SUFFIX = ".catchup.claims"
#: What Kafka accepts as a topic name (its own rule, with the length checked apart).
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_MAX = 249
#: Group id characters that stand for themselves in the default claims topic's name.
_PLAIN = re.compile(r"[a-zA-Z0-9]")


def default_claims_topic(group_id: str) -> str:
    """``<group.id>.catchup.claims``, with the group id written so that no two group ids
    give names Kafka takes for one another.

    Kafka refuses a topic whose name differs from an existing one's only by ``.`` and
    ``_`` ("collides with existing topics"): with the group id as it is, the groups
    ``app_1`` and ``app.1`` had one of them refused its claims topic, and that group's
    backlog was never read (issue 48). Here ``.`` is written ``-d``, ``_`` ``-u``, ``-``
    ``--`` and any other character ``-x<hex>-``: the written id holds neither ``.`` nor
    ``_``, and it is the id's own (no two ids are written alike). A name past Kafka's 249
    characters keeps the start of the written id and a hash of the whole id.
    """
    written = "".join(
        c if _PLAIN.fullmatch(c)
        else "-d" if c == "."
        else "-u" if c == "_"
        else "--" if c == "-"
        else f"-x{ord(c):x}-"
        for c in group_id
    )  # fmt: skip
    name = written + CLAIMS_TOPIC_SUFFIX
    if len(name) <= _TOPIC_MAX:
        return name
    digest = hashlib.sha256(group_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    keep = _TOPIC_MAX - len(CLAIMS_TOPIC_SUFFIX) - len(digest) - 2
    return f"{written[:keep]}-h{digest}{CLAIMS_TOPIC_SUFFIX}"


#: Catch-up starts when log end - committed exceeds this many records. Below ~1000
#: records replaying costs milliseconds at Kafka speeds, while a catch-up costs a
#: second commit per commit() and out-of-order delivery; above it the plain
#: replay visibly delays fresh records.
DEFAULT_LAG_THRESHOLD = 1000
CATCHUP_GROUP_SUFFIX = ".catchup"

#: Key -> (default, accepted values) for the docs table and for error messages.
CONFIG_KEYS: dict[str, tuple[str, str]] = {
    ENABLE_KEY: ("false", "true or false (bool or string)"),
    THRESHOLD_KEY: (str(DEFAULT_LAG_THRESHOLD), "an integer >= 0 (records)"),
    UNCOMMITTED_KEY: (
        "true",
        "true or false: a partition the group never committed, with "
        "auto.offset.reset=earliest, catches up on [log start, log end) like any backlog",
    ),
    CATCHUP_GROUP_KEY: (
        f"<group.id>{CATCHUP_GROUP_SUFFIX}",
        "a non-empty group id different from group.id, used by no subscriber",
    ),
    METADATA_MAX_KEY: (
        str(DEFAULT_METADATA_MAX_BYTES),
        "an integer from 256 to 1048576, at most the broker's offset.metadata.max.bytes",
    ),
    TRANSACTIONAL_KEY: (
        "false",
        "true or false: offsets travel only in the producer's transactions "
        "(send_offsets_to_transaction); requires enable.auto.commit=false",
    ),
    GROUP_KEY: (
        "false",
        "true or false: every member's child helps read any partition's backlog, in "
        "chunks claimed through the claims topic; requires enable.parallel.rebalance=true, "
        "refused with parallel.rebalance.transactional=true",
    ),
    CLAIM_TIMEOUT_KEY: (
        str(DEFAULT_CLAIM_TIMEOUT_MS),
        "an integer from 1000 to 600000 (ms of the claims log's own time)",
    ),
    CHUNK_KEY: (str(DEFAULT_CHUNK_RECORDS), "an integer from 100 to 100000000 (offsets)"),
    CLAIMS_TOPIC_KEY: (
        f"<group.id>{CLAIMS_TOPIC_SUFFIX}",
        "a topic name (ASCII letters, digits, '.', '_', '-'; at most 249), the same for every "
        "member of the group; it may be shared with other groups",
    ),
    REMOVE_DEAD_KEY: (
        "true",
        "true or false: at subscribe(), members of this group whose process died on this "
        "host (their state-file lock is free) are removed from the group, so that their "
        "partitions move at once instead of after the session timeout",
    ),
    STATE_DIR_KEY: (
        "~/.local/state/fastrebalance",
        "a directory this process can create files in and lock (a local file system; "
        "shared by the processes that replace one another, e.g. a pod's volume)",
    ),
}


class ConfigError(KafkaException, ValueError):
    """A configuration fastrebalance refuses (one of our keys, or a combination the mode
    cannot honour), raised by ``Consumer()`` before any handle exists.

    A ``KafkaException`` whose ``KafkaError`` has code ``_INVALID_ARG``, as librdkafka
    reports a misspelt or invalid property, so that one ``except KafkaException`` catches a
    config mistake whichever key it is in; and a ``ValueError``, as these errors were
    before (and as confluent-kafka raises for a consumer it cannot create, e.g. without
    ``group.id``), so that existing handlers keep working.
    """


def _refused(message: str) -> ConfigError:
    return ConfigError(KafkaError(KafkaError._INVALID_ARG, message))


# Keys that make a consumer a *member* of a group. The child must never join (and
# so never disturb) the user's group: it reads by assign() and commits into its own
# group id, which nobody subscribes with.
_MEMBERSHIP_KEYS = (
    "group.instance.id",
    "partition.assignment.strategy",
    "group.protocol",
    "group.protocol.type",
    "group.remote.assignor",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "auto.commit.interval.ms",
    "on_assign",
    "on_revoke",
    "on_lost",
)


@dataclass(frozen=True)
class ParallelConfig:
    """Our settings, validated. ``enabled=False`` means: behave as confluent_kafka.Consumer."""

    enabled: bool = False
    lag_threshold: int = DEFAULT_LAG_THRESHOLD
    catchup_group_id: str = ""
    metadata_max_bytes: int = DEFAULT_METADATA_MAX_BYTES
    # The user's commit behaviour, which we emulate when enabled (librdkafka's own
    # auto-commit would store the primary's position and skip the backlog).
    auto_commit: bool = True
    auto_commit_interval_s: float = 5.0
    auto_offset_store: bool = True
    incremental: bool = False
    #: group.protocol=consumer (KIP-848): the member id outlives leaving the group
    consumer_protocol: bool = False
    #: exactly-once: nothing is written to either log outside a producer transaction
    transactional: bool = False
    #: where auto.offset.reset puts a partition with no committed offset, as a logical
    #: offset to seek to (OFFSET_BEGINNING -2 or OFFSET_END -1)
    reset_offset: int = -1
    #: group-wide catch-up: the backlog is read in chunks by every member (``_groupcatchup``)
    group_catchup: bool = False
    claim_timeout_ms: int = DEFAULT_CLAIM_TIMEOUT_MS
    chunk_records: int = DEFAULT_CHUNK_RECORDS
    claims_topic: str = ""
    #: the membership state directory; None: dead members are not removed at subscribe()
    state_dir: Path | None = None
    #: a partition with no committed offset and auto.offset.reset=earliest catches up on
    #: [log start, log end) (``_planning.plan_assignment``)
    catch_up_uncommitted: bool = True


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _refused(
        f"{key}={value!r} is invalid: expected {CONFIG_KEYS.get(key, ('', 'true or false'))[1]}"
    )


def _int(key: str, value: Any, lo: int, hi: int | None = None) -> int:
    parsed: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        parsed = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        parsed = int(value.strip())
    if parsed is None or parsed < lo or (hi is not None and parsed > hi):
        raise _refused(f"{key}={value!r} is invalid: expected {CONFIG_KEYS[key][1]}")
    return parsed


#: librdkafka's spellings of a boolean (compared case-insensitively, no spaces).
_TRUE = ("true", "t", "1")
_FALSE = ("false", "f", "0")


def _librdkafka_bool(conf: Mapping[str, Any], key: str, default: bool) -> bool:
    """A librdkafka boolean we must read before librdkafka does (we replace it), read as
    confluent-kafka and librdkafka read it: a bool, an int (confluent-kafka writes it as
    text) or text, and anything else refused with librdkafka's own error.

    Raises:
        KafkaException: ``_INVALID_ARG``, as confluent_kafka.Consumer raises it.
    """
    value = conf.get(key, default)
    if isinstance(value, bool):
        return value
    text = None if value is None else str(value)
    if text is not None and text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise KafkaException(
        KafkaError(KafkaError._INVALID_ARG, f'Expected bool value for "{key}": true or false')
    )


#: librdkafka's text properties this module (or the consumer) reads itself. confluent-kafka
#: hands librdkafka ``str(value)`` of a value of any other type (a ``uuid.UUID`` group id, a
#: number): read as anything else, such a group id was refused as missing. (Our own keys
#: keep their stricter checks: they never were confluent-kafka's.)
_TEXT_KEYS = (
    "group.id", "client.id", "group.protocol", "partition.assignment.strategy",
    "auto.offset.reset", "isolation.level",
)  # fmt: skip


def _as_text(conf: dict[str, Any]) -> None:
    for key in _TEXT_KEYS:
        value = conf.get(key)
        if value is not None and not isinstance(value, str):
            conf[key] = str(value)


def split_config(conf: Mapping[str, Any]) -> tuple[ParallelConfig, dict[str, Any]]:
    """Return (our validated settings, the config for the primary librdkafka handle).

    Raises:
        ConfigError: naming the offending key, the value given and what it accepts (a
            ``KafkaException`` with ``_INVALID_ARG``, and a ``ValueError``).
        TypeError: the config is not a mapping.
    """
    if not isinstance(conf, Mapping):
        raise TypeError(f"config must be a dict, not {type(conf).__name__}")
    rest = dict(conf)
    _as_text(rest)
    unknown = sorted(
        k for k in rest if isinstance(k, str) and k.startswith(_PREFIX) and k not in CONFIG_KEYS
    )
    if unknown:
        raise _refused(
            f"unknown configuration key {unknown[0]!r}: the parallel.rebalance.* keys are "
            + ", ".join(k for k in CONFIG_KEYS if k.startswith(_PREFIX))
        )
    enabled = _bool(ENABLE_KEY, rest.pop(ENABLE_KEY, False))
    threshold = _int(THRESHOLD_KEY, rest.pop(THRESHOLD_KEY, DEFAULT_LAG_THRESHOLD), 0)
    max_bytes = _int(
        METADATA_MAX_KEY, rest.pop(METADATA_MAX_KEY, DEFAULT_METADATA_MAX_BYTES), 256, 1 << 20
    )
    catchup_group = rest.pop(CATCHUP_GROUP_KEY, None)
    transactional = _bool(TRANSACTIONAL_KEY, rest.pop(TRANSACTIONAL_KEY, False))
    group_catchup = _bool(GROUP_KEY, rest.pop(GROUP_KEY, False))
    claim_timeout = _int(
        CLAIM_TIMEOUT_KEY, rest.pop(CLAIM_TIMEOUT_KEY, DEFAULT_CLAIM_TIMEOUT_MS), 1000, 600_000
    )
    chunk = _int(CHUNK_KEY, rest.pop(CHUNK_KEY, DEFAULT_CHUNK_RECORDS), 100, 100_000_000)
    claims_topic = rest.pop(CLAIMS_TOPIC_KEY, None)
    remove_dead = _bool(REMOVE_DEAD_KEY, rest.pop(REMOVE_DEAD_KEY, True))
    state_dir_value = rest.pop(STATE_DIR_KEY, None)
    uncommitted = _bool(UNCOMMITTED_KEY, rest.pop(UNCOMMITTED_KEY, True))
    group_id = rest.get("group.id")
    if group_catchup and not enabled:
        raise _refused(
            f"{GROUP_KEY}=true requires {ENABLE_KEY}=true: the chunks are pieces of the "
            "backlog that KIP-333's catch-up skips"
        )
    if not enabled:
        return ParallelConfig(enabled=False), rest
    if group_catchup and transactional:
        raise _refused(
            f"{GROUP_KEY}=true cannot be combined with {TRANSACTIONAL_KEY}=true: a chunk "
            "processed by another member is committed in that member's own commit path, "
            "outside this member's transactions (exactly-once would write its output twice "
            "after a crash); use one or the other"
        )
    if claims_topic is None and isinstance(group_id, str) and group_id:
        claims_topic = default_claims_topic(group_id)
    if group_catchup and (not isinstance(claims_topic, str) or not claims_topic.strip()):
        raise _refused(
            f"{CLAIMS_TOPIC_KEY}={claims_topic!r} is invalid: expected "
            f"{CONFIG_KEYS[CLAIMS_TOPIC_KEY][1]}"
        )
    if group_catchup and isinstance(claims_topic, str):
        # Kafka refuses such a name at every start of the claims log: no backlog would
        # ever be read (adversary of issue 22: 0 of 5000 records in 20 s, a WARNING every
        # 2 s). The default comes from group.id, which may hold any character.
        bad = (
            "is longer than 249 characters" if len(claims_topic) > 249
            else "is '.' or '..'" if claims_topic in (".", "..")
            else "has characters other than ASCII letters, digits, '.', '_' and '-'"
            if not _TOPIC_NAME.fullmatch(claims_topic)
            else None
        )  # fmt: skip
        if bad is not None:
            raise _refused(
                f"{CLAIMS_TOPIC_KEY}={claims_topic!r} {bad}: Kafka refuses it as a topic name"
            )

    if not isinstance(group_id, str) or not group_id:
        raise _refused(
            f"{ENABLE_KEY}=true requires group.id: the catch-up state is kept in the "
            "group's committed offsets"
        )
    if catchup_group is None:
        catchup_group = group_id + CATCHUP_GROUP_SUFFIX
    if not isinstance(catchup_group, str) or not catchup_group or catchup_group == group_id:
        raise _refused(
            f"{CATCHUP_GROUP_KEY}={catchup_group!r} is invalid: expected "
            f"{CONFIG_KEYS[CATCHUP_GROUP_KEY][1]}"
        )
    auto_commit = _librdkafka_bool(rest, "enable.auto.commit", True)
    if transactional and auto_commit:
        raise _refused(
            f"{TRANSACTIONAL_KEY}=true requires enable.auto.commit=false: in exactly-once "
            "mode offsets are written only inside the producer's transactions"
        )
    interval_ms = _int_passthrough(rest, "auto.commit.interval.ms", 5000)
    strategy = str(rest.get("partition.assignment.strategy", ""))
    protocol = str(rest.get("group.protocol", "classic")).lower()
    settings = ParallelConfig(
        enabled=True,
        lag_threshold=threshold,
        catchup_group_id=catchup_group,
        metadata_max_bytes=max_bytes,
        auto_commit=auto_commit,
        auto_commit_interval_s=interval_ms / 1000.0,
        auto_offset_store=_librdkafka_bool(rest, "enable.auto.offset.store", True),
        incremental=protocol == "consumer" or "cooperative" in strategy,
        consumer_protocol=protocol == "consumer",
        transactional=transactional,
        reset_offset=_reset_offset(rest.get("auto.offset.reset", "latest")),
        group_catchup=group_catchup,
        claim_timeout_ms=claim_timeout,
        chunk_records=chunk,
        claims_topic=str(claims_topic) if group_catchup else "",
        state_dir=_state_dir(state_dir_value) if remove_dead else None,
        catch_up_uncommitted=uncommitted,
    )
    # librdkafka's auto-commit would store the primary's position, past the backlog:
    # we commit ourselves, on the same schedule, with the safe offset and a token.
    rest["enable.auto.commit"] = False
    return settings, rest


def _state_dir(value: Any) -> Path | None:
    """The state directory, created and proven writable. One the user named is refused
    when it is not; the default one only turns the removal off, with a warning: the
    feature is on by default, and a read-only home (a locked-down container) must not make
    a consumer that worked before refuse to start."""
    if value is not None and (not isinstance(value, str | Path) or not str(value).strip()):
        raise _refused(
            f"{STATE_DIR_KEY}={value!r} is invalid: expected {CONFIG_KEYS[STATE_DIR_KEY][1]}"
        )
    from ._membership import default_state_dir, prepare_dir  # the mode's own, not plain's

    path = Path(value).expanduser() if value is not None else default_state_dir()
    try:
        prepare_dir(path)
    except OSError as exc:
        if value is not None:
            raise _refused(
                f"{STATE_DIR_KEY}={str(value)!r} cannot be used: {exc.strerror or exc} "
                f"({type(exc).__name__}). Give a directory this process can write and lock, "
                f"or set {REMOVE_DEAD_KEY}=false"
            ) from None
        log.warning(
            "the membership state directory %s cannot be used (%s): dead members will not be "
            "removed at start (set %s to a writable directory)",
            path, exc, STATE_DIR_KEY,
        )  # fmt: skip
        return None
    return path


def _reset_offset(policy: Any) -> int:
    """auto.offset.reset as a logical offset (librdkafka validates the value itself;
    ``error`` has no offset to seek to: the log end, where a plain consumer would wait)."""
    early = ("smallest", "earliest", "beginning")
    return -2 if str(policy).strip().lower() in early else -1


def _int_passthrough(conf: Mapping[str, Any], key: str, default: int) -> int:
    try:
        return int(conf.get(key, default))
    except (TypeError, ValueError):
        raise _refused(f"{key}={conf.get(key)!r} is invalid: expected an integer") from None


def child_config(primary_conf: Mapping[str, Any], settings: ParallelConfig) -> dict[str, Any]:
    """The child's config: the user's whole config (security, SASL, SSL, callbacks)
    minus group membership, with its own group id, commits and offset-reset policy.

    ``auto.offset.reset=error`` makes a range start deleted by retention surface as
    an ``_AUTO_OFFSET_RESET`` event we can report, instead of a silent jump.
    ``enable.partition.eof=true`` tells the child where the log ends: a range whose last
    offsets hold no record (transaction markers, aborted records) ends there.
    """
    conf = {k: v for k, v in primary_conf.items() if k not in _MEMBERSHIP_KEYS}
    conf["group.id"] = settings.catchup_group_id
    client_id = conf.get("client.id") or "rdkafka"
    conf["client.id"] = f"{client_id}-catchup"
    conf["enable.auto.commit"] = False
    conf["enable.auto.offset.store"] = False
    conf["auto.offset.reset"] = "error"
    conf["enable.partition.eof"] = True
    # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) whenever its queue
    # is full; a backlog reader fills it constantly, so the child waits far less
    # (measured: 1M-record drain 1.9 s instead of 7.9 s). The user's value wins.
    conf.setdefault("fetch.queue.backoff.ms", 10)
    if settings.group_catchup:
        # The child reads chunk after chunk of a backlog, each a seek: a fetch already in
        # flight past the previous chunk's end, on a partition with nothing new, holds the
        # next one back for fetch.wait.max.ms (500 ms). One member on a quiet partition
        # drained 50,000 records in chunks of 1,000 in 25.1 s against 3.8 s with the key
        # off. A backlog never needs a long poll. Not even the user's value wins: it is
        # for the primary's long poll at the log end, and set to librdkafka's own 500 it
        # cost each 5,000-record chunk 200 ms (100,000 records: 6.5 s against 2.5 s).
        conf["fetch.wait.max.ms"] = min(int(conf.get("fetch.wait.max.ms", 10)), 10)
    conf.pop("on_commit", None)
    return conf
