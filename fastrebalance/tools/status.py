"""``fastrebalance status``: what a group's two commit logs say, read from outside the group.

Only committed offsets (the user's group ``G`` and the child's ``G.catchup``) and the
log watermarks are read: no group membership and no DescribeGroups (which the mock
cluster does not serve, and which says nothing about catch-up anyway). So a group with
no live member can be inspected, e.g. before a restart or a rollback to plain
confluent-kafka, and inspecting never disturbs a running group.

The two logs are merged by ``_planning.restore()``, the very function a restarting
consumer uses: what status shows as pending is what a restart would read again.

Kafka keeps only the latest commit of each log, so the original extent of a backlog
range is forgotten as the child commits (the group token then holds what is left).
One snapshot knows a range from its last checkpoint on; ``ProgressTracker`` remembers
each range across ``--watch`` refreshes, which turns the bars into real progress with
a drain rate and an ETA.

Thread ownership: a ``StatusReader`` owns one AdminClient, used only by the thread that
calls ``read()``; everything else here is pure.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    OffsetSpec,
)

from .._config import CATCHUP_GROUP_SUFFIX
from .._planning import restore
from .._token import ChildCheckpoint, TokenError, decode_child_checkpoint, decode_group_token
from . import _args as a

__all__ = [
    "JSON_SCHEMA_VERSION",
    "ClusterUnreachableError",
    "GroupNotFoundError",
    "GroupStatus",
    "PartitionStatus",
    "ProgressTracker",
    "RangeStatus",
    "StatusError",
    "StatusReader",
    "TopicNotFoundError",
    "add_command",
    "format_status",
    "partition_status",
    "read_status",
]

#: Bumped when a field of ``GroupStatus.to_dict()`` changes meaning or disappears
#: (new fields do not bump it): scripts parsing ``--json`` can pin it.
JSON_SCHEMA_VERSION = 1

#: librdkafka's own log lines (connection refused, every 50 ms) would bury the one-line
#: answer. Given a logger, librdkafka queues them for ``poll()``, which status never
#: calls: they are dropped, and the errors raised here carry librdkafka's reason instead.
_rdlog = logging.getLogger("fastrebalance.status.librdkafka")
log = logging.getLogger("fastrebalance.status")

MetadataKind = Literal["none", "plain", "token", "foreign", "unreadable"]

_KIND_TEXT: dict[str, str] = {
    "none": "no committed offset",
    "plain": "plain offset",
    "token": "catching up",
    "foreign": "metadata not written by fastrebalance",
    "unreadable": "fastrebalance metadata that cannot be trusted",
}


class StatusError(Exception):
    """The status could not be read; the message is meant for the operator."""


class ClusterUnreachableError(StatusError):
    """No broker answered at the bootstrap servers within the timeout."""


class GroupNotFoundError(StatusError):
    """The group has no committed offset (on the topics asked about)."""


class TopicNotFoundError(StatusError):
    """A topic named with ``--topic`` does not exist."""


@dataclass(frozen=True)
class RangeStatus:
    """One pending backlog range ``[start, end)`` of a partition.

    Attributes:
        start: first offset still pending: the child's progress is already applied.
        end: exclusive; the log end when the crash or rebalance started the catch-up.
        since: the earliest start known for this range, the progress bar's origin.
            Kafka keeps only the latest commits, so one snapshot knows the range from
            the child's previous checkpoint at best; a watch widens it to the start it
            first saw.
        child_committed: the child's checkpoint inside this range (its commit log,
            ``G.catchup``); None when it has not committed in this range.
        deleted: records of the range below the log start: retention deleted them
            before the child read them; a restart skips them and reports it.
        rate: records per second the range drained over a watch; None in a snapshot.
    """

    start: int
    end: int
    since: int
    child_committed: int | None = None
    deleted: int = 0
    rate: float | None = None

    @property
    def remaining(self) -> int:
        return self.end - self.start

    @property
    def total(self) -> int:
        return self.end - self.since

    @property
    def done(self) -> int:
        return self.start - self.since

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds until the child reaches ``end`` at the watched rate."""
        if not self.rate or self.rate <= 0:
            return None
        return self.remaining / self.rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "remaining": self.remaining,
            "since": self.since,
            "done": self.done,
            "fraction": round(self.fraction, 4),
            "child_committed": self.child_committed,
            "deleted": self.deleted,
            "rate": None if self.rate is None else round(self.rate, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
        }


