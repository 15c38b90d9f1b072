"""An embedded Kafka cluster (librdkafka's mock cluster) running in a child process."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import IO, Any, Literal

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    OffsetSpec,
)

_SERVER_MODULE = "fastrebalance.testing._mockcluster"
# The directory holding the ``fastrebalance`` package this module came from, so the server runs
# the same code even when the package is not installed and the caller's cwd is elsewhere.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for_partitions(
    admin: AdminClient, topic: str, partitions: int, timeout: float = 10.0
) -> None:
    """Block until metadata shows ``topic`` with ``partitions`` partitions, each with a leader.

    A created topic is not usable until the brokers advertise it; tests that produce right
    after creating would otherwise race the metadata propagation on real clusters.
    """
    deadline = time.monotonic() + timeout
    seen = "no metadata yet"
    while True:
        remaining = deadline - time.monotonic()
        try:
            found = admin.list_topics(topic, timeout=max(remaining, 0.1)).topics.get(topic)
            if found is not None and found.error is None and len(found.partitions) == partitions:
                # a real broker advertises a partition before it has elected its leader;
                # until then produce and ListOffsets fail (NOT_LEADER_FOR_PARTITION)
                leaderless = [p for p, m in found.partitions.items() if m.leader < 0]
                if not leaderless:
                    # ... and a KRaft broker serves a partition only once it has applied
                    # the leadership record it advertises: ListOffsets says when
                    unserved = _unserved(admin, topic, partitions, max(remaining, 0.1))
                    if not unserved:
                        return
                    seen = f"ListOffsets fails for partitions {unserved[:5]}"
                else:
                    seen = f"no leader yet for partitions {sorted(leaderless)[:5]}"
            elif found is None:
                seen = "absent"
            else:
                seen = f"{len(found.partitions)} partitions"
            if found is not None and found.error is not None:
                seen = f"error {found.error}"
        except KafkaException as exc:
            seen = str(exc)
        if remaining <= 0:
            raise RuntimeError(
                f"topic {topic!r} did not show {partitions} partitions within {timeout:g}s"
                f" (last seen: {seen})"
            )
        time.sleep(0.05)


def _unserved(admin: AdminClient, topic: str, partitions: int, timeout: float) -> list[int]:
    """The partitions of ``topic`` whose log end cannot be read yet."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    asked = {TopicPartition(topic, p): latest for p in range(partitions)}
    failed = []
    for tp, future in admin.list_offsets(asked, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException:
            failed.append(tp.partition)
    return sorted(failed)


def _process_state(pid: int) -> str | None:
    """The Linux scheduler state letter of ``pid`` (e.g. 'T' stopped), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _pump_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Move the server's answers to a queue so that waiting for one can time out."""
    for line in stream:
        lines.put(line)
    lines.put(None)


class EmbeddedKafka:
    """A Kafka cluster for tests: librdkafka's mock cluster, served by a child process.

    The cluster runs in its own process rather than inside the test process because the tests
    exist to kill consumers: a consumer process can be SIGKILLed while the broker and its data
    survive, and the broker itself can be SIGSTOPped (``pause()``) to simulate a hung cluster.
    The server exits when this object is closed, when its stdin pipe closes (the parent exits or
    is killed), and, on Linux, when the parent dies while the server is paused. Processes forked
    from the parent inherit the pipe, so a parent killed while forked children still run leaves
    the server alive until they exit too.

    Commands to the server are serialized with a lock, so one instance may be shared by threads.
    """

    kind: Literal["embedded"] = "embedded"

    def __init__(
        self, brokers: int = 1, *, start_timeout: float = 30.0, command_timeout: float = 10.0
    ) -> None:
        self.brokers = brokers
        self.command_timeout = command_timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._paused = False
        self._closed = False
        self._admin: AdminClient | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        # A file, not a pipe: librdkafka logs to stderr and nobody drains it until a failure.
        # It lives as long as the server, so close() closes it rather than a with block.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115

        args = [sys.executable, "-m", _SERVER_MODULE, "--brokers", str(brokers)]
        if threading.current_thread() is threading.main_thread():
            args += ["--parent-pid", str(os.getpid())]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        started = time.monotonic()
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        threading.Thread(
            target=_pump_lines,
            args=(self._proc.stdout, self._lines),
            name=f"embedded-kafka-{self._proc.pid}",
            daemon=True,
        ).start()
        try:
            ready = self._next_message(start_timeout, "to start")
        except BaseException:
            self._terminate()
            raise
        self.startup_seconds = time.monotonic() - started
        self.bootstrap_servers: str = ready["bootstrap_servers"]
        self.pid: int = ready["pid"]
        self.c_api: bool = ready["c_api"]
        self.c_api_error: str | None = ready.get("c_api_error")

    def _server_stderr(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().strip() or "(empty)"
        except (OSError, ValueError):
            return "(unavailable)"

    def _next_message(self, timeout: float, waiting_for: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"embedded Kafka server (pid {self._proc.pid}) took over {timeout:g}s"
                f" {waiting_for}; its stderr: {self._server_stderr()}"
            ) from None
        if line is None:
            self._lines.put(None)  # keep reporting the death to later callers
            code = self._proc.wait()
            raise RuntimeError(
                f"embedded Kafka server (pid {self._proc.pid}) exited with code {code} while"
                f" waiting {waiting_for}; its stderr: {self._server_stderr()}"
            )
        message: dict[str, Any] = json.loads(line)
        return message

    def _command(self, op: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._paused:
                raise RuntimeError(f"{self!r} is paused; resume() it before sending {op!r}")
            request_id = next(self._ids)
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps({"op": op, "id": request_id, **fields}) + "\n")
                self._proc.stdin.flush()
            except OSError:
                pass  # the server died; reading its end of stdout reports how, with its stderr
            deadline = time.monotonic() + self.command_timeout
            while True:
                answer = self._next_message(
                    max(deadline - time.monotonic(), 0.0), f"for an answer to {op!r}"
                )
                # Skip answers to earlier commands that timed out.
                if answer.get("id") == request_id:
                    return answer

    def _check(self, op: str, **fields: Any) -> None:
        answer = self._command(op, **fields)
        if not answer.get("ok"):
            raise RuntimeError(f"{op} {fields} failed: {answer.get('error')}")

    def _admin_client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
            return self._admin

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` and wait until metadata shows it.

        The mock broker does not implement the CreateTopics admin request, hence the server.
        """
        answer = self._command("create_topic", topic=name, partitions=partitions)
        if not answer.get("ok"):
            raise RuntimeError(
                f"could not create topic {name!r} with {partitions} partitions:"
                f" {answer.get('error')}"
            )
        wait_for_partitions(self._admin_client(), name, partitions, self.command_timeout)

    def ping(self) -> None:
        """Round-trip the command pipe; proves the server process is alive and not paused."""
        self._check("ping")

    def broker_down(self, broker_id: int = 1) -> None:
        """Disconnect clients from ``broker_id`` and refuse new connections (-1: all brokers)."""
        self._check("broker_down", broker=broker_id)

    def broker_up(self, broker_id: int = 1) -> None:
        """Accept connections on ``broker_id`` again (-1: all brokers)."""
        self._check("broker_up", broker=broker_id)

    def broker_rtt(self, broker_id: int = 1, ms: int = 0) -> None:
        """Delay every response of ``broker_id`` by ``ms`` milliseconds (-1: all brokers)."""
        self._check("broker_rtt", broker=broker_id, ms=ms)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing is answered; data survives."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            os.kill(self.pid, signal.SIGSTOP)
            self._paused = True
            # SIGSTOP is delivered asynchronously; return once it is effective so callers can
            # assert on a hung broker.
            deadline = time.monotonic() + 2.0
            while _process_state(self.pid) not in ("T", None) and time.monotonic() < deadline:
                time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT the server after ``pause()``."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            os.kill(self.pid, signal.SIGCONT)
            self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def _terminate(self, timeout: float = 5.0) -> None:
        if self._paused:
            os.kill(self._proc.pid, signal.SIGCONT)  # a stopped process never sees EOF
            self._paused = False
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:  # broken pipe: the server is already gone
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the server (closing its stdin), killing it if it lingers past ``timeout``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._admin = None  # before the broker goes, or it logs connection errors forever
            self._terminate(timeout)

    def __enter__(self) -> EmbeddedKafka:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "paused" if self._paused else "running"
        servers = getattr(self, "bootstrap_servers", "?")
        return (
            f"EmbeddedKafka(bootstrap_servers={servers!r}, pid={self._proc.pid},"
            f" brokers={self.brokers}, c_api={getattr(self, 'c_api', None)}, {state})"
        )
