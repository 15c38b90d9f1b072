"""What an open producer transaction claims, kept apart from the ledgers until it commits.

Exactly-once read-process-write (``send_offsets_to_transaction``) writes both commit
logs inside the producer's transaction: the user's group gets the safe offset and the
range token, the catch-up group the checkpoint of the backlog records the transaction
processed. The broker makes the two writes visible together with the transaction's
output records, or not at all. So the ledger may only learn the claims once the
transaction has committed: an aborted transaction's records were not processed (their
output is discarded), and claiming them would skip them for good.

The claims are therefore *staged* here, per transaction: each ``send_offsets`` computes
its writes from a view (the ledger with the transaction's earlier claims applied), and
``settle()`` applies them to the ledgers once the producer's commit returned. Pure: no
Kafka I/O, so it is property-tested on its own.
"""

from __future__ import annotations

from typing import Any

from ._commits import Change, apply_change
from ._ledger import Ledger

Key = tuple[str, int]

__all__ = ["OpenTransaction"]


class OpenTransaction:
    """The claims of one producer's open transaction, per partition, in order.

    ``producer`` is the identity of the transactional producer the claims were sent
    with: a transaction is the producer's, and claims sent with another producer
    belong to another transaction.
    """

    __slots__ = ("claims", "producer", "retired")

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        #: per partition: the ledger the claims were computed against, and the changes
        self.claims: dict[Key, tuple[Ledger, list[Change]]] = {}
        #: partitions whose stale catch-up checkpoint this transaction clears
        self.retired: set[Key] = set()

    def view(self, key: Key, ledger: Ledger) -> Ledger:
        """``ledger`` as it will be once this transaction commits, so far (a copy).

        A ledger replaced since the transaction claimed (the partition was revoked and
        assigned again, and planned anew from the logs) no longer sees those claims:
        they travel in this transaction's earlier writes, not in the new plan.
        """
        out = ledger.copy()
        staged = self.claims.get(key)
        if staged is not None and staged[0] is ledger:
            for change in staged[1]:
                apply_change(out, change)
        return out

    def stage(self, key: Key, ledger: Ledger, change: Change) -> None:
        """Remember a claim sent in this transaction (after the broker took it)."""
        staged = self.claims.get(key)
        if staged is None or staged[0] is not ledger:
            self.claims[key] = (ledger, [change])
        else:
            staged[1].append(change)

    def settle(self) -> list[Key]:
        """The transaction committed: its claims become facts of their ledgers.
        Returns the partitions whose ledger changed."""
        for ledger, changes in self.claims.values():
            for change in changes:
                apply_change(ledger, change)
        return list(self.claims)
