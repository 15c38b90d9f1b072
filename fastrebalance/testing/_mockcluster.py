"""Embedded Kafka server process: librdkafka's mock cluster behind a JSON-lines pipe.

Run as ``python -m fastrebalance.testing._mockcluster --brokers N``; ``EmbeddedKafka`` does
that for you. The cluster lives only as long as this process, so it runs apart from the
processes under test: they can be SIGKILLed without taking the broker with them, and the broker
can be SIGSTOPped to simulate a hung cluster.

Protocol: one JSON line on stdout when ready,
``{"bootstrap_servers": "...", "pid": N, "c_api": bool, "brokers": N}``, then one JSON answer
line (``{"ok": true}`` or ``{"ok": false, "error": "..."}``, echoing any ``"id"``) for each
JSON command line read from stdin: ``create_topic`` (``topic``, ``partitions``), ``ping``,
``broker_down`` / ``broker_up`` (``broker``), ``broker_rtt`` (``broker``, ``ms``). The server
exits on stdin EOF, which is what happens when its parent closes the pipe or dies.

The C mock API (``rdkafka_mock.h``) is preferred because it is the only way to create topics
with an exact partition count, to make the first group join immediate, and to inject faults.
It is an experimental librdkafka API, so when the symbols are missing (a confluent-kafka built
against a system librdkafka) the server falls back to ``test.mock.num.brokers`` on a Producer,
which can only offer auto-created 4-partition topics. Setting ``FASTREBALANCE_MOCK_C_API=0``
forces that fallback, so it can be tested.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os
import signal
import sys
from ctypes import c_char_p, c_int, c_int32, c_size_t, c_void_p
from typing import Any

RD_KAFKA_PRODUCER = 0
KIP848_SESSION_TIMEOUT_MS = 6000
KIP848_HEARTBEAT_INTERVAL_MS = 1000
FALLBACK_PARTITIONS = 4

# restype, argtypes. Every pointer is c_void_p: the default int restype would truncate
# 64-bit pointers.
_REQUIRED: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_conf_new": (c_void_p, []),
    "rd_kafka_conf_destroy": (None, [c_void_p]),
    "rd_kafka_conf_set": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_size_t]),
    "rd_kafka_new": (c_void_p, [c_int, c_void_p, c_char_p, c_size_t]),
    "rd_kafka_err2str": (c_char_p, [c_int]),
    "rd_kafka_mock_cluster_new": (c_void_p, [c_void_p, c_int]),
    "rd_kafka_mock_cluster_bootstraps": (c_char_p, [c_void_p]),
    "rd_kafka_mock_topic_create": (c_int, [c_void_p, c_char_p, c_int, c_int]),
    "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [c_void_p, c_int32]),
    "rd_kafka_mock_broker_set_down": (c_int, [c_void_p, c_int32]),
    "rd_kafka_mock_broker_set_up": (c_int, [c_void_p, c_int32]),
    "rd_kafka_mock_broker_set_rtt": (c_int, [c_void_p, c_int32, c_int]),
}
# Newer than the rest of the mock API (KIP-848 groups); older librdkafkas work without them.
_OPTIONAL: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_mock_set_group_consumer_session_timeout_ms": (None, [c_void_p, c_int]),
    "rd_kafka_mock_set_group_consumer_heartbeat_interval_ms": (None, [c_void_p, c_int]),
}


def _library_candidates() -> list[str]:
    """The wheel's own librdkafka first, so the mock matches what the clients link against."""
    paths: list[str] = []
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is not None and spec.origin:
        package_dir = os.path.dirname(spec.origin)
        site_dir = os.path.dirname(package_dir)
        for pattern in (
            os.path.join(site_dir, "confluent_kafka.libs", "librdkafka*.so*"),  # Linux wheels
            os.path.join(package_dir, ".dylibs", "librdkafka*.dylib"),  # macOS wheels
        ):
            paths += sorted(glob.glob(pattern))
    system = ctypes.util.find_library("rdkafka")
    if system:
        paths.append(system)
    return paths


