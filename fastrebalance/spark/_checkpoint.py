"""Where a Structured Streaming checkpoint says a Kafka query stands: for moving a query from
Spark's ``format("kafka")`` to this source, and back.

Spark's offset log (``<checkpoint>/offsets/<batch id>``) is text: a version line (``v1``), a
line of metadata (watermark, batch time, confs), then one line per source with the offset
the batch *ends* at; ``<checkpoint>/commits/<batch id>`` exists once the batch's output is
committed. Spark's Kafka source writes ``{"topic": {"0": 123, "1": 456}}``: per partition the
next offset to read. This source writes the same, except that a partition with backlog still
pending is a list (``[next, [start, end], ...]``, docs/spark.md).

So the records a stopped query has done with are those below the end of its last committed
batch; a batch logged but not committed is replayed by Spark, so it counts as not read. Pure
file reading: no Spark, no Kafka (the CLI and the ``startingOffsetsFromCheckpoint`` option
use it, and the tests write checkpoints in the documented format).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CheckpointOffsets", "read_checkpoint"]

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class CheckpointOffsets:
    """Per partition, the first offset the checkpoint's query has not read."""

    kind: str  #: "kafka" (Spark's Kafka source) or "fastrebalance"
    batch: int  #: the last committed batch
    offsets: dict[TopicPartitionKey, int]
    #: fastrebalance only: records above those offsets that it had read already (backlog
    #: still pending below records it read): a start from ``offsets`` reads them again
    reread: int = 0

    def starting_offsets(self) -> str:
        """``startingOffsets`` JSON for either source, in a fixed order."""
        out: dict[str, dict[str, int]] = {}
        for (topic, p), offset in sorted(self.offsets.items()):
            out.setdefault(topic, {})[str(p)] = offset
        return json.dumps(out)


def _batch_ids(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit())


def _local(path: str) -> Path:
    if path.startswith("file:"):
        path = path[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
    elif "://" in path:
        raise ValueError(
            f"checkpoint {path!r}: only a local (or mounted) path can be read here; copy its"
            " offsets/ and commits/ folders to one"
        )
    return Path(path)


def read_checkpoint(path: str) -> CheckpointOffsets:
    """The offsets of the last committed batch of a one-source checkpoint."""
    root = _local(path)
    offsets = root / "offsets"
    committed = set(_batch_ids(root / "commits"))
    done = [b for b in _batch_ids(offsets) if b in committed]
    if not done:
        raise ValueError(
            f"checkpoint {path!r} has no committed batch (no offsets/N with a commits/N):"
            " nothing to start from"
        )
    batch = done[-1]
    lines = (offsets / str(batch)).read_text().splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise ValueError(f"{offsets / str(batch)} is not a Spark offset log entry")
    sources = lines[2:]
    if len(sources) != 1:
        raise ValueError(
            f"{offsets / str(batch)} holds {len(sources)} sources: only a query with one"
            " Kafka source can be moved (name the offsets with startingOffsets instead)"
        )
    try:
        obj: Any = json.loads(sources[0])
    except ValueError:
        raise ValueError(f"{offsets / str(batch)}: the source's offset is not JSON") from None
    if not isinstance(obj, dict) or any(str(k).startswith("@") for k in obj):
        raise ValueError(
            f"{offsets / str(batch)}: not a Kafka offset ({sources[0][:80]}): a query's first"
            " batch of this source; let it commit a second batch first"
        )
    out: dict[TopicPartitionKey, int] = {}
    reread = 0
    kind = "kafka"
    for topic, parts in obj.items():
        if not isinstance(parts, dict):
            raise ValueError(f"{offsets / str(batch)}: topic {topic!r} has no partition map")
        for p, value in parts.items():
            tp = (str(topic), int(p))
            if isinstance(value, int):
                out[tp] = value
                continue
            # this source's partition with pending backlog: [next, [start, end], ...]
            kind = "fastrebalance"
            nxt, *ranges = value
            low = min([int(nxt), *(int(r[0]) for r in ranges)])
            pending = sum(int(r[1]) - int(r[0]) for r in ranges)
            out[tp] = low
            reread += int(nxt) - low - pending
    if kind == "kafka" and _looks_like_ours(root):
        kind = "fastrebalance"
    return CheckpointOffsets(kind, batch, out, reread)


def _looks_like_ours(root: Path) -> bool:
    """Without pending ranges the two sources' offsets look alike; batch 0 tells them apart
    (this source keeps ``@from`` there, docs/spark.md, "The initial offset")."""
    first = root / "offsets" / "0"
    try:
        line = first.read_text().splitlines()[2]
    except (OSError, IndexError):
        return False
    return '"@from"' in line
