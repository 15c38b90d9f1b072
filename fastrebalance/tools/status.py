"""``fastrebalance status``: what a group's two commit logs say, read from outside the group.

Only committed offsets (the user's group ``G`` and the child's ``G.catchup``) and the log
watermarks are read: no group membership and no DescribeGroups (which the mock cluster does
not serve, and which says nothing about catch-up anyway). So a group with no live member can
be inspected, and inspecting never disturbs a running group. The two logs are merged by
``_planning.restore()``, the very function a restarting consumer uses: what status shows as
pending is what a restart would read again. Kafka keeps only the latest commit of each log,
so one snapshot knows a range from the child's last checkpoint on; ``ProgressTracker``
follows each range across ``--watch`` refreshes, with a drain rate and an ETA.

Thread ownership: a ``StatusReader`` owns one AdminClient, used only by the thread that
calls ``read()``, which also makes (and closes) the consumer reading the claims log;
everything else here is pure.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions as GroupPartitions
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from .._claims import ClaimsState, Scope, decode_record
from .._claimslog import client_config
from .._config import CATCHUP_GROUP_SUFFIX, DEFAULT_CLAIM_TIMEOUT_MS, default_claims_topic
from .._planning import restore
from .._token import ChildCheckpoint, TokenError, decode_child_checkpoint, decode_group_token
from . import _args as a

#: Bumped when a field of ``GroupStatus.to_dict()`` changes meaning or disappears
#: (new fields do not bump it): scripts parsing ``--json`` can pin it.
JSON_SCHEMA_VERSION = 1

#: librdkafka's own log lines (connection refused, every 50 ms) would bury the one-line
#: answer. Given a logger, librdkafka queues them for ``poll()``, which status never
#: calls: they are dropped, and the errors raised here carry librdkafka's reason instead.
_rdlog = logging.getLogger("fastrebalance.status.librdkafka")
log = logging.getLogger("fastrebalance.status")

#: Seconds between the refreshes of --watch and --prometheus.
_INTERVAL_S = 2.0

#: The state column (docs/cli.md "Partition states"); a token shows its ranges instead.
_KIND_TEXT = {
    "none": "no committed offset",
    "plain": "plain offset",
    "foreign": "metadata not written by fastrebalance",
    "unreadable": "fastrebalance metadata that cannot be trusted",
}


class StatusError(Exception):
    """The status could not be read; the message is meant for the operator, ``kind``
    names the error in the ``--json`` error document (docs/cli.md "JSON")."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RangeStatus:
    """One pending backlog range ``[start, end)`` (docs/cli.md "JSON" says what each field
    means). ``since``, the bar's origin, is the earliest start known: a snapshot knows the
    child's previous checkpoint at best, a watch the first start it saw. Only a watch
    knows the ``rate`` (records/s)."""

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
    def done(self) -> int:
        return self.start - self.since

    @property
    def fraction(self) -> float:
        return self.done / (self.end - self.since) if self.end > self.since else 0.0

    @property
    def eta_s(self) -> float | None:
        return self.remaining / self.rate if self.rate else None

    def to_dict(self) -> dict[str, Any]:
        eta, rate = self.eta_s, self.rate
        return {
            **asdict(self),
            "remaining": self.remaining,
            "done": self.done,
            "fraction": round(self.fraction, 4),
            "rate": None if rate is None else round(rate, 1),
            "eta_s": None if eta is None else round(eta, 1),
        }


@dataclass(frozen=True)
class PartitionStatus:
    """One partition, as a restart of the group would see it (docs/cli.md "JSON"):
    ``committed`` is the *safe* offset Kafka stores for the group, ``position`` where the
    primary resumes, ``checkpoint`` the child's latest, whether it still applies or not."""

    topic: str
    partition: int
    committed: int | None
    position: int | None
    ranges: tuple[RangeStatus, ...] = ()
    log_start: int | None = None
    log_end: int | None = None
    metadata: str = "none"  # none, plain, token, foreign or unreadable
    user_metadata: str = ""
    checkpoint: ChildCheckpoint | None = None
    problem: str | None = None
    token_bytes: int = 0

    @property
    def pending(self) -> int:
        return sum(r.remaining for r in self.ranges)

    @property
    def primary_lag(self) -> int | None:
        if self.position is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.position)

    @property
    def lag(self) -> int | None:
        """Records not yet processed. Plain tools report ``tool_lag`` instead, which also
        counts the records between the backlog and the primary that are processed."""
        return None if self.primary_lag is None else self.primary_lag + self.pending

    @property
    def tool_lag(self) -> int | None:
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["child_checkpoint"] = doc.pop("checkpoint")
        doc["ranges"] = [r.to_dict() for r in self.ranges]
        doc.update(lag=self.lag, primary_lag=self.primary_lag, tool_lag=self.tool_lag)
        return {**doc, "pending": self.pending}