class CMockCluster:
    """The mock cluster driven through the C API: exact partition counts and fault injection."""

    c_api = True

    def __init__(self, lib: ctypes.CDLL, brokers: int) -> None:
        for name, (restype, argtypes) in {**_REQUIRED, **_OPTIONAL}.items():
            if name in _OPTIONAL and not hasattr(lib, name):
                continue
            func = getattr(lib, name)  # AttributeError: the caller falls back
            func.restype, func.argtypes = restype, argtypes
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # Keep stderr for real problems: without this the handle logs a notice that it has no
        # bootstrap.servers, which would then head every "server died" error message.
        lib.rd_kafka_conf_set(conf, b"log_level", b"4", errstr, len(errstr))
        # The handle is only bookkeeping for the cluster; it is never polled nor destroyed,
        # because the process ends with the cluster.
        self._rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._rk:
            lib.rd_kafka_conf_destroy(conf)
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._mc:
            raise RuntimeError("rd_kafka_mock_cluster_new returned NULL")
        # Defaults tuned for tests: the 3 s initial rebalance delay would slow every first join,
        # and the mock's 30 s KIP-848 session timeout would make crash tests crawl.
        lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self._mc, 0)
        if hasattr(lib, "rd_kafka_mock_set_group_consumer_session_timeout_ms"):
            lib.rd_kafka_mock_set_group_consumer_session_timeout_ms(
                self._mc, KIP848_SESSION_TIMEOUT_MS
            )
        if hasattr(lib, "rd_kafka_mock_set_group_consumer_heartbeat_interval_ms"):
            lib.rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(
                self._mc, KIP848_HEARTBEAT_INTERVAL_MS
            )
        self.bootstrap_servers: str = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()

    def _check(self, err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"{what}: {self._lib.rd_kafka_err2str(err).decode()}")

    def create_topic(self, topic: str, partitions: int) -> None:
        err = self._lib.rd_kafka_mock_topic_create(self._mc, topic.encode(), partitions, 1)
        self._check(err, f"creating topic {topic!r}")

    def broker_down(self, broker: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._mc, broker), "broker_down")

    def broker_up(self, broker: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._mc, broker), "broker_up")

    def broker_rtt(self, broker: int, ms: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_rtt(self._mc, broker, ms), "broker_rtt")


class ProducerMockCluster:
    """Fallback without the C API: topics exist only by auto-creation, with 4 partitions."""

    c_api = False

    def __init__(self, brokers: int) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"test.mock.num.brokers": brokers})
        metadata = self._producer.list_topics(timeout=10)
        self.bootstrap_servers = ",".join(
            f"{b.host}:{b.port}" for b in sorted(metadata.brokers.values(), key=lambda b: b.id)
        )

    def create_topic(self, topic: str, partitions: int) -> None:
        if partitions != FALLBACK_PARTITIONS:
            raise RuntimeError(
                f"cannot create topic {topic!r} with {partitions} partitions: without librdkafka's"
                f" C mock API only auto-created {FALLBACK_PARTITIONS}-partition topics exist"
            )
        # A producer's metadata request for an unknown topic auto-creates it.
        found = self._producer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            raise RuntimeError(f"auto-creating topic {topic!r} failed: {found and found.error}")

    def _unsupported(self, *_: int) -> None:
        raise RuntimeError("fault injection needs librdkafka's C mock API, which is unavailable")

    broker_down = broker_up = broker_rtt = _unsupported


def open_cluster(brokers: int) -> tuple[CMockCluster | ProducerMockCluster, str | None]:
    """The best cluster available, with the reason the C API was not used (None if it was)."""
    reason = "disabled by FASTREBALANCE_MOCK_C_API=0"
    if os.environ.get("FASTREBALANCE_MOCK_C_API", "1") != "0":
        reason = "no librdkafka found"
        for path in _library_candidates():
            try:
                return CMockCluster(ctypes.CDLL(path), brokers), None
            except (OSError, AttributeError, RuntimeError) as exc:
                reason = f"{path}: {exc}"
    return ProducerMockCluster(brokers), reason


def handle(cluster: CMockCluster | ProducerMockCluster, request: dict[str, Any]) -> None:
    """Run one command; any exception becomes an ``ok: false`` answer."""
    op = request.get("op")
    if op == "ping":
        return
    if op == "create_topic":
        cluster.create_topic(str(request["topic"]), int(request["partitions"]))
    elif op == "broker_down":
        cluster.broker_down(int(request.get("broker", 1)))
    elif op == "broker_up":
        cluster.broker_up(int(request.get("broker", 1)))
    elif op == "broker_rtt":
        cluster.broker_rtt(int(request.get("broker", 1)), int(request["ms"]))
    else:
        raise ValueError(f"unknown op {op!r}")


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL us when the parent dies.

    Stdin EOF cannot reach a SIGSTOPped (paused) server, but a kernel-sent SIGKILL can. The
    parent only passes its pid when it spawns us from its main thread, because the kernel
    fires this signal when the spawning *thread* exits.
    """
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.restype = c_int
    libc.prctl.argtypes = [c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _write(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)

    # Ctrl-C hits the whole foreground process group; the parent decides when we stop (by
    # closing stdin), so its teardown can still talk to the cluster.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.parent_pid is not None:
        _die_with_parent(args.parent_pid)

    cluster, c_api_error = open_cluster(args.brokers)
    ready: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "pid": os.getpid(),
        "c_api": cluster.c_api,
        "brokers": args.brokers,
    }
    if c_api_error:
        ready["c_api_error"] = c_api_error
    _write(ready)

    for line in sys.stdin:
        if not line.strip():
            continue
        answer: dict[str, Any] = {"ok": True}
        try:
            request = json.loads(line)
            if "id" in request:
                answer["id"] = request["id"]
            handle(cluster, request)
        except Exception as exc:
            answer.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        _write(answer)

    # Everything lives in memory and the kernel frees the sockets; destroying the cluster and
    # the librdkafka handle would only risk blocking on librdkafka's threads.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
