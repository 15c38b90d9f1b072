"""Done chunks that nobody absorbs: a helper leaving after their owner left.

In a rolling stop (the owner of a partition closes first, a member that read chunks of it
closes after) the helper's last ``done`` records reach the claims log when no member owns
the partition: nobody absorbs them, and the group's offset stays at the start of those
chunks although they were processed and committed (adversary of issue 32, s5: 0 and 2,000
of 10,000 in 4 of 4 runs on Apache Kafka 3.9; a plain consumer's group ends at 10,000).
Nothing is lost (the next owner absorbs them), but lag monitors and a rollback to plain
confluent-kafka see the whole backlog.

So a helper that has left the group writes the absorbed offset itself, with a commit from
outside the group (no member id, no generation): Apache Kafka accepts such a commit only
while the group has no member (classic and consumer protocol alike), i.e. when nobody
else could be writing the partition. Otherwise the broker refuses it, and the member that
owns the partition (or will) absorbs the done chunks as usual. The write is a true
statement: the group's last token, minus chunks the claims log says are done *in the
token's lineage* (a done of another lineage is about an earlier reading of those offsets,
see ``_groupcatchup``); the worst a race with a member joining meanwhile can do is write an
offset lower than that member's (records read again), never one past an unprocessed
record.

Thread ownership: the short-lived consumer here is made, used and closed by the thread
that calls ``close()`` (the user's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer as _RdConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ._claimslog import client_config
from ._commits import GroupWrite, group_write
from ._planning import restore

__all__ = ["absorb_orphans", "orphan_write"]

log = logging.getLogger("fastrebalance.group")

Key = tuple[str, int]
#: The broker's answers to a commit from outside a group that has members.
_GROUP_HAS_MEMBERS = frozenset(
    {
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.STALE_MEMBER_EPOCH,
    }
)


def orphan_write(
    offset: int,
    metadata: str | None,
    done: Mapping[str, Iterable[tuple[int, int]]],
    max_bytes: int,
) -> GroupWrite | None:
    """The group's commit of a partition once the ``done`` pieces of its token's lineage
    (``done``: per lineage) leave its pending ranges (as the owner's absorb does); None
    when none of them is pending there."""
    restored = restore(offset, metadata)
    ledger = restored.ledger()
    if ledger.position is None or not ledger.ranges or not ledger.lineage:
        return None
    before = ledger.ranges.count()
    for s, e in done.get(ledger.lineage, ()):
        if e <= ledger.position:
            ledger.ranges.remove(s, e)
    if ledger.ranges.count() == before:
        return None
    return group_write(ledger, restored.user_metadata, max_bytes)


def absorb_orphans(
    conf: Mapping[str, Any],
    orphans: Mapping[Key, Mapping[str, list[tuple[int, int]]]],
    max_bytes: int,
    timeout_s: float,
    remove_dead: Callable[[float], bool] | None = None,
) -> int:
    """Write the absorbed offsets of ``orphans`` from outside the group (see the module);
    returns how many partitions were written. Never raises for a broker's refusal.

    ``remove_dead``: when the group still has members, removes those proven dead (within
    the time it is given) and says whether it removed any; the write is then tried again.
    A member SIGKILLed while owning the partition is still listed until its session
    expires, and nobody writes the partition after that (adversary of issue 45 on Apache
    Kafka 3.9: the group's offset frozen in 8 of 14 runs until a new member started)."""
    if not orphans:
        return 0
    deadline = time.monotonic() + timeout_s
    c = _RdConsumer({**client_config(conf, "orphans"), "group.id": conf["group.id"],
                     "enable.auto.commit": False})  # fmt: skip
    try:
        tps = [TopicPartition(t, p) for t, p in orphans]
        writes = []
        for tp in c.committed(tps, timeout=max(deadline - time.monotonic(), 0.1)):
            w = orphan_write(tp.offset, tp.metadata, orphans[(tp.topic, tp.partition)], max_bytes)
            if w is not None:
                # metadata None (no token, no user string) is written as none, as by
                # confluent-kafka; TopicPartition refuses metadata=None
                if w.metadata is None:
                    writes.append(TopicPartition(tp.topic, tp.partition, w.offset))
                else:
                    writes.append(
                        TopicPartition(tp.topic, tp.partition, w.offset, metadata=w.metadata)
                    )
        while writes:
            try:
                c.commit(offsets=writes, asynchronous=False)
                written = [(w.topic, w.partition, w.offset) for w in writes]
                log.info("absorbed the done chunks of partitions no member owned: %s", written)
                return len(writes)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() not in _GROUP_HAS_MEMBERS:
                    raise
                if (
                    err.code() != KafkaError.REBALANCE_IN_PROGRESS
                    and remove_dead is not None
                    and time.monotonic() < deadline
                ):
                    removing, remove_dead = remove_dead, None  # once
                    if removing(deadline - time.monotonic()):
                        continue  # the group may be empty now (or rebalancing: waited)
                if err.code() != KafkaError.REBALANCE_IN_PROGRESS or time.monotonic() > deadline:
                    log.info("the group has members: whoever owns %s absorbs its done chunks",
                             [(w.topic, w.partition) for w in writes])  # fmt: skip
                    return 0
                time.sleep(0.2)  # the last member's leave is still completing
        return 0
    finally:
        c.close()