@dataclass(frozen=True)
class GroupStatus:
    """A snapshot of one group: every partition of the topics it committed (or asked for).
    ``taken_at`` is in seconds since the epoch; ``chunks`` are group-wide catch-up's open
    chunks and their holders (None: the group has no claims topic)."""

    group: str
    catchup_group: str
    bootstrap_servers: str
    partitions: tuple[PartitionStatus, ...]
    taken_at: float = field(default_factory=time.time)
    chunks: list[dict[str, Any]] | None = None

    @property
    def catching_up(self) -> tuple[PartitionStatus, ...]:
        return tuple(p for p in self.partitions if p.ranges)

    @property
    def problems(self) -> list[str]:
        return [f"{p.topic} [{p.partition}]: {p.problem}" for p in self.partitions if p.problem]

    @property
    def pending(self) -> int:
        return sum(p.pending for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "schema": JSON_SCHEMA_VERSION,
            "group": self.group,
            "catchup_group": self.catchup_group,
            "bootstrap_servers": self.bootstrap_servers,
            "time": _iso(self.taken_at),
            "catching_up": bool(self.catching_up),
            "pending": self.pending,
            "lag": self.lag,
            "problems": self.problems,
            "partitions": [p.to_dict() for p in self.partitions],
        }
        return doc if self.chunks is None else {**doc, "chunks": self.chunks}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------- pure merge
def _classify(offset: int, metadata: str | None) -> tuple[str, tuple[tuple[int, int], ...]]:
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
    return ("token", token.ranges) if token.safe_offset == offset else ("unreadable", ())


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
    """Merge one partition's two commits (offset < 0: none) and its watermarks (None:
    unknown), exactly as a restart would."""
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
            since, committed_in = min(since, checkpoint.start), checkpoint.offset
        deleted = min(end, log_start) - start if log_start is not None and log_start > start else 0
        ranges.append(RangeStatus(start, end, since, committed_in, deleted))
    token_bytes = len((group_metadata or "").encode("utf-8")) if kind == "token" else 0
    committed = group_offset if group_offset >= 0 else None
    return PartitionStatus(
        topic, partition, committed, restored.position, tuple(ranges), log_start, log_end,
        kind, restored.user_metadata or "", checkpoint, restored.problem, token_bytes,
    )  # fmt: skip


class ProgressTracker:
    """Remembers each pending range across refreshes, for ``--watch``.

    A range is known by its end (range ends are log ends at crash time, so they identify
    a range for its whole life while its start moves up). The tracker keeps the lowest
    start seen, which makes the bar's origin stable, and the first observation, from
    which the drain rate is measured.
    """

    def __init__(self) -> None:
        #: (topic, partition, end) -> (lowest start seen, first seen at, start then)
        self._seen: dict[tuple[str, int, int], tuple[int, float, int]] = {}

    def update(self, status: GroupStatus) -> GroupStatus:
        """The same snapshot with ``since`` widened and ``rate`` filled in."""
        now, seen = status.taken_at, {}
        parts = []
        for p in status.partitions:
            ranges = []
            for r in p.ranges:
                key = (p.topic, p.partition, r.end)
                since, first_t, first_start = self._seen.get(key, (r.since, now, r.start))
                seen[key] = (min(since, r.since), first_t, first_start)
                rate = (r.start - first_start) / (now - first_t) if now > first_t else None
                ranges.append(replace(r, since=seen[key][0], rate=rate))
            parts.append(replace(p, ranges=tuple(ranges)))
        self._seen = seen  # finished ranges are forgotten, or it would never shrink
        return replace(status, partitions=tuple(parts))


