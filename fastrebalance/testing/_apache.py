"""A real Apache Kafka broker of a test's own, started from a local Kafka distribution.

The suite runs against a real broker with ``FASTREBALANCE_TEST_BOOTSTRAP``, but a test that
pauses or stops the broker must not do it to the one every other test shares. Such a test gets
a broker of its own: this one when a Kafka distribution with the project's ``kafka-up`` /
``kafka-down`` scripts is at hand (``FASTREBALANCE_KAFKA_HOME``, or ``../shared/kafka`` beside
the checkout), on a free port, with its data in a temporary folder.

It offers what the embedded cluster offers for fault injection, with real-broker meaning:
``pause()``/``resume()`` SIGSTOP and SIGCONT the broker's JVM (connections stay open, nothing is
answered), ``broker_down()``/``broker_up()`` stop it and start it again on the same data (clients
see refused connections meanwhile).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

__all__ = ["KAFKA_HOME_ENV", "ApacheKafka", "kafka_home"]

KAFKA_HOME_ENV = "FASTREBALANCE_KAFKA_HOME"

# fastrebalance/testing/_apache.py -> the checkout's parent, where ``shared/`` lies in this
# project's layout
_BESIDE_CHECKOUT = Path(__file__).resolve().parents[3] / "shared" / "kafka"


def kafka_home() -> Path | None:
    """The Kafka distribution to start brokers from, or None when there is none at hand."""
    raw = os.environ.get(KAFKA_HOME_ENV, "").strip()
    candidates = [Path(raw)] if raw else [_BESIDE_CHECKOUT]
    for home in candidates:
        if (home / "bin" / "kafka-up").is_file() and shutil.which("java"):
            return home
    return None


def _free_port_pair() -> int:
    """A port P with P+1 free too (kafka-up puts the KRaft controller on P+1), below the
    ephemeral range: a broker restarted on its ports must find them free again, and an
    ephemeral port may meanwhile be the local end of some client's connection."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        try:
            for candidate in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1 between 20000 and 32000")


def _process_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class ApacheKafka:
    """A single-node Apache Kafka (KRaft) started with ``kafka-up``; ``close()`` wipes it."""

    kind: Literal["apache"] = "apache"

    def __init__(self, home: Path | None = None, *, timeout: float = 30.0) -> None:
        found = home or kafka_home()
        if found is None:
            raise RuntimeError(
                f"no Kafka distribution: set {KAFKA_HOME_ENV} to a folder with bin/kafka-up"
            )
        self.home = found
        self.timeout = timeout
        self._lock = threading.Lock()
        self._paused = False
        self._closed = False
        self._admin: AdminClient | None = None
        # A start can fail on a loaded machine (kafka-up waits 60 s) or lose its port to
        # another process meanwhile: a few tries, each on a fresh port and folder.
        for attempt in range(3):
            self.port = _free_port_pair()
            self.dir = Path(tempfile.mkdtemp(prefix=f"fastrebalance-kafka-{self.port}-"))
            try:
                self.bootstrap_servers = self._up()
                break
            except RuntimeError:
                self._script("kafka-down", "--wipe")
                shutil.rmtree(self.dir, ignore_errors=True)
                if attempt == 2:
                    raise

    # -- lifecycle ----------------------------------------------------------------------
    def _script(self, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.home / "bin" / name), str(self.port), str(self.dir), *extra],
            capture_output=True,
            text=True,
            timeout=self.timeout + 60,
            check=False,
        )

    def _up(self) -> str:
        done = self._script("kafka-up")
        if done.returncode != 0:
            raise RuntimeError(f"kafka-up failed on port {self.port}: {done.stderr.strip()}")
        bootstrap = done.stdout.strip().splitlines()[-1]
        # kafka-up returns once the broker serves; its group coordinator takes a moment more
        # (a commit right after answers NOT_COORDINATOR): an offset fetch waits for it
        probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "fastrebalance-probe"})
        try:
            probe.committed([TopicPartition("fastrebalance-probe", 0)], timeout=self.timeout)
        except KafkaException:
            pass  # the test that needs it will say what is wrong
        finally:
            probe.close()
        return bootstrap

    def _running(self) -> bool:
        """The broker process of the pid file is alive (kafka-up leaves the file of a start
        that failed)."""
        try:
            os.kill(self.pid, 0)
        except (OSError, ValueError):
            return False
        return _process_state(self.pid) not in ("Z", None)

    @property
    def pid(self) -> int:
        return int((self.dir / "broker.pid").read_text().strip())

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        return self._admin

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from fastrebalance.testing._clusters import _admin_create_topic

        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        _admin_create_topic(self._admin_client(), name, partitions, 1, self.timeout)

    # -- faults -------------------------------------------------------------------------
    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing is answered."""
        with self._lock:
            pid = self.pid
            os.kill(pid, signal.SIGSTOP)
            self._paused = True
            deadline = time.monotonic() + 2.0
            while _process_state(pid) not in ("T", None) and time.monotonic() < deadline:
                time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT the broker, and return once it can host a new partition again: stopped
        past its heartbeat, a KRaft broker is fenced by its own controller for a moment
        ("All brokers are currently fenced" to a CreateTopics right after)."""
        with self._lock:
            if not self._paused:
                return
            os.kill(self.pid, signal.SIGCONT)
            self._paused = False
        self._wait_unfenced()

    def _wait_unfenced(self) -> None:
        deadline = time.monotonic() + self.timeout
        probe = [NewTopic(f"fastrebalance-probe-{self.port}", 1, 1)]
        while True:
            future = self._admin_client().create_topics(
                probe, validate_only=True, request_timeout=5.0
            )[probe[0].topic]
            try:
                future.result(10)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    return  # the test that needs it will say what is wrong
                time.sleep(0.2)

    @property
    def paused(self) -> bool:
        return self._paused

    def broker_down(self, broker_id: int = 1) -> None:
        """Stop the broker (its data stays): clients get refused connections."""
        del broker_id  # one broker
        with self._lock:
            if self._paused:
                os.kill(self.pid, signal.SIGCONT)
                self._paused = False
            self._admin = None  # or it logs refused connections until the broker is back
            if self._running():
                self._script("kafka-down")

    def broker_up(self, broker_id: int = 1) -> None:
        """Start the broker again on the same data, if it is down; returns once it serves
        (a few tries: the ports of the process just stopped may take a moment to free)."""
        del broker_id
        with self._lock:
            for attempt in range(5):
                if self._running():
                    return
                try:
                    self._up()
                    return
                except RuntimeError:
                    if attempt == 4:
                        raise
                    time.sleep(2.0)

    def restart(self) -> None:
        """Stop the broker and start it again on its data (see broker_down/broker_up)."""
        self.broker_down()
        self.broker_up()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._admin = None
            if self._paused:
                os.kill(self.pid, signal.SIGCONT)
            self._script("kafka-down", "--wipe")
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
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
        return f"ApacheKafka(bootstrap_servers={self.bootstrap_servers!r}, {state})"