@dataclass(frozen=True)
class PartitionStatus:
    """One partition, as a restart of the group would see it.

    Attributes:
        committed: the offset Kafka stores for the group: the *safe* offset, where
            plain tools (kafka-consumer-groups, lag monitors, a rollback to plain
            confluent-kafka) resume. None: the group never committed this partition.
        position: where the primary consumer resumes: the token's position, or the
            committed offset when there is no token.
        ranges: backlog below ``position`` not yet processed, which the child reads.
        log_start, log_end: the partition's watermarks; None when they could not be read.
        metadata: what the group's commit metadata is: ``none`` (no commit), ``plain``
            (no metadata: caught up, or a plain consumer), ``token`` (ours, a catch-up
            is pending), ``foreign`` (someone's metadata: the application's own after
            a catch-up, or another tool's), ``unreadable`` (ours but corrupt, from
            another version, or moved by a tool: a restart ignores it).
        user_metadata: the application's own commit metadata (inside the token or bare).
        checkpoint: the child's latest checkpoint for this partition, whether it
            still applies to a pending range or not.
        problem: why some metadata is ignored, as a restart would log it.
    """

    topic: str
    partition: int
    committed: int | None
    position: int | None
    ranges: tuple[RangeStatus, ...] = ()
    log_start: int | None = None
    log_end: int | None = None
    metadata: MetadataKind = "none"
    user_metadata: str = ""
    checkpoint: ChildCheckpoint | None = None
    problem: str | None = None
    #: size of the range token in the group's commit metadata (0: no token)
    token_bytes: int = 0

    @property
    def pending(self) -> int:
        """Backlog records not yet processed."""
        return sum(r.remaining for r in self.ranges)

    @property
    def primary_lag(self) -> int | None:
        if self.position is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.position)

    @property
    def lag(self) -> int | None:
        """Records not yet processed: the primary's lag plus the pending backlog.

        Plain tools report ``log_end - committed`` instead, which also counts the
        records between the backlog and the primary that are already processed."""
        primary = self.primary_lag
        return None if primary is None else primary + self.pending

    @property
    def tool_lag(self) -> int | None:
        """What kafka-consumer-groups and lag monitors report: log end - safe offset."""
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)

    def to_dict(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "position": self.position,
            "log_start": self.log_start,
            "log_end": self.log_end,
            "lag": self.lag,
            "primary_lag": self.primary_lag,
            "tool_lag": self.tool_lag,
            "pending": self.pending,
            "metadata": self.metadata,
            "user_metadata": self.user_metadata,
            "problem": self.problem,
            "child_checkpoint": (
                None if cp is None else {"start": cp.start, "end": cp.end, "offset": cp.offset}
            ),
            "ranges": [r.to_dict() for r in self.ranges],
        }


@dataclass(frozen=True)
class GroupStatus:
    """A snapshot of one group: every partition of the topics it committed (or asked for).

    Attributes:
        taken_at: wall-clock time of the snapshot, seconds since the epoch.
    """

    group: str
    catchup_group: str
    bootstrap_servers: str
    partitions: tuple[PartitionStatus, ...]
    taken_at: float = field(default_factory=time.time)
    #: group-wide catch-up's open chunks and their holders (None: no claims topic)
    chunks: list[dict[str, Any]] | None = None

    @property
    def catching_up(self) -> tuple[PartitionStatus, ...]:
        return tuple(p for p in self.partitions if p.ranges)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(
            f"{p.topic} [{p.partition}]: {p.problem}" for p in self.partitions if p.problem
        )

    @property
    def pending(self) -> int:
        return sum(p.pending for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": JSON_SCHEMA_VERSION,
            "group": self.group,
            "catchup_group": self.catchup_group,
            "bootstrap_servers": self.bootstrap_servers,
            "time": _iso(self.taken_at),
            "catching_up": bool(self.catching_up),
            "pending": self.pending,
            "lag": self.lag,
            "problems": list(self.problems),
            "partitions": [p.to_dict() for p in self.partitions],
            **({"chunks": self.chunks} if self.chunks is not None else {}),
        }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------- pure merge
