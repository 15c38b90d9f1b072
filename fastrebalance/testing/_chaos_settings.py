"""What one chaos run is (``_chaos``): its settings, and the names of its faults and of
its worker behaviours, which the command line, the injector and the workers share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ALL_FAULTS",
    "ALL_WORKER_MODES",
    "BROKER_FAULTS",
    "KILL_FAULTS",
    "OUTPUT_SUFFIX",
    "WORKER_MODES",
    "ChaosSettings",
    "parse_duration",
]

#: Every fault the injector knows, by name (the summary counts them by these names).
ALL_FAULTS: tuple[str, ...] = (
    "kill",  # SIGKILL at a random moment, restart
    "kill_catchup",  # the worker SIGKILLs itself halfway through a batch of backlog records
    "kill_commit",  # the worker SIGKILLs itself while its commit is in flight
    "kill_young",  # restart, then SIGKILL again while it joins / plans / starts its child
    "stop",  # SIGSTOP past session.timeout.ms and max.poll.interval.ms, then SIGCONT
    "restart",  # SIGTERM (clean close), start again
    "add",  # a new member joins
    "remove",  # a member leaves cleanly for good
    "broker_pause",  # SIGSTOP the broker process, SIGCONT a few seconds later
    "broker_restart",  # stop a real broker of the run's own, start it again on its data
)
#: Faults done to the broker, and what a cluster must offer for each (others skip them).
BROKER_FAULTS: dict[str, str] = {"broker_pause": "pause", "broker_restart": "restart"}
KILL_FAULTS: tuple[str, ...] = ("kill", "kill_catchup", "kill_commit", "kill_young")
#: The eos workers' output topic: the input topic's name with this suffix.
OUTPUT_SUFFIX = "-out"
#: The worker behaviours (``_crashworker --mode``), drawn at random per process.
WORKER_MODES: tuple[str, ...] = ("inorder", "async")
#: Every worker behaviour: ``eos`` (read-process-write in producer transactions, checked
#: exactly once in the output topic) runs alone, and only on a broker that stores
#: transactional offsets.
ALL_WORKER_MODES: tuple[str, ...] = (*WORKER_MODES, "eos")


@dataclass
class ChaosSettings:
    """One chaos run. Times in seconds unless the name says ms."""

    duration_s: float = 120.0
    seed: int | None = None  #: None: a fresh random seed (printed)
    workers: int = 3  #: members at the start
    min_workers: int = 1  #: "remove" never goes below this
    max_workers: int = 5  #: "add" never goes above this
    partitions: int = 4
    rate: float = 1000.0  #: records produced per second
    protocol: str = "cooperative"  #: classic | cooperative | consumer (KIP-848)
    threshold: int = 20  #: parallel.rebalance.lag.threshold of the workers
    work_us: int = 250  #: simulated work per record, microseconds
    faults: tuple[str, ...] = ALL_FAULTS
    min_faults: int = 20  #: keep injecting past duration_s until this many (bounded)
    #: pause between two faults; a classic-protocol group needs seconds to settle after each
    fault_gap_s: tuple[float, float] = (2.5, 6.5)
    warmup_timeout_s: float = 60.0  #: wait for every partition's first commit before faults
    session_timeout_ms: int = 6000
    max_poll_interval_ms: int = 7000
    broker_pause_s: tuple[float, float] = (1.0, 6.0)
    sample_interval_s: float = 0.5
    drain_timeout_s: float = 180.0  #: a drain with no progress this long fails
    linger_ms: int = 5
    compression: str = "lz4"
    bootstrap_servers: str | None = None  #: None: start an embedded cluster
    #: with no bootstrap: a Kafka distribution (bin/kafka-up) to start a real broker of the
    #: run's own from, which it may pause and restart; None: the embedded cluster
    kafka_home: Path | None = None
    workdir: Path | None = None  #: None: a temporary directory (kept, its path is printed)
    modes: tuple[str, ...] = WORKER_MODES  #: worker behaviours, one drawn per process
    cpu_hog: int = 0  #: busy processes running beside the whole run (a loaded machine)
    #: keep injecting past duration_s until every fault kind was injected once (bounded)
    every_fault: bool = False
    socket_timeout_ms: int = 60000  #: the workers' socket.timeout.ms (their time bounds)
    worker_args: tuple[str, ...] = ()  #: more _crashworker arguments (tests of the harness)

    @property
    def eos(self) -> bool:
        return "eos" in self.modes

    def validate(self) -> None:
        unknown = sorted(set(self.faults) - set(ALL_FAULTS))
        if unknown:
            raise ValueError(f"unknown faults {unknown}: choose from {', '.join(ALL_FAULTS)}")
        bad = sorted(set(self.modes) - set(ALL_WORKER_MODES))
        if bad or not self.modes:
            raise ValueError(
                f"worker modes {bad or '()'}: choose from {', '.join(ALL_WORKER_MODES)}"
            )
        if "eos" in self.modes and set(self.modes) != {"eos"}:
            raise ValueError(
                "eos workers run alone: a record another kind of worker processes has no "
                "output, and the output is what the eos check reads"
            )
        if self.cpu_hog < 0:
            raise ValueError("cpu_hog must be >= 0")
        if not 1 <= self.min_workers <= self.workers <= self.max_workers:
            raise ValueError("need 1 <= min_workers <= workers <= max_workers")
        if self.protocol not in ("classic", "cooperative", "consumer"):
            raise ValueError(f"protocol {self.protocol!r}: classic, cooperative or consumer")
        if self.max_poll_interval_ms < self.session_timeout_ms:
            raise ValueError("max_poll_interval_ms must be >= session_timeout_ms (librdkafka)")


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h', '1h30m' -> seconds. Why not plain seconds: soaks are long."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
