"""Who reads which chunk of a backlog, group-wide: a pure state machine over the claims log.

Group-wide catch-up (``parallel.rebalance.group.catchup``) lets every member's child read
slices ("chunks") of any partition's pending backlog. Members agree on who reads what
through one Kafka topic used as a log (one partition, so one order): every member reads it
from the start and feeds each record, in log order, to a ``ClaimsState``. The state depends
on nothing but the records and their order, so every reader that has read the same prefix
holds the same state, with no clock of its own: time is the log's (the largest record
timestamp seen so far, so it never goes back).

Records (``ClaimRecord.kind``):

* ``offer``: the owner of a partition (the member that planned its backlog) publishes
  chunks ``[start, end)`` of it, under the backlog's *lineage*. A chunk is a fact about
  one lineage: those offsets were pending in it when offered. A chunk already known in
  its lineage is not offered twice; offered under another lineage, it starts afresh (free,
  not done): the offsets are pending again, in a backlog the old ``done`` says nothing of.
* ``claim``: a member asks for a chunk. The first claim in log order of a chunk that is
  not done and has no live holder wins; any later claim of a held chunk loses.
* ``hb``: the member is alive. Every record of a member counts as its heartbeat.
* ``done``: the chunk's holder has processed and committed (in its own commit path) every
  record of the chunk. Accepted only from the chunk's holder (its last winning claimant,
  even if its claim expired meanwhile, as long as nobody claimed it since: it did do the
  work). Once done, a chunk stays done in its lineage (``done(t, p, lineage)`` never
  shrinks).

``claim``, ``done`` and ``release`` name the lineage they are about, and apply only to a
chunk of that lineage: a record about an older incarnation of the chunk changes nothing.
Why lineages: an operator's ``--reset-offsets``, a group deleted and made again under the
same id, or any rewind makes the group read offsets it already read; the grid cuts them
into the same chunks, and without lineages their old ``done`` records (retention: a day)
were absorbed with nothing read (6,000 of 8,000 records never delivered after a reset to
0, issue 48).
* ``release``: the holder gives the chunk back (it cannot finish it); it is free again.
* ``bye``: the member leaves cleanly; all its chunks are free again at once.

A holder is *live* while the log shows a record of it no older than ``timeout_ms`` (log
time). A chunk whose holder is not live is free: the next claim in log order takes it.
Nothing here does I/O; ``_claimslog`` reads and writes the topic.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from ._ranges import RangeSet

__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "ChunkKey",
    "ClaimRecord",
    "ClaimsState",
    "Scope",
    "cut_chunks",
    "decode_record",
    "encode_record",
]

#: (topic, partition, start, end): a chunk is named by the offsets it covers.
ChunkKey = tuple[str, int, int, int]
KINDS = ("offer", "claim", "hb", "done", "release", "bye")
#: The record format. 1 (written before the first release) named no group: two groups
#: sharing a claims topic took each other's ``done`` records, and each stored an offset past
#: the chunks only the
#: other had read (15,000 of 30,000 records, issue 48). A reader skips every record of
#: another version, as one of another group: members of different versions never act on
#: each other's records (each then reads its own backlog's chunks itself: slower, safe).
FORMAT_VERSION = 2


@dataclass(frozen=True)
class Scope:
    """Whose records these are: one consumer group of one Kafka cluster.

    A ``done`` record means "these offsets were processed and committed *by this group*";
    read by another group, it would let that group's offset pass records it never
    processed. Every record carries its scope and a reader acts on its own scope's only,
    so a claims topic shared by several groups (one config file for several
    applications), or mirrored between clusters whose topics share names, is safe.
    ``cluster``: the cluster id the brokers report ("" where they report none).
    """

    group: str
    cluster: str = ""


@dataclass(frozen=True)
class ClaimRecord:
    """One record of the claims log. ``chunks``: the offered ranges (``offer``), or the one
    chunk a ``claim``/``done``/``release`` names; empty for ``hb`` and ``bye``."""

    kind: str
    member: str
    topic: str = ""
    partition: int = -1
    chunks: tuple[tuple[int, int], ...] = ()
    #: the backlog lineage the chunks belong to ("" in ``hb``/``bye``)
    lineage: str = ""


def encode_record(rec: ClaimRecord, scope: Scope) -> bytes:
    """Compact JSON, versioned and scoped, so that a reader of another version, group or
    cluster skips it."""
    doc: dict[str, object] = {
        "v": FORMAT_VERSION,
        "g": scope.group,
        "x": scope.cluster,
        "k": rec.kind,
        "m": rec.member,
    }
    if rec.topic:
        doc["t"] = rec.topic
        doc["p"] = rec.partition
        doc["c"] = [list(c) for c in rec.chunks]
        doc["l"] = rec.lineage
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_record(value: bytes | str | None, scope: Scope) -> ClaimRecord | None:
    """The record, or None for anything this version does not understand or that belongs
    to another scope (skipped by every reader of ``scope`` alike, so the state stays the
    same everywhere)."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
        if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
            return None
        if doc.get("g") != scope.group or doc.get("x") != scope.cluster:
            return None
        kind, member = doc["k"], doc["m"]
        if kind not in KINDS or not isinstance(member, str) or not member:
            return None
        topic = doc.get("t", "")
        partition = doc.get("p", -1)
        raw = doc.get("c", [])
        lineage = doc.get("l", "")
        if not (
            isinstance(topic, str)
            and isinstance(partition, int)
            and isinstance(raw, list)
            and isinstance(lineage, str)
        ):
            return None
        chunks = []
        for c in raw:
            if (
                not isinstance(c, list)
                or len(c) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in c)
                or not 0 <= c[0] < c[1]
            ):
                return None
            chunks.append((c[0], c[1]))
        if kind in ("claim", "done", "release") and (len(chunks) != 1 or not topic):
            return None
        if kind == "offer" and not topic:
            return None
        return ClaimRecord(kind, member, topic, partition, tuple(chunks), lineage)
    except (ValueError, KeyError, TypeError):
        return None


