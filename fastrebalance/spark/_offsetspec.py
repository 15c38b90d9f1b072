"""Where a query starts, and where a batch read ends, as the user wrote it (Spark's options).

Pure: resolving a timestamp to an offset needs Kafka, so the caller passes a lookup function;
everything else (the JSON forms, the -2/-1 conventions, which partitions must be named) is
checked here and unit tested.

* ``startingOffsets``: ``earliest``, ``latest``, or ``{"topic": {"0": 23, "1": -2}}`` with
  -2 for earliest and -1 for latest.
* ``startingOffsetsByTimestamp``: ``{"topic": {"0": 1700000000000}}`` (ms), and
  ``startingTimestamp``: one timestamp for every partition. Each partition starts at its
  first record at or after the timestamp; with none, the query fails, or starts at the log
  end with ``startingOffsetsByTimestampStrategy=latest``. They win over startingOffsets.
* ``endingOffsets`` / ``endingOffsetsByTimestamp`` / ``endingTimestamp``: the same for the
  exclusive end of a batch read (``spark.read``); by timestamp, a partition without a later
  record ends at its log end.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EndingOffsets", "StartingOffsets", "TimestampLookup", "parse_ending", "parse_starting"]

TopicPartitionKey = tuple[str, int]
#: ``{tp: timestamp ms}`` -> ``{tp: first offset at or after it, or -1 if there is none}``.
TimestampLookup = Callable[[Mapping[TopicPartitionKey, int]], Mapping[TopicPartitionKey, int]]

EARLIEST, LATEST = -2, -1


@dataclass(frozen=True)
class _Spec:
    """Offsets for every partition (``earliest``/``latest``), per partition, or by timestamp."""

    kind: str  # "earliest" | "latest" | "specific" | "timestamp" | "checkpoint"
    specific: Mapping[TopicPartitionKey, int] = field(default_factory=dict)
    # by timestamp: per partition, or one for all (``all_at``)
    timestamps: Mapping[TopicPartitionKey, int] = field(default_factory=dict)
    all_at: int | None = None
    option: str = "startingOffsets"

    def spec(self) -> Any:
        """A JSON form that depends on the options alone, in a fixed order (the initial offset)."""
        if self.kind in ("earliest", "latest"):
            return self.kind
        if self.kind == "timestamp" and self.all_at is not None:
            return {"timestamp": self.all_at}
        pairs = self.specific if self.kind == "specific" else self.timestamps
        out: dict[str, dict[str, int]] = {}
        for (topic, p), value in sorted(pairs.items()):
            out.setdefault(topic, {})[str(p)] = value
        return out if self.kind == "specific" else {"timestamp": out}

    def _named(self, partitions: list[TopicPartitionKey]) -> Mapping[TopicPartitionKey, int]:
        """Per-partition values must name exactly the partitions that exist (as in Spark):
        a partition left out would silently start somewhere, one that does not exist is a typo.
        """
        named = self.specific if self.kind == "specific" else self.timestamps
        missing = [f"{t}-{p}" for t, p in partitions if (t, p) not in named]
        unknown = [f"{t}-{p}" for t, p in sorted(set(named) - set(partitions))]
        if missing or unknown:
            raise ValueError(
                f"{self.option} must give an offset for exactly the partitions read (as"
                f" Spark's Kafka source requires); missing: {missing}, not in Kafka: {unknown}"
            )
        return named

    def _looked_up(
        self, parts: list[TopicPartitionKey], lookup: TimestampLookup | None
    ) -> tuple[Mapping[TopicPartitionKey, int], Mapping[TopicPartitionKey, int]]:
        """The timestamp of each partition, and the first offset at or after it (-1: none)."""
        stamps = (
            dict.fromkeys(parts, self.all_at) if self.all_at is not None else self._named(parts)
        )
        if not stamps:
            return {}, {}
        assert lookup is not None, "a timestamp needs a lookup"
        return stamps, lookup(stamps)


@dataclass(frozen=True)
class StartingOffsets(_Spec):
    latest_if_none: bool = False  # startingOffsetsByTimestampStrategy=latest
    #: startingOffsetsFromCheckpoint: read when a new query starts, never again (the old
    #: checkpoint may be gone by the time this query restarts from its own)
    checkpoint: str | None = None

    def _from_checkpoint(self) -> Mapping[TopicPartitionKey, int]:
        from ._checkpoint import read_checkpoint

        assert self.checkpoint is not None
        return read_checkpoint(self.checkpoint).offsets

    def spec(self) -> Any:
        if self.kind != "checkpoint":
            return super().spec()
        out: dict[str, dict[str, int]] = {}
        for (topic, p), value in sorted(self._from_checkpoint().items()):
            out.setdefault(topic, {})[str(p)] = value
        return out

    def per_partition(
        self, partitions: Iterable[TopicPartitionKey], lookup: TimestampLookup | None = None
    ) -> dict[TopicPartitionKey, int]:
        """The wanted offset of each partition: -2 earliest, -1 latest, or an offset."""
        parts = sorted(set(partitions))
        if self.kind == "checkpoint":
            # As Spark's Kafka source goes on: a partition its checkpoint does not name
            # appeared after its last batch, and is read from its first offset. Topics the
            # query no longer reads are left out; a partition named that Kafka does not have
            # is an error, as in startingOffsets.
            named = self._from_checkpoint()
            topics = {t for t, _ in parts}
            unknown = sorted(tp for tp in named if tp[0] in topics and tp not in set(parts))
            if unknown:
                raise ValueError(
                    f"{self.option}: the checkpoint names partitions Kafka does not have:"
                    f" {[f'{t}-{p}' for t, p in unknown]}"
                )
            return {tp: named.get(tp, EARLIEST) for tp in parts}
        if self.kind in ("earliest", "latest"):
            return dict.fromkeys(parts, EARLIEST if self.kind == "earliest" else LATEST)
        if self.kind == "specific":
            named = self._named(parts)
            return {tp: named[tp] for tp in parts}
        stamps, found = self._looked_up(parts, lookup)
        out: dict[TopicPartitionKey, int] = {}
        for tp in parts:
            offset = found.get(tp, -1)
            if offset < 0 and not self.latest_if_none:
                raise ValueError(
                    f"{self.option}: {tp[0]}-{tp[1]} has no record at or after timestamp"
                    f" {stamps[tp]} (set startingOffsetsByTimestampStrategy=latest to start"
                    " such partitions at their log end)"
                )
            out[tp] = LATEST if offset < 0 else offset
        return out


@dataclass(frozen=True)
class EndingOffsets(_Spec):
    def per_partition(
        self, partitions: Iterable[TopicPartitionKey], lookup: TimestampLookup | None = None
    ) -> dict[TopicPartitionKey, int]:
        """The exclusive end of each partition: -1 latest, or an offset."""
        parts = sorted(set(partitions))
        if self.kind == "latest":
            return dict.fromkeys(parts, LATEST)
        if self.kind == "specific":
            named = self._named(parts)
            return {tp: named[tp] for tp in parts}
        _, found = self._looked_up(parts, lookup)
        return {tp: found.get(tp, -1) if found.get(tp, -1) >= 0 else LATEST for tp in parts}


def _offsets_json(
    raw: str,
    option: str,
    covers: Callable[[str], bool],
    allowed: tuple[int, ...],
    words: tuple[str, ...] = (),
) -> dict[TopicPartitionKey, int]:
    """``words``: what the option takes besides JSON, so that a misspelt one ("earlist") is
    told what it resembles rather than only that it is not JSON."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        example = '{"topic": {"0": 5}}'
        close = difflib.get_close_matches(raw.lower(), words, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        takes = f"{', '.join(words)} or " if words else ""
        raise ValueError(
            f"option {option}={raw!r} must be {takes}a JSON object like {example}{hint}"
        )
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in parsed.items():
        if not covers(topic):
            raise ValueError(f"{option} names topic {topic!r}, which the query does not read")
        if not isinstance(parts, dict):
            raise ValueError(f"{option} for topic {topic!r} must be an object")
        for p, value in parts.items():
            ok = str(p).isdigit() and type(value) is int and (value >= 0 or value in allowed)
            if not ok:
                special = " or ".join(str(a) for a in allowed)
                raise ValueError(
                    f"{option} {topic}[{p!r}]={value!r}: partitions are ints, values are"
                    f" >= 0{' or ' + special if allowed else ''}"
                )
            out[(topic, int(p))] = value
    return out


def _timestamp(raw: str, option: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"option {option}={raw!r} must be a timestamp in ms since the epoch")
    return value


def parse_starting(
    options: Mapping[str, str], covers: Callable[[str], bool], *, batch: bool = False
) -> StartingOffsets:
    """From lower-cased options. ``batch``: a ``spark.read``, which cannot start at latest."""
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(
            f"option startingOffsetsByTimestampStrategy={strategy!r} must be error or latest"
        )
    latest_if_none = strategy == "latest"
    if "startingoffsetsfromcheckpoint" in options:
        given = [k for k in _STARTING if k in options]
        if given:
            raise ValueError(
                "option startingOffsetsFromCheckpoint says where a new query starts: leave"
                f" out {', '.join(_STARTING[k] for k in given)}"
            )
        if batch:
            raise ValueError("option startingOffsetsFromCheckpoint is for streams")
        path = options["startingoffsetsfromcheckpoint"].strip()
        if not path:
            raise ValueError("option startingOffsetsFromCheckpoint needs a checkpoint folder")
        return StartingOffsets(
            "checkpoint", option="startingOffsetsFromCheckpoint", checkpoint=path
        )
    if "startingtimestamp" in options:
        stamp = _timestamp(options["startingtimestamp"], "startingTimestamp")
        return StartingOffsets(
            "timestamp", all_at=stamp, option="startingTimestamp", latest_if_none=latest_if_none
        )
    if "startingoffsetsbytimestamp" in options:
        name = "startingOffsetsByTimestamp"
        stamps = _offsets_json(options["startingoffsetsbytimestamp"], name, covers, ())
        return StartingOffsets(
            "timestamp", timestamps=stamps, option=name, latest_if_none=latest_if_none
        )
    default = "earliest" if batch else "latest"
    raw = options.get("startingoffsets", default).strip()
    if raw.lower() in ("earliest", "latest"):
        if batch and raw.lower() == "latest":
            raise ValueError("option startingOffsets=latest is for streams; a batch read starts"
                             " at earliest or at given offsets")  # fmt: skip
        return StartingOffsets(raw.lower())
    allowed = (EARLIEST,) if batch else (EARLIEST, LATEST)
    words = ("earliest",) if batch else ("earliest", "latest")
    return StartingOffsets(
        "specific", _offsets_json(raw, "startingOffsets", covers, allowed, words)
    )


_STARTING = {
    "startingoffsets": "startingOffsets",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "startingtimestamp": "startingTimestamp",
}


def parse_ending(options: Mapping[str, str], covers: Callable[[str], bool]) -> EndingOffsets:
    """From lower-cased options, for a batch read (a stream refuses them, see _options)."""
    if "endingtimestamp" in options:
        stamp = _timestamp(options["endingtimestamp"], "endingTimestamp")
        return EndingOffsets("timestamp", all_at=stamp, option="endingTimestamp")
    if "endingoffsetsbytimestamp" in options:
        name = "endingOffsetsByTimestamp"
        stamps = _offsets_json(options["endingoffsetsbytimestamp"], name, covers, ())
        return EndingOffsets("timestamp", timestamps=stamps, option=name)
    raw = options.get("endingoffsets", "latest").strip()
    if raw.lower() == "latest":
        return EndingOffsets("latest", option="endingOffsets")
    if raw.lower() == "earliest":
        raise ValueError("option endingOffsets=earliest would read nothing: use latest or JSON")
    specific = _offsets_json(raw, "endingOffsets", covers, (LATEST,), ("latest",))
    return EndingOffsets("specific", specific, option="endingOffsets")
