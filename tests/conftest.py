"""Shared fixtures: one Kafka cluster per test session, fresh topics and groups per test.

The cluster is whatever ``open_test_cluster()`` picks (embedded unless the environment says
otherwise); unique names let tests share it without seeing each other's records or groups.

The Makefile runs the suite on four pytest-xdist workers (``-n 4 --dist loadgroup``): each
worker is a session of its own, with its own embedded cluster (a real broker is shared:
names are unique). Most of the suite waits on Kafka (session timeouts, rebalances, commit
round trips): on two cores, three workers kept the CPU about half busy (``make test``: 720 s
of user and system time in 765 s of wall), and a fourth took the part run on workers from
679 s to 582 s (both beside the same other Spark job, load average about 9). A module
stays on one worker (its module-scoped Spark session or broker is made once). The Spark
modules run one at a time: on two cores they are CPU-bound, and side by
side they only slowed each other (the crash harness's module beside the others took 438 s
instead of 177 s alone, the standalone cluster's test 246 s instead of 44 s); the crash
harness, the standalone cluster and Spark Connect run on a real broker only (their modules
say why). The tests
marked ``alone`` load the machine themselves (chaos slices with two CPU hogs for their
whole run): the Makefile runs them after the others, with nothing else beside them but
what they start (``make test`` runs its two side by side, with one busy process each).
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import settings

from fastrebalance import _child
from fastrebalance._child import ChildState
from fastrebalance.testing import (
    KafkaCluster,
    kip848_supported,
    open_test_cluster,
    transactions_supported,
)

# Hypothesis's per-example deadline (200 ms) is a timing assertion: on a loaded CI machine a
# pure property failed it (642 ms for one example, 1.5 ms when run again). No deadline in
# this suite; each property's max_examples bounds its cost.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# The membership state files of every consumer the suite starts (and of the processes it
# starts: they inherit it) go to a directory of this run, not the user's own
# (fastrebalance/_membership.py, parallel.rebalance.state.dir's default).
os.environ.setdefault("FASTREBALANCE_STATE_DIR", tempfile.mkdtemp(prefix="fastrebalance-state-"))

#: Modules that share an xdist group, so that no two of them run at once: one Spark JVM
#: (and its Python workers) at a time.
_SERIAL_GROUPS = {
    "spark": (
        "test_spark_chaos",
        "test_spark_connect",
        "test_spark_reader",
        "test_spark_source",
        "test_spark_standalone",
        "test_spark_example",
        "test_spark_listeners",
        "test_spark_setup",
    ),
}
_GROUP_OF = {module: group for group, modules in _SERIAL_GROUPS.items() for module in modules}
#: The longest groups start first, so that no worker is left with one alone at the end.
_FIRST = (
    "spark",
    "test_model",
    "test_group_catchup",
    "test_safety",
    "test_exactly_once",
    "test_group_chaos",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {}
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else item.nodeid
        groups[item.nodeid] = group = _GROUP_OF.get(module, module)
        item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "loadgroup", False):  # an xdist worker (its dist is "no")
        rank = {group: i for i, group in enumerate(_FIRST)}
        items.sort(key=lambda item: rank.get(groups[item.nodeid], len(_FIRST)))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """An xdist worker whose groups did not take (its test ids carry no ``@group``) would
    run a module's tests on both workers at once: refuse, rather than pass slowly or flake."""
    config = session.config
    items = session.items
    grouped = any("@" in item.nodeid for item in items)
    if getattr(config.option, "loadgroup", False) and items and not grouped:
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup grouped nothing (a pytest it does not support?): "
            "see tests/conftest.py and the pytest pin in pyproject.toml"
        )


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    cluster = open_test_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def topic_factory(kafka_cluster: KafkaCluster) -> Callable[..., str]:
    def make(partitions: int = 1) -> str:
        name = f"t-{uuid4().hex[:10]}"
        kafka_cluster.create_topic(name, partitions)
        return name

    return make


@pytest.fixture
def unique_group() -> str:
    return f"g-{uuid4().hex[:10]}"


@pytest.fixture
def transactional_cluster(kafka_cluster: KafkaCluster) -> KafkaCluster:
    """The session's cluster, if it stores transactional offsets; skip otherwise.

    librdkafka's mock acknowledges TxnOffsetCommit and drops it, so exactly-once end to
    end can only be checked on a real broker (FASTREBALANCE_TEST_BOOTSTRAP or Docker)."""
    ok, why = transactions_supported(kafka_cluster)
    if not ok:
        pytest.skip(why)
    return kafka_cluster


@pytest.fixture(scope="session")
def kip848(kafka_cluster: KafkaCluster) -> tuple[bool, str]:
    """Whether this cluster serves KIP-848 to librdkafka, and why not (asked once)."""
    return kip848_supported(kafka_cluster)


@pytest.fixture
def kip848_cluster(kafka_cluster: KafkaCluster, kip848: tuple[bool, str]) -> KafkaCluster:
    """The session's cluster, if ``group.protocol=consumer`` works on it; skip otherwise
    (Apache Kafka 3.9 serves librdkafka no KIP-848: the embedded cluster and Kafka 4.x do)."""
    if not kip848[0]:
        pytest.skip(kip848[1])
    return kafka_cluster


@pytest.fixture(autouse=True)
def _kip848_cases_need_kip848(request: pytest.FixtureRequest) -> None:
    """A case parametrized with ``protocol="kip848-consumer"`` skips where KIP-848 is not
    served, with the reason; every other case runs as written."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("protocol") == "kip848-consumer":
        supported, why = request.getfixturevalue("kip848")
        if not supported:
            pytest.skip(why)


@pytest.fixture(autouse=True)
def _no_catchup_child_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a catch-up child's librdkafka handle open fails: that handle
    goes on connecting to the test's cluster after it is gone, and its log lines reached
    fd 2 during later tests (a Kafka 3.9 pass: "Connect to 127.0.0.1:24316 failed" in
    test_bench_smoke). One look at a weak set when nothing is open; a garbage collection
    only when something is (a Consumer dropped without close() is closed by it)."""
    yield
    if not _child.OPEN:
        return
    gc.collect()
    left = [c for c in _child.OPEN if c.state is not ChildState.CLOSED]
    _child.OPEN.clear()  # reported once, here: not again by every later test
    if left:
        pytest.fail(
            f"{len(left)} catch-up child consumer(s) left open by this test "
            f"(group {sorted({str(c._conf.get('group.id')) for c in left})}): close() "
            "every fastrebalance Consumer it made",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """A test still running a minute past its pytest-timeout bound has a process that
    pytest-timeout cannot reach: a thread holding the GIL for ever (librdkafka 2.16's
    close() inside confluent-kafka's rebalance callback froze a whole worker, stop 43).
    faulthandler's watchdog is a C thread: it prints every thread's stack and ends the
    process without the GIL, so xdist names the test and the run goes on."""
    marker = item.get_closest_marker("timeout")
    ini = item.config.getini("timeout")
    bound = float(marker.args[0]) if marker and marker.args else float(ini)
    try:  # the real stderr, which pytest keeps beside its capture
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        out: Any = item.config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        out = sys.__stderr__
    faulthandler.dump_traceback_later(bound + 60, exit=True, file=out)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A pytest process still alive two minutes after its session ended is hung on
    something a test left behind (a thread that never ends, a client's close): every
    thread's stack, then exit 1, rather than a CI run held to its limit with no name.
    Not in an xdist worker: it waits here for its controller, which ends it (and kills it
    if it lingers)."""
    if not hasattr(config, "workerinput"):
        faulthandler.dump_traceback_later(120, exit=True)