# ------------------------------------------------------------------ reading
class StatusReader:
    """Reads snapshots of one group; ``--watch`` keeps one, so that each refresh reuses
    the admin client's connections instead of reconnecting every few seconds. The
    arguments are the options of ``fastrebalance status``; ``topics`` None: every topic
    the group has committed offsets for, every partition of each."""

    def __init__(
        self, bootstrap_servers: str, group: str, *, topics: Sequence[str] | None = None,
        catchup_group: str | None = None, timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.bootstrap_servers, self.group, self.timeout = bootstrap_servers, group, timeout
        self.topics = list(dict.fromkeys(topics or ()))
        self.catchup_group = catchup_group or f"{group}{CATCHUP_GROUP_SUFFIX}"
        self._config = {"bootstrap.servers": bootstrap_servers, **(config or {})}
        conf: dict[str, Any] = {**self._config, "logger": _rdlog}
        self._admin = AdminClient(conf)

    def read(self) -> GroupStatus:
        """One snapshot; a ``StatusError`` when the cluster does not answer or refuses,
        or when a topic asked for or the group's commits are not found."""
        taken_at = time.time()
        try:
            topics = self._admin.list_topics(timeout=self.timeout).topics
        except KafkaException as exc:
            raise StatusError(
                f"no Kafka broker answered at {self.bootstrap_servers} within"
                f" {self.timeout:g} s ({_reason(exc)})", "cluster_unreachable",
            ) from None  # fmt: skip
        partitions_of = {t: sorted(meta.partitions) for t, meta in topics.items() if not meta.error}
        missing = [t for t in self.topics if t not in partitions_of]
        if missing:
            raise StatusError(f"topic {', '.join(map(repr, missing))} not found", "topic_not_found")
        asked = [(t, p) for t in self.topics for p in partitions_of[t]]
        found = self._committed(self.group, asked if self.topics else None)
        if not self.topics and not any(tp.offset >= 0 for tp in found.values()):
            # A real broker lists every partition the group committed; the mock cluster
            # answers that request with nothing: ask for each explicitly.
            asked = [(t, p) for t, ps in partitions_of.items() for p in ps if t[:2] != "__"]
            found = self._committed(self.group, asked)
        names = self.topics or sorted({t for (t, _), tp in found.items() if tp.offset >= 0})
        wanted = [(t, p) for t in names for p in partitions_of.get(t, ())]
        if not any(found.get(key, _NO_COMMIT).offset >= 0 for key in wanted):
            where = f" on topic {', '.join(map(repr, self.topics))}" if self.topics else ""
            raise StatusError(
                f"group {self.group!r} has no committed offsets{where} at"
                f" {self.bootstrap_servers} (unknown group, or it never committed)",
                "group_not_found",
            )
        child = self._committed(self.catchup_group, wanted)
        low = self._watermarks(wanted, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        high = self._watermarks(wanted, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        parts = []
        for key in wanted:
            g, c = found.get(key, _NO_COMMIT), child.get(key, _NO_COMMIT)
            marks = (low.get(key), high.get(key))
            parts.append(partition_status(*key, g.offset, g.metadata, c.offset, c.metadata, *marks))
        chunks = self._chunks()
        for ch in chunks or ():
            # A chunk outside every pending range was offered by an owner that died before
            # its plan reached the group's commit: a restart plans those offsets again.
            ch["in_commit"] = any(
                (p.topic, p.partition) == (ch["topic"], ch["partition"])
                and r.start <= ch["start"] and ch["end"] <= r.end
                for p in parts for r in p.ranges
            )  # fmt: skip
        return GroupStatus(
            self.group, self.catchup_group, self.bootstrap_servers, tuple(parts), taken_at, chunks
        )

    def _committed(
        self, group: str, partitions: list[tuple[str, int]] | None
    ) -> dict[tuple[str, int], TopicPartition]:
        if partitions == []:
            return {}
        asked = None if partitions is None else [TopicPartition(*key) for key in partitions]
        try:
            futures = self._admin.list_consumer_group_offsets(
                [GroupPartitions(group, asked)], request_timeout=self.timeout
            )
            got = futures[group].result(timeout=self.timeout + 5).topic_partitions or []
        except (KafkaException, TimeoutError) as exc:
            raise StatusError(
                f"cannot read the committed offsets of {group!r}: {_reason(exc)}"
            ) from None
        return {(tp.topic, tp.partition): tp for tp in got}

    def _watermarks(
        self, partitions: list[tuple[str, int]], spec: OffsetSpec
    ) -> dict[tuple[str, int], int]:
        """Per partition; one whose leader does not answer is left out (shown as
        unknown) rather than failing the whole status."""
        out: dict[tuple[str, int], int] = {}
        request = {TopicPartition(*key): spec for key in partitions}
        for tp, future in self._admin.list_offsets(request, request_timeout=self.timeout).items():
            try:
                out[(tp.topic, tp.partition)] = future.result(timeout=self.timeout + 5).offset
            except (KafkaException, TimeoutError) as exc:
                log.warning("no watermark for %s [%d]: %s", tp.topic, tp.partition, exc)
        return out

    def _chunks(self) -> list[dict[str, Any]] | None:
        """Group-wide catch-up's chunks not done yet and their holders, or None when the
        group has no claims topic. The claims log is read from its start by the very state
        machine every member runs (``_claims``): what is shown is what the members
        believe, a holder being live by the default claim timeout, judged at the later of
        the log's time and this machine's clock."""
        topic = default_claims_topic(self.group)
        c = Consumer({
            **client_config(self._config, "status"),
            "group.id": f"{topic}.status-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,  # looking never creates it
        })  # fmt: skip
        try:
            md = c.list_topics(topic, timeout=self.timeout)
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            scope = Scope(self.group, md.cluster_id or "")  # the group's records only
            low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=self.timeout)
            state = ClaimsState(DEFAULT_CLAIM_TIMEOUT_MS)
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            read, deadline = 0, time.monotonic() + self.timeout
            while read < high - low and time.monotonic() < deadline:
                for m in c.consume(1000, 0.5):
                    if m.error() is None:
                        read += 1
                        state.apply(decode_record(m.value(), scope), m.timestamp()[1])
            # Log time stands still when nobody writes: a group whose members all died
            # would show their chunks held for ever. To the operator, now is also now.
            state.apply(None, int(time.time() * 1000))
        except KafkaException:
            return None
        finally:
            c.close()
        return [
            dict(zip(("topic", "partition", "start", "end"), chunk, strict=True), holder=holder,
                 state="free" if holder is None else "held" if live else "expired")
            for chunk, holder, live in state.holdings()
        ]  # fmt: skip


#: What a partition without a commit reads as.
_NO_COMMIT = TopicPartition("", -1, -1001)


def _group_id(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a group id is not empty")
    return text


def _reason(exc: Exception) -> str:
    """librdkafka's own sentence, without the ``KafkaError{code=...}`` wrapping."""
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return text or f"no answer ({type(exc).__name__})"


# ----------------------------------------------------------------- printing
def _range_line(r: RangeStatus, width: int, ascii_only: bool) -> str:
    full, empty = "#." if ascii_only else "\u2588\u2591"
    filled = round(r.fraction * width)
    notes = ["no child checkpoint yet"]
    if r.child_committed is not None:
        notes = [f"child committed {r.child_committed:,}"]
    if r.rate is not None:
        notes.append(f"{r.rate:,.0f} records/s")
    eta = r.eta_s
    if eta is not None:
        if eta < 60:
            notes.append(f"ETA {eta:.0f} s")
        elif eta < 3600:
            notes.append(f"ETA {eta / 60:.0f} min")
        else:
            notes.append(f"ETA {eta / 3600:.1f} h")
    if r.deleted:
        notes.append(f"{r.deleted:,} deleted by retention")
    return (
        f"backlog [{r.start:,}, {r.end:,}): {r.remaining:,} left"
        f"  {full * filled}{empty * (width - filled)}  {r.fraction:.0%} of [{r.since:,}, {r.end:,})"
        f"  {', '.join(notes)}"
    )


def format_status(status: GroupStatus, *, bar_width: int = 20, ascii_only: bool = False) -> str:
    """The human view: one row per partition, one progress bar per pending range. The
    columns are explained in docs/operations.md "Monitoring"."""
    busy, count = status.catching_up, len(status.partitions)
    lines = [
        f"group {status.group}  (catch-up log: {status.catchup_group})"
        f"  at {status.bootstrap_servers}, {_iso(status.taken_at)}",
        f"{len(busy)} of {count} partitions catching up: {status.pending:,} backlog records"
        f" pending, {status.lag:,} unprocessed in all"
        if busy
        else f"no catch-up pending on {count} partitions; {status.lag:,} records unprocessed",
        "",
    ]
    rows = [["partition", "safe offset", "position", "log end", "lag", "state"]]
    details: list[list[str]] = [[]]  # the lines under each row
    for p in status.partitions:
        n, values = len(p.ranges), (p.committed, p.position, p.log_end, p.lag)
        state = _KIND_TEXT.get(p.metadata) or f"{n} backlog range{'s' * (n != 1)}"
        numbers = ["-" if v is None else f"{v:,}" for v in values]
        rows.append([f"{p.topic} [{p.partition}]", *numbers, state])
        details.append(["    " + _range_line(r, bar_width, ascii_only) for r in p.ranges])
        if p.metadata == "foreign" and p.user_metadata:
            details[-1].append(f"    metadata {p.user_metadata[:60]!r}: the offset stands alone")
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row, more in zip(rows, details, strict=True):
        cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, 5)]
        lines += ["  ".join([*cells, row[5]]), *more]
    if status.chunks is not None:
        held = sum(1 for c in status.chunks if c["state"] == "held")
        lines += ["", f"group-wide catch-up: {len(status.chunks)} open chunks, {held} held"]
        outside = sum(1 for c in status.chunks if not c["in_commit"])
        if outside:
            lines.append(
                f"  {outside} of them in no pending range of the group's commit (their "
                "owner died before committing its plan): a restart plans them again"
            )
        for c in status.chunks[:20]:
            span = f"{c['topic']} [{c['partition']}] [{c['start']:,}, {c['end']:,})"
            lines.append(f"  {span}  {c['state']:<7} {c['holder'] or '-'}")
        if len(status.chunks) > 20:
            lines.append(f"  ... {len(status.chunks) - 20} more")
    if status.problems:
        lines += ["", "ignored by a restart (it re-reads from the safe offset instead):"]
        lines += [f"  {text}" for text in status.problems]
    return "\n".join(lines)


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "status",
        "show a group's catch-up: safe offsets, pending backlog ranges, child progress, lag",
        (
            "Show per partition the safe committed offset (what plain tools see), the "
            "primary's position, the pending backlog ranges with a progress bar each, the "
            "child's checkpoint and the lag, from the group's committed offsets, the child's "
            "commit log (<group>.catchup) and the log ends: this works against a group with "
            "no live member and never disturbs a running one.",
        ),
        """\
examples:
  fastrebalance status --bootstrap-servers localhost:9092 --group orders
  fastrebalance status --bootstrap-servers localhost:9092 --group orders --topic orders --watch
  fastrebalance status -b kafka:9093 -g orders --json -X security.protocol=SSL
""",
    )
    a.bootstrap_servers(p, "the Kafka cluster", required=True)
    p.add_argument("--group", "-g", required=True, type=_group_id, metavar="G",
                   help="the application's group.id")
    p.add_argument("--topic", "-t", action="append", metavar="T", help="only this topic, every "
                   "partition of it (repeatable; default: every topic the group committed "
                   "offsets for)")  # fmt: skip
    p.add_argument("--catchup-group", metavar="C", help="the child's group id, if "
                   "parallel.rebalance.catchup.group.id was set (default: G.catchup)")
    p.add_argument("--json", action="store_true",
                   help="print JSON for machines (with --watch: one JSON document per line)")
    p.add_argument("--watch", "-w", action="store_true",
                   help="refresh until Ctrl-C, tracking each range's progress, rate and ETA")
    a.option(p, "--interval", None, a.positive(), "SECONDS",
             f"seconds between --watch or --prometheus refreshes (default: {_INTERVAL_S:g})")
    a.option(p, "--count", None, a.number(int, 1), "N",
             "with --watch or --prometheus, stop after N refreshes (default: until Ctrl-C)")
    a.timeout(p, 10.0, "give up on an unanswered request after this long (default: {})")
    p.add_argument("-X", dest="config", action="append", type=a.config_pair, default=[],
                   metavar="KEY=VALUE", help="a librdkafka property for the admin client "
                   "(repeatable), e.g. security.protocol=SSL")  # fmt: skip
    a.option(p, "--prometheus", None, a.listen_address, "[HOST:]PORT",
             "serve the group's catch-up metrics for Prometheus at http://HOST:PORT/metrics, "
             "read every --interval seconds, until Ctrl-C (needs prometheus_client). A PORT "
             f"alone listens on loopback ({a.LOOPBACK}) only, so that nothing is published "
             "to the network by accident; for a scraper on another host, name the address: "
             "0.0.0.0:PORT or :PORT (every IPv4 interface), [::]:PORT, or one interface's "
             "address")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    repeat = args.watch or args.prometheus is not None
    for name in ("count", "interval"):
        if getattr(args, name) is not None and not repeat:
            return _usage(f"--{name} needs --watch or --prometheus (a snapshot is one read)")
    if args.json and args.prometheus is not None:
        return _usage("--json does not apply to --prometheus (the metrics are served instead)")
    try:
        reader = StatusReader(
            args.bootstrap_servers, args.group, topics=args.topic,
            catchup_group=args.catchup_group, timeout=args.timeout, config=dict(args.config),
        )  # fmt: skip
    except (KafkaException, ValueError, TypeError) as exc:  # librdkafka refused a -X property
        print(f"fastrebalance status: invalid client configuration: {exc}", file=sys.stderr)
        return a.EXIT_USAGE
    show = _printer(args) if args.prometheus is None else _exporter(args.prometheus)
    if show is None:
        return a.EXIT_USAGE
    tracker, codes = ProgressTracker(), []  # the exit code of each refresh

    def refresh() -> None:
        try:
            status = reader.read()
        except StatusError as exc:
            if args.json:  # stdout stays parseable for the machine reading it
                doc = {"schema": JSON_SCHEMA_VERSION, "error": exc.kind, "message": str(exc)}
                print(json.dumps(doc), flush=True)
            print(f"fastrebalance status: {exc}", file=sys.stderr, flush=True)
            not_found = exc.kind in ("group_not_found", "topic_not_found")
            codes.append(a.EXIT_CHECK_FAILED if not_found else a.EXIT_ERROR)
            return
        show(tracker.update(status) if args.watch else status, bool(codes))
        codes.append(a.EXIT_CHECK_FAILED if status.problems else a.EXIT_OK)

    refresh()
    try:  # Ctrl-C is the normal end of a watch: the last refresh says how it went
        while repeat and len(codes) != args.count:
            time.sleep(args.interval or _INTERVAL_S)
            refresh()
    except KeyboardInterrupt:
        pass
    return codes[-1]


