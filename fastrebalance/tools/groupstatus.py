"""``fastrebalance status`` for group-wide catch-up: who holds which chunk, from the claims log.

The claims topic (``<group.id>.catchup.claims``) is read from its start, from outside the
group, and interpreted by the very state machine every member runs (``_claims``): what is
shown is what the members themselves believe. A holder is shown live by the default claim
timeout (``parallel.rebalance.group.claim.timeout.ms``) unless told otherwise.

Thread ownership: the consumer made here lives and dies inside ``read_chunks()``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .._claims import ClaimsState, decode_record
from .._claimslog import client_config
from .._config import CLAIMS_TOPIC_SUFFIX, DEFAULT_CLAIM_TIMEOUT_MS

__all__ = ["format_chunks", "read_chunks"]


def read_chunks(
    bootstrap_servers: str,
    group: str,
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
    claim_timeout_ms: int = DEFAULT_CLAIM_TIMEOUT_MS,
) -> list[dict[str, Any]] | None:
    """The chunks not done yet, with their holders; None when the group has no claims
    topic (group-wide catch-up never ran)."""
    topic = group + CLAIMS_TOPIC_SUFFIX
    conf = client_config({"bootstrap.servers": bootstrap_servers, **(config or {})}, "status")
    conf.update(
        {
            "group.id": f"{topic}.status-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,  # looking never creates it
        }
    )
    c = Consumer(conf)
    try:
        md = c.list_topics(topic, timeout=timeout)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        state = ClaimsState(claim_timeout_ms)
        c.assign([TopicPartition(topic, 0, 0)])
        read, deadline = 0, time.monotonic() + timeout
        while read < high and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    read += 1
                    state.apply(decode_record(m.value()), m.timestamp()[1])
        return [
            {
                "topic": ck[0],
                "partition": ck[1],
                "start": ck[2],
                "end": ck[3],
                "holder": holder,
                "state": "free" if holder is None else "held" if live else "expired",
            }
            for ck, holder, live in state.holdings()
        ]
    except KafkaException:
        return None
    finally:
        c.close()


def format_chunks(chunks: list[dict[str, Any]], limit: int = 20) -> list[str]:
    """Lines for the human view."""
    if not chunks:
        return ["group-wide catch-up: no open chunk"]
    held = sum(1 for c in chunks if c["state"] == "held")
    lines = [f"group-wide catch-up: {len(chunks)} open chunks, {held} held"]
    for c in chunks[:limit]:
        who = c["holder"] or "-"
        span = f"[{c['start']:,}, {c['end']:,})"
        lines.append(f"  {c['topic']} [{c['partition']}] {span}  {c['state']:<7} {who}")
    if len(chunks) > limit:
        lines.append(f"  ... {len(chunks) - limit} more")
    return lines
