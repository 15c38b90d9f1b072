"""The benchmark runner that ``bench``, ``bench-scale`` and ``bench-spark`` share.

* ``Session``: the cluster a benchmark runs on (given, named, or an embedded one started
  for it), a probe for watermarks, and the topics and groups it makes, deleted at the end
  from a cluster the user named;
* ``Worker``: a measured consumer in a fresh interpreter, so that its peak RSS is its own
  and no earlier run's garbage or threads slow it; ``worker_main`` is the other end;
* ``alternate``: the pairing of plain and fastrebalance over repetitions, each taking its
  turn to go first, so that neither always runs on a machine the other just warmed up;
* the report's pieces: medians, ratios, Markdown tables, the machine line.

Thread ownership: the session's probe belongs to the thread that entered it; a worker's
pump threads touch no Kafka handle.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from typing import IO, Any, TypeVar

from confluent_kafka import Consumer as PlainConsumer

from ..testing._workload import check_reachable, cleanup

Out = Callable[[str], None]
PLAIN, FAST = "plain", "fastrebalance"
#: Run this very package in the workers even when it is not installed (a checkout).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quiet(_line: str) -> None:
    pass


# ------------------------------------------------------------------------------ cluster
class Session:
    """A benchmark's cluster and what it leaves there (a context manager).

    Args:
        name: names its topics ``fastrebalance-NAME-RUN...`` and groups ``NAME-RUN-...``.
        bootstrap_servers: a cluster the user named; None starts an embedded one.
        cluster: a running ``KafkaCluster`` (tests pass theirs), which wins.
        out: told when an embedded cluster starts; None says nothing.
    """

    def __init__(
        self, name: str, bootstrap_servers: str | None = None, cluster: Any = None,
        out: Out | None = print,
    ) -> None:  # fmt: skip
        self.name, self.run_id = name, uuid.uuid4().hex[:8]
        self.cluster, self._bootstrap, self._out = cluster, bootstrap_servers, out or quiet
        self.topics: list[str] = []
        self.groups: list[str] = []
        self.began = time.monotonic()
        self._stack = ExitStack()
        self._owned_external = cluster is None and bool(bootstrap_servers)

    def __enter__(self) -> Session:
        from ..testing import EmbeddedKafka, ExternalKafka

        self._load_start = loadavg()
        if self.cluster is None:
            if self._bootstrap:
                self.cluster = self._stack.enter_context(ExternalKafka(self._bootstrap))
            else:
                self._out("starting an embedded Kafka (librdkafka's mock cluster)...")
                self.cluster = self._stack.enter_context(EmbeddedKafka())
        self.bootstrap: str = self.cluster.bootstrap_servers
        self.description = f"{self.cluster.kind} cluster at {self.bootstrap}"
        check_reachable(self.bootstrap)
        group = f"{self.name}-{self.run_id}-p"
        self.probe = PlainConsumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        self._stack.callback(self.probe.close)
        return self

    def __exit__(self, *_: Any) -> None:
        # Also after Ctrl-C or an error: the help of every command promises the cleanup.
        try:
            if self._owned_external and (self.topics or self.groups):
                cleanup(self.bootstrap, self.topics, self.groups)
        finally:
            self._stack.close()

    def later(self, action: Callable[[], Any]) -> None:
        """Run ``action`` when the session ends (before the probe and the cluster close)."""
        self._stack.callback(action)

    def topic(self, suffix: str, partitions: int) -> str:
        name = f"fastrebalance-{self.name}-{self.run_id}{suffix}"
        self.cluster.create_topic(name, partitions)
        self.topics.append(name)
        return name

    def group(self, name: str) -> str:
        """A new group id (and its catch-up group, both deleted at the end)."""
        group = f"{self.name}-{self.run_id}-{name}"
        self.groups += [group, f"{group}.catchup"]
        return group

    def machine(self) -> dict[str, Any]:
        """``machine_info()`` with the load average at the start and now."""
        return {**machine_info(), "loadavg_start": self._load_start, "loadavg_end": loadavg()}

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.began


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: reported with them, since the machine is shared."""
    import confluent_kafka

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "platform": platform.platform(terse=True),
    }


def loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def machine_line(machine: dict[str, Any], cluster: str) -> str:
    m = machine
    load = " → ".join(
        ", ".join(f"{x:.2f}" for x in la)
        for la in (m.get("loadavg_start"), m.get("loadavg_end"))
        if la
    )
    return (
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['platform']}, Python {m['python']},"
        f" confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']};"
        f" load average (1, 5, 15 min) {load}. Cluster: {cluster}."
    )


