"""Config errors of parallel.rebalance.group.catchup: each must be refused clearly."""
from __future__ import annotations

from _common import BOOTSTRAP

from fastrebalance import Consumer

base = {"bootstrap.servers": BOOTSTRAP, "group.id": "g05"}
cases = {
    "without enable.parallel.rebalance": {"parallel.rebalance.group.catchup": True},
    "enable false": {"enable.parallel.rebalance": False, "parallel.rebalance.group.catchup": True},
    "with transactional": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                           "parallel.rebalance.transactional": True, "enable.auto.commit": False,
                           "isolation.level": "read_committed"},
    "catchup 'yes'": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": "yes"},
    "catchup 2": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": 2},
    "timeout 999": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                    "parallel.rebalance.group.claim.timeout.ms": 999},
    "timeout '5s'": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                     "parallel.rebalance.group.claim.timeout.ms": "5s"},
    "timeout True": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                     "parallel.rebalance.group.claim.timeout.ms": True},
    "chunk 99": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                 "parallel.rebalance.group.chunk.records": 99},
    "chunk 1.5k": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                   "parallel.rebalance.group.chunk.records": 1500.5},
    "claims topic ''": {"enable.parallel.rebalance": True, "parallel.rebalance.group.catchup": True,
                        "parallel.rebalance.group.claims.topic": "  "},
    "claims topic bad chars": {"enable.parallel.rebalance": True,
                               "parallel.rebalance.group.catchup": True,
                               "parallel.rebalance.group.claims.topic": "a b/c"},
    "claims topic = data topic? (group.id)": {"enable.parallel.rebalance": True,
                               "parallel.rebalance.group.catchup": True,
                               "parallel.rebalance.group.claims.topic": 5},
    "timeout key without catchup": {"enable.parallel.rebalance": True,
                                    "parallel.rebalance.group.claim.timeout.ms": 5000},
    "chunk key without the mode": {"parallel.rebalance.group.chunk.records": 5000},
}
for what, extra in cases.items():
    try:
        c = Consumer({**base, **extra})
    except Exception as exc:  # noqa: BLE001
        print(f"{what:45s} REFUSED {type(exc).__name__}: {str(exc)[:150]}")
    else:
        print(f"{what:45s} ACCEPTED group={getattr(c, '_group', None) is not None}")
        c.close()