def _classify(
    offset: int, metadata: str | None
) -> tuple[MetadataKind, tuple[tuple[int, int], ...]]:
    """The kind of the group commit, and the ranges its token names (if any)."""
    if offset < 0:
        return "none", ()
    if not metadata:
        return "plain", ()
    try:
        token = decode_group_token(metadata)
    except TokenError:
        return "unreadable", ()
    if token is None:
        return "foreign", ()
    if token.safe_offset != offset:
        return "unreadable", ()
    return "token", token.ranges


def partition_status(
    topic: str,
    partition: int,
    group_offset: int,
    group_metadata: str | None,
    child_offset: int = -1,
    child_metadata: str | None = None,
    log_start: int | None = None,
    log_end: int | None = None,
) -> PartitionStatus:
    """Merge one partition's two commits and watermarks, exactly as a restart would.

    Args:
        group_offset, group_metadata: the commit of the user's group (offset < 0: none).
        child_offset, child_metadata: the commit of the catch-up group (offset < 0: none).
        log_start, log_end: the watermarks; None when unknown.
    """
    kind, token_ranges = _classify(group_offset, group_metadata)
    restored = restore(group_offset, group_metadata, child_offset, child_metadata)
    checkpoint = None
    if child_offset >= 0:
        try:
            checkpoint = decode_child_checkpoint(child_metadata, child_offset)
        except TokenError:
            checkpoint = None  # restore() has already said why in ``problem``
    ranges = []
    for start, end in restored.ranges:
        since = min([start] + [s for s, e in token_ranges if e == end])
        committed_in = None
        if checkpoint is not None and checkpoint.end == end and kind == "token":
            since = min(since, checkpoint.start)
            committed_in = checkpoint.offset
        deleted = 0
        if log_start is not None and log_start > start:
            deleted = min(end, log_start) - start
        ranges.append(RangeStatus(start, end, since, committed_in, deleted))
    return PartitionStatus(
        topic=topic,
        partition=partition,
        committed=group_offset if group_offset >= 0 else None,
        position=restored.position,
        ranges=tuple(ranges),
        log_start=log_start,
        log_end=log_end,
        metadata=kind,
        user_metadata=restored.user_metadata,
        checkpoint=checkpoint,
        problem=restored.problem,
        token_bytes=len((group_metadata or "").encode("utf-8")) if kind == "token" else 0,
    )