def cut_chunks(ranges: Iterable[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Cut ranges into chunks on a grid of ``size`` offsets (multiples of ``size``), so
    that two owners cutting the same offsets cut them the same way."""
    if size < 1:
        raise ValueError("chunk size must be >= 1")
    out = []
    for start, end in ranges:
        s = start
        while s < end:
            e = min(end, (s // size + 1) * size)
            out.append((s, e))
            s = e
    return out


class _Chunk:
    __slots__ = ("done_by", "holder", "lineage", "owner")

    def __init__(self, owner: str, lineage: str) -> None:
        self.owner = owner  #: the member that offered it (for reporting)
        self.lineage = lineage  #: the backlog it was offered in
        self.holder: str | None = None  #: the last winning claimant, until done/released
        self.done_by: str | None = None


class ClaimsState:
    """The world as the claims log says it is, after the records applied so far.

    Owned by the thread that feeds it (the consumer's user thread); no I/O, no clock.
    """

    def __init__(self, timeout_ms: int) -> None:
        if timeout_ms < 1:
            raise ValueError("timeout_ms must be >= 1")
        self.timeout_ms = timeout_ms
        #: log time: the largest record timestamp seen (it never goes back)
        self.now_ms = 0
        self.records = 0  #: records applied (understood or not)
        self._seen: dict[str, int] = {}  # member -> log time of its last record
        self._chunks: dict[ChunkKey, _Chunk] = {}  # in offer order
        # (topic, partition, lineage) -> offsets of chunks done in that lineage
        self._done: dict[tuple[str, int, str], RangeSet] = {}
        # (topic, partition, lineage) -> offsets of every chunk ever offered in it
        self._known: dict[tuple[str, int, str], RangeSet] = {}

    # -- feeding ---------------------------------------------------------------------------
    def apply(self, rec: ClaimRecord | None, timestamp_ms: int) -> None:
        """Apply the next record of the log (None: a record nobody understands)."""
        self.records += 1
        if timestamp_ms > self.now_ms:
            self.now_ms = timestamp_ms
        if rec is None:
            return
        m = rec.member
        if rec.kind == "bye":
            self._seen.pop(m, None)
            for held in self._chunks.values():
                if held.holder == m:
                    held.holder = None
            return
        self._seen[m] = self.now_ms
        lineage = rec.lineage
        if rec.kind == "offer":
            part = (rec.topic, rec.partition, lineage)
            for s, e in rec.chunks:
                key = (rec.topic, rec.partition, s, e)
                old = self._chunks.get(key)
                if old is None or old.lineage != lineage:
                    # another lineage's chunk of the same offsets: replaced, afresh (its
                    # holder, if any, has lost it; its done stays a fact of its lineage)
                    self._chunks.pop(key, None)
                    self._chunks[key] = _Chunk(m, lineage)
                    self._known.setdefault(part, RangeSet()).add(s, e)
            return
        if rec.kind == "hb" or not rec.chunks:
            return
        s, e = rec.chunks[0]
        chunk = self._chunks.get((rec.topic, rec.partition, s, e))
        if chunk is None or chunk.lineage != lineage or chunk.done_by is not None:
            return
        if rec.kind == "claim":
            if chunk.holder is None or chunk.holder == m or not self.live(chunk.holder):
                chunk.holder = m
        elif rec.kind == "done":
            if chunk.holder == m:
                chunk.done_by, chunk.holder = m, None
                self._done.setdefault((rec.topic, rec.partition, lineage), RangeSet()).add(s, e)
        elif rec.kind == "release" and chunk.holder == m:
            chunk.holder = None

    # -- questions ---------------------------------------------------------------------------
    def live(self, member: str) -> bool:
        """The log shows a record of ``member`` no older than the timeout."""
        seen = self._seen.get(member)
        return seen is not None and self.now_ms - seen <= self.timeout_ms

    def members(self) -> list[str]:
        """Members live by the log, sorted."""
        return sorted(m for m in self._seen if self.live(m))

    def holder(self, key: ChunkKey) -> str | None:
        """The chunk's live holder (None: free, done, or unknown)."""
        got = self._chunks.get(key)
        if got is None or got.holder is None or not self.live(got.holder):
            return None
        return got.holder

    def last_holder(self, key: ChunkKey) -> str | None:
        """The chunk's last winning claimant, live or not, until done or released: the
        member whose ``done`` would be accepted."""
        chunk = self._chunks.get(key)
        return chunk.holder if chunk is not None else None

    def lineage(self, key: ChunkKey) -> str | None:
        """The lineage the chunk was last offered in (None: unknown)."""
        chunk = self._chunks.get(key)
        return chunk.lineage if chunk is not None else None

    def is_done(self, key: ChunkKey) -> bool:
        chunk = self._chunks.get(key)
        return chunk is not None and chunk.done_by is not None

    def done_by(self, key: ChunkKey) -> str | None:
        chunk = self._chunks.get(key)
        return chunk.done_by if chunk is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self._chunks

    def __iter__(self) -> Iterator[ChunkKey]:
        return iter(self._chunks)

    def free(self) -> list[ChunkKey]:
        """Chunks not done with no live holder, in offer order: claimable now."""
        return [
            k
            for k, c in self._chunks.items()
            if c.done_by is None and (c.holder is None or not self.live(c.holder))
        ]

    def held_by(self, member: str) -> list[ChunkKey]:
        """Chunks whose last winning claimant is ``member`` (live or not), not done."""
        return [k for k, c in self._chunks.items() if c.holder == member and c.done_by is None]

    def open_chunks(self) -> int:
        """Chunks not done yet (free or held)."""
        return sum(1 for c in self._chunks.values() if c.done_by is None)

    def left(self, keys: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Per partition of ``keys``, its chunks not done yet (free or held)."""
        out = dict.fromkeys(keys, 0)
        for (t, p, _, _), c in self._chunks.items():
            if c.done_by is None and (t, p) in out:
                out[(t, p)] += 1
        return out

    def done(self, topic: str, partition: int, lineage: str) -> RangeSet:
        """Offsets of the partition that some member processed and committed in
        ``lineage`` (a copy): nothing for another lineage's backlog, nothing for ""."""
        got = self._done.get((topic, partition, lineage)) if lineage else None
        return got.copy() if got is not None else RangeSet()

    def done_lineages(self, topic: str, partition: int) -> dict[str, RangeSet]:
        """Per lineage, the partition's done offsets (copies)."""
        return {
            lin: got.copy()
            for (t, p, lin), got in self._done.items()
            if (t, p) == (topic, partition) and lin
        }

    def known(self, topic: str, partition: int, lineage: str) -> RangeSet:
        """Offsets covered by any chunk ever offered for the partition in ``lineage``
        (a copy)."""
        got = self._known.get((topic, partition, lineage))
        return got.copy() if got is not None else RangeSet()

    def holdings(self) -> list[tuple[ChunkKey, str | None, bool]]:
        """(chunk, last holder, holder live) for every chunk not done, in offer order."""
        return [
            (k, c.holder, c.holder is not None and self.live(c.holder))
            for k, c in self._chunks.items()
            if c.done_by is None
        ]

    def snapshot(self) -> tuple[object, ...]:
        """Everything the state holds, comparable (a replay gives an equal snapshot)."""
        return (
            self.now_ms,
            self.records,
            tuple(sorted(self._seen.items())),
            tuple((k, c.owner, c.lineage, c.holder, c.done_by) for k, c in self._chunks.items()),
            tuple(sorted((k, v.as_tuple()) for k, v in self._done.items())),
        )
