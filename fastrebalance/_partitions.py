"""What this member reads, and what it handed out: the state every part of the consumer shares.

One ``Partitions`` object is handed to delivery (records in), the commit path (claims out)
and the assignment lifecycle (partitions gained and lost), as kafka-python hands one
``SubscriptionState`` to its fetcher and its coordinator. Pure state: no Kafka handle here.

Thread ownership: the user's thread's, like the handles (see ``_consumer``).
"""

from __future__ import annotations

from ._ledger import Ledger
from ._routing import Epoch, History
from ._token import ChildCheckpoint

__all__ = ["Assigned", "Key", "Partitions"]

Key = tuple[str, int]


class Assigned:
    """A partition of the current assignment, planned: what is unprocessed, what each
    stream handed out, and what the next commit owes the application."""

    __slots__ = ("checkpoint", "epoch", "ledger", "stored", "stored_as", "written")

    def __init__(self, ledger: Ledger, epoch: Epoch) -> None:
        self.ledger = ledger  #: what is unprocessed
        self.epoch = epoch  #: what both streams handed out in this assignment
        self.stored = False  #: store_offsets() claimed something not yet committed
        #: the last store_offsets(offsets=)'s offset and metadata: as librdkafka's stored
        #: offset, the next commit writes no more than it (a rewind), with its metadata
        self.stored_as: tuple[int | None, str | None] = (None, None)
        self.checkpoint: ChildCheckpoint | None = None  #: ... and this child checkpoint
        self.written: tuple[int, str | None] | None = None  #: the last group commit sent


class Partitions:
    """The partitions of this member.

    * ``assigned``: planned partitions of the current assignment;
    * ``deferred``: assigned partitions not planned yet (their commit logs could not be
      read), paused in the primary, with the offset their assignment asked for;
    * ``history``: per partition, what each stream handed out in its last assignments
      (it outlives the assignment: a late commit of a record is attributed by it);
    * ``unresolved``: assigned partitions whose primary run starts at its first record
      (OFFSET_TAIL, a logical seek, exactly-once with nothing committed);
    * ``revoked_in_call``: partitions revoked inside the primary call under way, whose
      records that call must not return.
    """

    __slots__ = ("assigned", "deferred", "history", "revoked_in_call", "unresolved")

    def __init__(self) -> None:
        self.assigned: dict[Key, Assigned] = {}
        self.deferred: dict[Key, int] = {}
        self.history: dict[Key, History] = {}
        self.unresolved: set[Key] = set()
        self.revoked_in_call: set[Key] = set()

    def open(self, key: Key, ledger: Ledger, floor: int, start: int) -> Epoch:
        """``key`` is planned and read from ``start`` (F: ``floor``): a new epoch."""
        epoch = self.history.setdefault(key, History()).begin(floor, start)
        self.revoked_in_call.discard(key)
        if epoch.unresolved:  # its first record will say where it starts
            self.unresolved.add(key)
        self.assigned[key] = Assigned(ledger, epoch)
        return epoch

    def retire(self, keys: list[Key]) -> list[Epoch]:
        """``keys`` leave the assignment; returns the epochs they close (the history of
        each stays, for late commits). Their records are not returned by the call under
        way."""
        epochs = []
        for k in keys:
            self.deferred.pop(k, None)  # never planned: nothing handed out
            a = self.assigned.pop(k, None)
            if a is None:
                continue
            a.epoch.close()
            epochs.append(a.epoch)
            self.unresolved.discard(k)
            self.revoked_in_call.add(k)
        return epochs