class ProgressTracker:
    """Remembers each pending range across refreshes, for ``--watch``.

    A range is known by its end (range ends are log ends at crash time, so they
    identify a range for its whole life while its start moves up). The tracker keeps
    the lowest start seen, which makes the bar's origin stable, and the first
    observation, from which the drain rate is measured.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, int], tuple[int, float, int]] = {}

    def update(self, status: GroupStatus) -> GroupStatus:
        """The same snapshot with ``since`` widened and ``rate`` filled in."""
        now = status.taken_at
        alive = set()
        parts = []
        for p in status.partitions:
            ranges = []
            for r in p.ranges:
                key = (p.topic, p.partition, r.end)
                alive.add(key)
                since, first_t, first_start = self._seen.setdefault(key, (r.since, now, r.start))
                since = min(since, r.since)
                self._seen[key] = (since, first_t, first_start)
                rate = (r.start - first_start) / (now - first_t) if now > first_t else None
                ranges.append(replace(r, since=since, rate=rate))
            parts.append(replace(p, ranges=tuple(ranges)))
        for key in set(self._seen) - alive:  # finished: forget, or it would never shrink
            del self._seen[key]
        return replace(status, partitions=tuple(parts))


# ------------------------------------------------------------------ reading
def read_status(
    bootstrap_servers: str,
    group: str,
    *,
    topics: Sequence[str] | None = None,
    catchup_group: str | None = None,
    timeout: float = 10.0,
    config: Mapping[str, Any] | None = None,
) -> GroupStatus:
    """Read both commit logs and the watermarks of ``group`` once.

    Args and Raises: as ``StatusReader`` and ``StatusReader.read()``. The keywords are
    spelled out (not ``**options``) so that a type checker sees a misspelt one.
    """
    return StatusReader(
        bootstrap_servers, group, topics=topics, catchup_group=catchup_group,
        timeout=timeout, config=config,
    ).read()  # fmt: skip


class StatusReader:
    """Reads snapshots of one group; ``--watch`` keeps one, so that each refresh reuses
    the admin client's connections instead of reconnecting every few seconds.

    Args:
        bootstrap_servers: the cluster.
        group: the application's ``group.id``.
        topics: restrict to these topics (every partition of each is shown); None:
            every topic the group has committed offsets for.
        catchup_group: the child's group id (``parallel.rebalance.catchup.group.id``);
            None: ``<group>.catchup``, the default.
        timeout: seconds allowed for each request.
        config: extra librdkafka properties for the admin client (security, SASL).

    Thread ownership: the admin client belongs to the thread that calls ``read()``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        *,
        topics: Sequence[str] | None = None,
        catchup_group: str | None = None,
        timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.group = group
        self.topics = list(dict.fromkeys(topics or ()))
        self.catchup_group = catchup_group or f"{group}{CATCHUP_GROUP_SUFFIX}"
        self.timeout = timeout
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": _rdlog}
        conf.update(config or {})
        self._config = dict(config or {})
        self._admin = AdminClient(conf)

    def read(self) -> GroupStatus:
        """One snapshot.

        Raises:
            ClusterUnreachableError: no broker answered within ``timeout``.
            TopicNotFoundError: one of ``topics`` does not exist.
            GroupNotFoundError: the group has no committed offset on those topics.
            StatusError: the cluster refused a request (authorization, coordinator).
        """
        taken_at = time.time()
        try:
            metadata = self._admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise ClusterUnreachableError(
                f"no Kafka broker answered at {self.bootstrap_servers} within"
                f" {self.timeout:g} s ({_reason(exc)})"
            ) from None
        partitions_of = {
            name: sorted(t.partitions) for name, t in metadata.topics.items() if t.error is None
        }
        wanted = self._partitions(partitions_of)
        committed = self._committed(self.group, wanted) if wanted else []
        if not any(tp.offset >= 0 for tp in committed):
            where = f" on topic {', '.join(map(repr, self.topics))}" if self.topics else ""
            raise GroupNotFoundError(
                f"group {self.group!r} has no committed offsets{where} at"
                f" {self.bootstrap_servers} (unknown group, or it never committed)"
            )
        found = {(tp.topic, tp.partition): tp for tp in committed}
        child = {(tp.topic, tp.partition): tp for tp in self._committed(self.catchup_group, wanted)}
        low = self._watermarks(wanted, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        high = self._watermarks(wanted, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        out = []
        for tp in wanted:
            key = (tp.topic, tp.partition)
            g, c = found.get(key), child.get(key)
            out.append(
                partition_status(
                    tp.topic,
                    tp.partition,
                    g.offset if g is not None else -1,
                    g.metadata if g is not None else None,
                    c.offset if c is not None else -1,
                    c.metadata if c is not None else None,
                    low.get(key),
                    high.get(key),
                )
            )
        from .groupstatus import read_chunks

        chunks = read_chunks(
            self.bootstrap_servers, self.group, config=self._config, timeout=self.timeout
        )
        return GroupStatus(
            self.group, self.catchup_group, self.bootstrap_servers, tuple(out), taken_at, chunks
        )

    def _partitions(self, partitions_of: dict[str, list[int]]) -> list[TopicPartition]:
        """Every partition of the topics asked for, or of those the group committed on:
        uncommitted partitions of those topics are shown too."""
        if self.topics:
            missing = [t for t in self.topics if t not in partitions_of]
            if missing:
                raise TopicNotFoundError(f"topic {', '.join(map(repr, missing))} not found")
            names = self.topics
        else:
            listed = [tp for tp in self._committed(self.group, None) if tp.offset >= 0]
            if not listed:
                # A real broker lists every partition the group committed; the mock
                # cluster answers that request with nothing: ask for each explicitly.
                everything = [
                    TopicPartition(t, p)
                    for t, ps in partitions_of.items()
                    if not t.startswith("__")
                    for p in ps
                ]
                committed = self._committed(self.group, everything) if everything else []
                listed = [tp for tp in committed if tp.offset >= 0]
            names = sorted({tp.topic for tp in listed})
        return [TopicPartition(t, p) for t in names for p in partitions_of.get(t, ())]

    def _committed(
        self, group: str, partitions: list[TopicPartition] | None
    ) -> list[TopicPartition]:
        request = ConsumerGroupTopicPartitions(group, partitions)
        try:
            futures = self._admin.list_consumer_group_offsets(
                [request], request_timeout=self.timeout
            )
            return list(futures[group].result(timeout=self.timeout + 5).topic_partitions or [])
        except KafkaException as exc:
            raise StatusError(
                f"cannot read the committed offsets of {group!r}: {_reason(exc)}"
            ) from None
        except TimeoutError:
            raise StatusError(
                f"reading the committed offsets of {group!r} timed out after {self.timeout:g} s"
            ) from None

    def _watermarks(
        self, partitions: Iterable[TopicPartition], spec: OffsetSpec
    ) -> dict[tuple[str, int], int]:
        """Per partition; one whose leader does not answer is left out (shown as
        unknown) rather than failing the whole status."""
        request = {TopicPartition(tp.topic, tp.partition): spec for tp in partitions}
        if not request:
            return {}
        out = {}
        futures = self._admin.list_offsets(request, request_timeout=self.timeout)
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = future.result(timeout=self.timeout + 5).offset
            except (KafkaException, TimeoutError) as exc:
                log.warning("no watermark for %s [%d]: %s", tp.topic, tp.partition, exc)
        return out


def _reason(exc: KafkaException) -> str:
    """librdkafka's own sentence, without the ``KafkaError{code=...}`` wrapping."""
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return text or type(exc).__name__


# ----------------------------------------------------------------- printing
def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _bar(fraction: float, width: int, ascii_only: bool) -> str:
    full, empty = ("#", ".") if ascii_only else ("\u2588", "\u2591")
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return full * filled + empty * (width - filled)


def _range_line(r: RangeStatus, width: int, ascii_only: bool) -> str:
    details = [
        f"backlog [{r.start:,}, {r.end:,}): {r.remaining:,} left",
        _bar(r.fraction, width, ascii_only),
        f"{r.fraction:.0%} of [{r.since:,}, {r.end:,})",
    ]
    notes = []
    if r.child_committed is not None:
        notes.append(f"child committed {r.child_committed:,}")
    else:
        notes.append("no child checkpoint yet")
    if r.rate is not None:
        notes.append(f"{r.rate:,.0f} records/s")
        if r.eta_s is not None:
            notes.append(f"ETA {_duration(r.eta_s)}")
    if r.deleted:
        notes.append(f"{r.deleted:,} deleted by retention")
    return "  ".join(details) + "  " + ", ".join(notes)


def format_status(status: GroupStatus, *, bar_width: int = 20, ascii_only: bool = False) -> str:
    """The human view: one row per partition, one progress bar per pending range."""
    lines = [
        f"group {status.group}  (catch-up log: {status.catchup_group})"
        f"  at {status.bootstrap_servers}, {_iso(status.taken_at)}"
    ]
    busy = status.catching_up
    if busy:
        lines.append(
            f"{len(busy)} of {len(status.partitions)} partitions catching up:"
            f" {status.pending:,} backlog records pending, {status.lag:,} unprocessed in all"
        )
    else:
        lines.append(
            f"no catch-up pending on {len(status.partitions)} partitions;"
            f" {status.lag:,} records unprocessed"
        )
    header = ("partition", "safe offset", "position", "log end", "lag", "state")
    rows = [header]
    for p in status.partitions:
        if p.metadata == "token":
            state = f"{len(p.ranges)} backlog range{'s' * (len(p.ranges) != 1)}"
        else:
            state = _KIND_TEXT[p.metadata]
        rows.append(
            (
                f"{p.topic} [{p.partition}]",
                _num(p.committed),
                _num(p.position),
                _num(p.log_end),
                _num(p.lag),
                state,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]

    def fmt(row: tuple[str, ...]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [row[i].rjust(widths[i]) for i in range(1, 5)]
        cells.append(row[5])
        return "  ".join(cells).rstrip()

    lines += ["", fmt(header)]
    for p, row in zip(status.partitions, rows[1:], strict=True):
        lines.append(fmt(row))
        lines += ["    " + _range_line(r, bar_width, ascii_only) for r in p.ranges]
        if p.metadata == "foreign" and p.user_metadata:
            lines.append(f"    metadata {p.user_metadata[:60]!r}: the offset stands alone")
    if status.chunks is not None:
        from .groupstatus import format_chunks

        lines += ["", *format_chunks(status.chunks)]
    if status.problems:
        lines += ["", "ignored by a restart (it re-reads from the safe offset instead):"]
        lines += [f"  {text}" for text in status.problems]
    if busy:
        lines += [
            "",
            "safe offset: what Kafka stores for the group, where plain tools and a rollback"
            " resume; position: where the primary resumes; lag: records not processed (log end"
            " - position + pending backlog). Bars run from the earliest start known for the"
            " range; --watch tracks them from when it started.",
        ]
    elif not any(p.metadata == "token" for p in status.partitions) and any(
        p.metadata == "foreign" for p in status.partitions
    ):
        lines += [
            "",
            "no fastrebalance token in this group: either no catch-up is pending or the group"
            " is not used by fastrebalance; its offsets are plain and safe.",
        ]
    return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 100) -> str:
    # Tables and bars keep their layout (they hold double spaces); prose is wrapped.
    if len(line) <= width or line.startswith(" ") or "  " in line:
        return line
    return textwrap.fill(line, width)


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "status",
        "show a group's catch-up: safe offsets, pending backlog ranges, child progress, lag",
        (
            "Read a consumer group's committed offsets with their range tokens, the child's "
            "commit log (<group>.catchup) and the log-end offsets, and show per partition: "
            "the safe committed offset (what plain tools see), the primary's position, the "
            "pending backlog ranges with a progress bar each, the child's checkpoint, and the "
            "lag (records not yet processed).",
            "Only committed offsets are read, so this works against a group with no live "
            "member and never disturbs a running one. What it shows as pending is what a "
            "restart of the group would read again.",
            "Kafka keeps only the latest commit of each log: a single snapshot knows a range "
            "from the child's previous checkpoint on; --watch follows each range from when it "
            "started, with a drain rate and an ETA.",
        ),
        """\
examples:
  fastrebalance status --bootstrap-servers localhost:9092 --group orders
  fastrebalance status --bootstrap-servers localhost:9092 --group orders --topic orders --watch
  fastrebalance status --bootstrap-servers kafka:9093 --group orders --json \\
      -X security.protocol=SASL_SSL -X sasl.mechanism=PLAIN \\
      -X sasl.username=ops -X sasl.password=...
""",
    )
    a.bootstrap_servers(p, "the Kafka cluster", required=True)
    p.add_argument("--group", "-g", required=True, metavar="G", help="the application's group.id")
    p.add_argument("--topic", "-t", action="append", metavar="T", help="only this topic, every "
                   "partition of it (repeatable; default: every topic the group committed "
                   "offsets for)")  # fmt: skip
    p.add_argument("--catchup-group", metavar="C", help="the child's group id, if "
                   "parallel.rebalance.catchup.group.id was set (default: G.catchup)")
    p.add_argument("--json", action="store_true",
                   help="print JSON for machines (with --watch: one JSON document per line)")
    p.add_argument("--watch", "-w", action="store_true",
                   help="refresh until Ctrl-C, tracking each range's progress, rate and ETA")
    a.option(p, "--interval", 2.0, a.positive(), "SECONDS",
             "seconds between --watch refreshes (default: {})")
    a.option(p, "--count", None, a.number(int, 1), "N",
             "with --watch, stop after N refreshes (default: until Ctrl-C)")
    a.timeout(p, 10.0, "give up on an unanswered request after this long (default: {})")
    p.add_argument("-X", dest="config", action="append", type=a.config_pair, default=[],
                   metavar="KEY=VALUE", help="a librdkafka property for the admin client "
                   "(repeatable), e.g. security.protocol=SSL")  # fmt: skip
    a.option(p, "--prometheus", None, a.number(int, 1), "PORT", "serve the group's catch-up "
             "metrics for Prometheus on this port (/metrics), read every --interval seconds, "
             "until Ctrl-C (needs prometheus_client)")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    try:
        "\u2588\u2591".encode(sys.stdout.encoding or "ascii")
        ascii_only = False
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    clear = args.watch and not args.json and sys.stdout.isatty()
    tracker = ProgressTracker()
    try:
        reader = StatusReader(
            args.bootstrap_servers, args.group, topics=args.topic,
            catchup_group=args.catchup_group, timeout=args.timeout, config=dict(args.config),
        )  # fmt: skip
    except (KafkaException, ValueError, TypeError) as exc:  # librdkafka refused a -X property
        print(f"fastrebalance status: invalid client configuration: {exc}", file=sys.stderr)
        return a.EXIT_USAGE
    if args.prometheus is not None:
        return _serve_metrics(reader, args.prometheus, args.interval, args.count)

    def snapshot() -> int:
        try:
            status = reader.read()
        except StatusError as exc:
            not_found = isinstance(exc, (GroupNotFoundError, TopicNotFoundError))
            if args.json:  # stdout stays parseable for the machine reading it
                kind = {
                    GroupNotFoundError: "group_not_found",
                    TopicNotFoundError: "topic_not_found",
                    ClusterUnreachableError: "cluster_unreachable",
                }.get(type(exc), "error")
                doc = {"schema": JSON_SCHEMA_VERSION, "error": kind, "message": str(exc)}
                print(json.dumps(doc), flush=True)
            print(f"fastrebalance status: {exc}", file=sys.stderr, flush=True)
            return a.EXIT_CHECK_FAILED if not_found else a.EXIT_ERROR
        if args.watch:
            status = tracker.update(status)
        if args.json:
            doc = status.to_dict()
            print(json.dumps(doc) if args.watch else json.dumps(doc, indent=2), flush=True)
        else:
            if clear:
                print("\x1b[H\x1b[2J", end="")
            print(format_status(status, ascii_only=ascii_only), flush=True)
        return a.EXIT_CHECK_FAILED if status.problems else a.EXIT_OK

    code = snapshot()
    if not args.watch:
        return code
    done = 1
    try:
        while args.count is None or done < args.count:
            time.sleep(args.interval)
            if not args.json and not clear:
                print()
            code = snapshot()
            done += 1
    except KeyboardInterrupt:
        pass  # the normal end of a watch: report how the last refresh went
    return code


def _serve_metrics(reader: StatusReader, port: int, interval: float, count: int | None) -> int:
    """``status --prometheus``: this thread owns the reader and refreshes the snapshot;
    the HTTP server's threads only read the latest one."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        print("fastrebalance status: --prometheus needs prometheus_client "
              "(pip install 'fastrebalance[prometheus]')", file=sys.stderr)  # fmt: skip
        return a.EXIT_USAGE
    from ..metrics import StatusCollector

    latest: list[GroupStatus] = [reader.read()]
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: latest[0]))
    start_http_server(port, registry=registry)
    print(f"fastrebalance status: serving metrics on http://0.0.0.0:{port}/metrics", flush=True)
    refreshes = 1
    try:
        while count is None or refreshes < count:
            time.sleep(interval)
            try:
                latest[0] = reader.read()
            except StatusError as exc:  # keep serving the last snapshot
                print(f"fastrebalance status: {exc}", file=sys.stderr, flush=True)
            refreshes += 1
    except KeyboardInterrupt:
        pass
    return a.EXIT_OK