def _usage(message: str) -> int:
    print(f"fastrebalance status: {message}", file=sys.stderr)
    return a.EXIT_USAGE


def _printer(args: argparse.Namespace) -> Callable[[GroupStatus, bool], None]:
    """Prints each snapshot: JSON, or the human view (in place on a terminal)."""
    try:
        "\u2588\u2591".encode(sys.stdout.encoding or "ascii")
        ascii_only = False
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    clear = args.watch and not args.json and sys.stdout.isatty()

    def show(status: GroupStatus, again: bool) -> None:
        if args.json:
            print(json.dumps(status.to_dict(), indent=None if args.watch else 2), flush=True)
            return
        if clear:
            print("\x1b[H\x1b[2J", end="")
        elif again:  # a blank line between refreshes
            print()
        print(format_status(status, ascii_only=ascii_only), flush=True)

    return show


def _exporter(address: tuple[str, int]) -> Callable[[GroupStatus, bool], None] | None:
    """``--prometheus``: listens at once (an address in use or not this host's fails before
    any read), and serves the latest snapshot from the first one read on: a scrape before
    it gets no fastrebalance metrics. The command's thread owns the reader; the HTTP
    server's threads only read ``latest``."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        print("fastrebalance status: --prometheus needs prometheus_client "
              "(pip install 'fastrebalance[prometheus]')", file=sys.stderr)  # fmt: skip
        return None
    from ..metrics import StatusCollector

    latest: list[GroupStatus] = []

    class Latest:
        def collect(self) -> Iterator[Any]:
            snapshot = latest[:1]  # one read: the command's thread replaces the list's item
            if snapshot:
                yield from StatusCollector(lambda: snapshot[0]).collect()

        def describe(self) -> list[Any]:
            return []

    registry = CollectorRegistry()
    registry.register(Latest())
    listen(address, registry)
    host, port = address
    print(f"fastrebalance status: serving metrics on http://{a.url_host(host)}:{port}/metrics",
          flush=True)  # fmt: skip

    def show(status: GroupStatus, _again: bool) -> None:
        latest[:] = [status]

    return show


def listen(address: tuple[str, int], registry: Any) -> Any:
    """Serves ``registry`` at ``http://HOST:PORT/metrics`` from a daemon thread. An address
    in use, or not one of this host's, raises an ``OSError`` that names it (exit 3, as
    ``_args.run`` says). Returns what ``start_http_server`` does (in recent
    prometheus_client releases, the server and its thread: tests stop the server)."""
    from prometheus_client import start_http_server

    host, port = address
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        where = f"{a.url_host(host)}:{port}"
        raise OSError(f"cannot listen on {where}: {exc.strerror or exc}") from None