# ------------------------------------------------------------------------------ workers
class Worker:
    """One worker process (``python -m MODULE --worker``): a JSON spec and then commands
    in, one a line; JSON events out, which a pump thread queues so that waiting for one
    can time out. ``worker_main`` runs in the worker."""

    def __init__(self, module: str, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.kind = spec.get("kind", "?")
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.send(json.dumps(spec))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put(None)

    def _drain_stderr(self) -> None:
        # librdkafka logs to stderr; kept (the tail) for the error message only
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)
            del self._err[:-40]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event; None when none came within ``timeout``. Raises if it died."""
        try:
            event = self.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if event is None:
            self.events.put(None)
            code = self.proc.wait()
            raise RuntimeError(
                f"benchmark worker {self.proc.pid} ({self.kind}) exited with code {code}: "
                + ("".join(self._err[-15:]).strip() or "(no stderr)")
            )
        return event

    def wait_for(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(deadline - time.monotonic())
            if event is None:
                raise RuntimeError(
                    f"benchmark worker {self.proc.pid} ({self.kind}): no {name!r} in {timeout:g}s"
                )
            if event.get("event") == name:
                return event

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_worker(module: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One worker from its spec to its result."""
    worker = Worker(module, spec)
    try:
        result: dict[str, Any] = worker.wait_for("result", timeout)["result"]
        return result
    finally:
        worker.close()


R = TypeVar("R")


def revive(cls: type[R], fields: dict[str, Any]) -> R:
    """A result dataclass from a worker's JSON. JSON has no tuples and the results are
    frozen dataclasses of tuples: every list comes back as a tuple, nested ones too."""

    def back(value: Any) -> Any:
        return tuple(back(v) for v in value) if isinstance(value, list) else value

    return cls(**{name: back(value) for name, value in fields.items()})


WorkerKind = Callable[[dict[str, Any], "queue.Queue[str]"], dict[str, Any]]
#: A worker still running this long after its parent went away exits: a recovery run
#: reads no command and would otherwise go on to its run timeout (minutes).
_ORPHAN_GRACE_S = 10.0


def worker_main(kinds: dict[str, WorkerKind]) -> int:
    """A worker process's life: read the spec, run its kind (which may wait for more
    commands on the queue), write the result. Only as ``python -m MODULE --worker``: run
    by hand, the module says what it is instead of exiting 0 having done nothing."""
    if sys.argv[1:] != ["--worker"]:
        print("this module is a benchmark's worker process (--worker), started by the "
              "fastrebalance command; see fastrebalance --help", file=sys.stderr)  # fmt: skip
        return 2
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=_commands, args=(sys.stdin, commands), name="commands", daemon=True
    ).start()
    spec = json.loads(commands.get())
    emit({"event": "result", "result": kinds[spec["kind"]](spec, commands)})
    return 0


def _commands(stream: IO[str], into: queue.Queue[str]) -> None:
    """The parent's commands, one a line (this thread touches no Kafka handle). End of
    input means the parent is gone: members finish on "eof"; whatever still runs after
    ``_ORPHAN_GRACE_S`` is ended."""
    for line in stream:
        into.put(line.strip())
    into.put("eof")
    time.sleep(_ORPHAN_GRACE_S)
    os._exit(3)


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def memory_kib(field: str = "VmRSS") -> int:
    """This process's resident set (``VmRSS``) or its peak (``VmHWM``), KiB.

    VmHWM, not ru_maxrss, for the peak: Linux carries ru_maxrss over an exec from the
    forked copy of the parent, so every worker would report at least the parent's size.
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS


# ---------------------------------------------------------------------- pairing, report
def alternate(items: Sequence[str], turn: int) -> list[str]:
    """Rotate who goes first each turn, so neither consumer always runs on the machine
    the other one just warmed up (or just loaded)."""
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


def median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def maximum(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


T = TypeVar("T")
#: A report column: its header, and how an item's cell is written.
Column = tuple[str, Callable[[T], str]]


def table(columns: Sequence[Column[T]], items: Iterable[T], left: int = 1) -> list[str]:
    """A Markdown table with a row per item: each header stands beside what fills it."""
    rows = [[cell(item) for _, cell in columns] for item in items]
    return md_table([header for header, _ in columns], rows, left)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """A Markdown table; the first ``left`` columns left-aligned, the others right."""
    align = ["---"] * min(left, len(header)) + ["--:"] * max(0, len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
