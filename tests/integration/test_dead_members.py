"""Dead members removed at subscribe() (parallel.rebalance.remove.dead.members), with real
member processes: a SIGKILLed member's partitions move at once, a live or merely stopped
member is never removed, and a removal that fails costs only the old wait.

Member A runs in a subprocess (its death must be a real one: the kernel releases its
lock); member B, its replacement, runs here. A keeps the group's default session
timeout (45 s), so a removal that did not happen cannot pass for one that did.

The removal needs the admin LeaveGroup of KIP-345 (and, for consumer-protocol members,
KAFKA-18188, Apache Kafka 4.0.0) from a real broker: on the embedded mock cluster only the
test of a stopped member runs there (with a live member A, the mock did not assign B a
partition within 40 s, a case where no removal is even tried: that one runs on real brokers).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastrebalance import Consumer
from fastrebalance._eviction import AdminSettings
from fastrebalance.metrics import samples
from fastrebalance.testing import KafkaCluster

pytestmark = [pytest.mark.integration]

#: Member A: subscribes, prints its member id once assigned, polls until killed, spending
#: argv[3] seconds on each record it is handed (0: none).
_MEMBER = textwrap.dedent(
    """
    import json, sys, time
    from fastrebalance import Consumer
    conf = json.loads(sys.argv[1])
    c = Consumer(conf)
    said = []
    def on_assign(consumer, partitions):
        if partitions and not said:
            said.append(1)
            print(json.dumps({"member_id": consumer.memberid()}), flush=True)
    c.subscribe([sys.argv[2]], on_assign=on_assign)
    work = float(sys.argv[3])
    while True:
        m = c.poll(0.2)
        if work and m is not None:
            time.sleep(work)
    """
)


@pytest.fixture
def real_cluster(kafka_cluster: KafkaCluster) -> KafkaCluster:
    if kafka_cluster.kind == "embedded":
        pytest.skip(
            "kafka-python's admin client cannot bootstrap from librdkafka's mock cluster (it "
            "answers ApiVersions v3/v4 with UNSUPPORTED_VERSION in a body kafka-python cannot "
            "decode; pinned to v2, the mock's LeaveGroup answers NoError and keeps the member "
            "until its session ends): the removal needs a real broker"
        )
    return kafka_cluster


def conf_for(
    cluster: KafkaCluster, group: str, state: Path, protocol: str, **extra: Any
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": group,
        "enable.parallel.rebalance": True,
        "auto.offset.reset": "earliest",
        "parallel.rebalance.state.dir": str(state),
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf["partition.assignment.strategy"] = "cooperative-sticky"
    conf.update(extra)
    return conf


class MemberA:
    def __init__(self, conf: dict[str, Any], topic: str, work_s: float = 0.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MEMBER, json.dumps(conf), topic, str(work_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed once assigned; EOF if it died
        assert line, "member A exited before its first assignment"
        self.member_id = json.loads(line)["member_id"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def members() -> Iterator[list[MemberA]]:
    made: list[MemberA] = []
    yield made
    for m in made:
        m.kill()


def start_a(
    members: list[MemberA], conf: dict[str, Any], topic: str, work_s: float = 0.0
) -> MemberA:
    # bounded: A's first assignment comes within seconds, or the test's timeout names it
    a = MemberA(conf, topic, work_s)
    members.append(a)
    return a


def poll_until_assigned(consumer: Consumer, partitions: int, limit_s: float) -> float | None:
    """Seconds until ``consumer`` holds ``partitions`` partitions, or None after limit_s."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        consumer.poll(0.1)
        if len(consumer.assignment()) == partitions:
            return time.monotonic() - started
    return None


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_a_killed_member_is_removed_and_its_partitions_move_at_once(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    protocol: str,
) -> None:
    topic = topic_factory(2)
    conf = conf_for(real_cluster, unique_group, tmp_path, protocol.removeprefix("kip848-"))
    a = start_a(members, conf, topic)
    a.kill()
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        took = poll_until_assigned(b, 2, 40.0)
        handled = b.catchup_status().removed_members
        assert [(m["member_id"], m["result"]) for m in handled] == [(a.member_id, "removed")]
        # A's session is 45 s: without the removal B waits for it
        assert took is not None and took < 20.0, took
        assert b.catchup_metrics()["dead_members"]["removed"] == 1
        published = time.monotonic() + 1.5  # poll() publishes the snapshot every second
        while time.monotonic() < published:
            b.poll(0.1)
        dead = [s for s in samples(b.metrics_snapshot()) if s[0].startswith("fastrebalance_dead")]
        assert ("fastrebalance_dead_members_total", 1) in {
            (name, value) for name, labels, value in dead if labels["result"] == "removed"
        }
        # A's entry is gone, B's own is there
        assert len(list(tmp_path.glob("*.lock"))) == 1
    finally:
        b.close()
    assert list(tmp_path.iterdir()) == []  # B left the group: its entry went with it


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_a_static_member_is_replaced_at_once(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    protocol: str,
) -> None:
    """Under the consumer protocol the dead holder of our group.instance.id is removed
    (else every heartbeat is refused with a fatal UNRELEASED_INSTANCE_ID until its
    session ends); under classic the broker hands it over at our JoinGroup by itself."""
    topic = topic_factory(2)
    proto = protocol.removeprefix("kip848-")
    conf = conf_for(real_cluster, unique_group, tmp_path, proto, **{"group.instance.id": "pod-0"})
    a = start_a(members, conf, topic)
    a.kill()
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        took = poll_until_assigned(b, 2, 40.0)
        assert took is not None and took < 20.0, took
        handled = b.catchup_status().removed_members
        expected = "removed" if proto == "consumer" else "replaced"
        assert [(m["member_id"], m["result"]) for m in handled] == [(a.member_id, expected)]
    finally:
        b.close()


def test_a_live_member_is_never_removed(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
) -> None:
    """Two live processes of one group on one host: each keeps its share."""
    topic = topic_factory(2)
    conf = conf_for(real_cluster, unique_group, tmp_path, "classic")
    a = start_a(members, conf, topic)
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        assert poll_until_assigned(b, 1, 40.0) is not None
        assert b.catchup_status().removed_members == ()
        assert poll_until_assigned(b, 2, 3.0) is None  # A still holds the other one
        assert a.proc.poll() is None
        assert len(list(tmp_path.glob("*.lock"))) == 2
    finally:
        b.close()


def test_a_stopped_member_is_not_removed(
    kafka_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
) -> None:
    """A restart while the old process is only stopped (SIGSTOP): it holds its lock, it
    may come back, so nothing is removed and the group waits for its session as before."""
    topic = topic_factory(2)
    conf = conf_for(kafka_cluster, unique_group, tmp_path, "classic")
    a = start_a(members, conf, topic)
    a.proc.send_signal(signal.SIGSTOP)
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        assert poll_until_assigned(b, 2, 5.0) is None
        assert b.catchup_status().removed_members == ()
        assert (tmp_path / next(p.name for p in tmp_path.glob("*.lock"))).exists()
    finally:
        b.close()


def test_a_failed_removal_costs_only_the_old_wait(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = topic_factory(2)
    conf = conf_for(real_cluster, unique_group, tmp_path, "classic", **{"session.timeout.ms": 6000})
    a = start_a(members, conf, topic)
    a.kill()
    monkeypatch.setattr(
        "fastrebalance._recovery.admin_settings",
        lambda _conf: AdminSettings(None, "no permission on the group (test)"),
    )
    b = Consumer(conf)
    try:
        with caplog.at_level(logging.INFO, "fastrebalance.recovery"):
            b.subscribe([topic])  # never raises for the removal
            took = poll_until_assigned(b, 2, 40.0)
        assert took is not None, "B never got A's partitions after A's session timeout"
        handled = b.catchup_status().removed_members
        assert [(m["member_id"], m["result"]) for m in handled] == [(a.member_id, "failed")]
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "no permission" in warnings[0].getMessage()
        assert b.catchup_metrics()["dead_members"]["failed"] == 1
    finally:
        b.close()


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_a_helper_closing_while_the_killed_owner_is_still_listed_writes_its_done_chunks(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    protocol: str,
) -> None:
    # issue 45 (adversary on Kafka 3.9): the owner of a partition was SIGKILLed mid
    # catch-up; a helper read the rest of its backlog, committed it and closed cleanly.
    # Its write of the done chunks from outside the group was refused while the dead owner
    # was still listed, and not tried again: once the owner's session expired the group
    # was empty and its offset stayed behind (8 of 14 runs) until a new member started
    from fastrebalance.testing._groupchaos import prepare

    from .helpers import group_offsets

    backlog = 20_000
    topic = topic_factory(1)
    bootstrap = real_cluster.bootstrap_servers
    prepare(bootstrap, topic, unique_group, backlog)
    conf = conf_for(
        real_cluster,
        unique_group,
        tmp_path,
        protocol.removeprefix("kip848-"),
        **{
            "parallel.rebalance.group.catchup": True,
            "parallel.rebalance.group.chunk.records": 1000,
            "parallel.rebalance.group.claim.timeout.ms": 3000,
            "parallel.rebalance.lag.threshold": 10,
            "enable.auto.commit": False,  # A commits nothing: none of its chunks is done
        },
    )
    # The owner (its session: the default 45 s). It works 2 ms per record: a free-running
    # A read the whole backlog itself (20 chunks in about a second) before B's join
    # completed on a loaded CI run, and B, with nothing left to help with, read nothing.
    a = start_a(members, conf, topic, work_s=0.002)
    b = Consumer(conf)
    read: set[int] = set()

    def step() -> None:
        got = [m.offset() for m in b.consume(500, 0.1) if m.error() is None]
        if got:
            read.update(got)
            b.commit(asynchronous=False)

    joined: list[int] = []
    try:
        # A is alive: nothing to remove, B only helps. B's join must be complete before A
        # dies: a helper reads chunks before its first assignment, and with the rebalance
        # then waiting on dead A (45 s), B's leave at close() queued behind its JoinGroup
        # and timed out (a loaded CI run): B stayed listed, so nobody could write the
        # group's offset from outside; that is another case than this one. (Under the
        # consumer protocol there is no JoinGroup to wait on, and librdkafka calls no
        # on_assign for an empty first assignment.)
        classic = not protocol.startswith("kip848")
        b.subscribe([topic], on_assign=lambda _c, parts: joined.append(len(parts)))
        deadline = time.monotonic() + 30
        while not read or (classic and not joined):
            assert time.monotonic() < deadline, f"B joined {joined}, read {len(read)}"
            step()
        a.kill()
        killed = time.monotonic()
        deadline = killed + 30  # A's chunks are free 3 s (claim timeout) after its death
        while len(read) < backlog:
            assert time.monotonic() < deadline, f"B read {len(read)} of {backlog}"
            step()
        assert not b.assignment()  # A is still listed: the partition is still its own
    finally:
        b.close()
    # B closed before A's session could expire: A was listed when B wrote
    assert time.monotonic() - killed < 40
    offset = group_offsets(bootstrap, unique_group, topic)[0]
    assert offset == backlog, f"the group's offset stayed at {offset} of {backlog}"
    assert set(range(offset)) <= read  # never past a record nobody processed


# -- adversarial: what must never be removed, and what cannot be proven dead -------------------


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_two_live_members_on_one_host_and_a_third_start_remove_nothing(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    protocol: str,
) -> None:
    """Three processes of one group sharing one state directory: the third's start finds
    two entries, both locked (alive), and removes neither."""
    topic = topic_factory(3)
    conf = conf_for(real_cluster, unique_group, tmp_path, protocol.removeprefix("kip848-"))
    a1 = start_a(members, conf, topic)
    a2 = start_a(members, conf, topic)
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        assert poll_until_assigned(b, 1, 40.0) is not None
        assert b.catchup_status().removed_members == ()
        assert a1.proc.poll() is None and a2.proc.poll() is None
        assert len(list(tmp_path.glob("*.lock"))) == 3
    finally:
        b.close()


@pytest.mark.kafka4
def test_a_stopped_member_is_not_removed_under_the_consumer_protocol(
    kip848_cluster: KafkaCluster,
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
) -> None:
    topic = topic_factory(2)
    conf = conf_for(real_cluster, unique_group, tmp_path, "consumer")
    a = start_a(members, conf, topic)
    a.proc.send_signal(signal.SIGSTOP)
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        # A's partitions stay A's until its 45 s session ends: it may come back
        assert poll_until_assigned(b, 2, 6.0) is None
        assert b.catchup_status().removed_members == ()
    finally:
        b.close()


def test_a_damaged_state_file_removes_nothing(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
) -> None:
    """A membership file cut short (our writes are atomic, but a full disk or a partial
    copy of the directory is not): with no member id there is nothing to remove, the entry
    is dropped, and the restart waits for the dead member's session as without the key."""
    topic = topic_factory(2)
    conf = conf_for(real_cluster, unique_group, tmp_path, "classic", **{"session.timeout.ms": 6000})
    a = start_a(members, conf, topic)
    a.kill()
    (data,) = tmp_path.glob("*.json")
    text = data.read_text()
    data.write_text(text[: len(text) // 2])
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        took = poll_until_assigned(b, 2, 40.0)
        assert took is not None and took > 2.0, took  # the session's wait, not a removal
        assert b.catchup_status().removed_members == ()
        assert not data.exists()  # the dead entry was dropped with its lock file
    finally:
        b.close()


def test_a_dead_member_in_another_state_dir_is_not_removed(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
) -> None:
    """Two "containers" of one group, each with a state volume of its own: B cannot prove
    A dead (A's lock is not in B's directory), so it waits as before, and A's entry stays
    for A's own restart."""
    topic = topic_factory(2)
    conf_a = conf_for(
        real_cluster, unique_group, tmp_path / "a", "classic", **{"session.timeout.ms": 6000}
    )
    a = start_a(members, conf_a, topic)
    a.kill()
    b = Consumer({**conf_a, "parallel.rebalance.state.dir": str(tmp_path / "b")})
    try:
        b.subscribe([topic])
        took = poll_until_assigned(b, 2, 40.0)
        assert took is not None and took > 2.0, took
        assert b.catchup_status().removed_members == ()
        assert len(list((tmp_path / "a").glob("*.lock"))) == 1
    finally:
        b.close()


@pytest.mark.kafka4
@pytest.mark.parametrize("protocol", ["classic", "kip848-consumer"])
def test_a_dead_static_member_of_another_instance_id_is_left_for_its_own_restart(
    real_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
    members: list[MemberA],
    protocol: str,
) -> None:
    """pod-0 dies; pod-1 starting on the same host does not remove it (a static member's
    partitions wait for its own restart, which is what static membership is for); pod-0's
    restart then finds its entry."""
    topic = topic_factory(2)
    proto = protocol.removeprefix("kip848-")
    # a short session under classic (the consumer protocol refuses the key: the broker's)
    extra = {"session.timeout.ms": 6000} if proto == "classic" else {}
    conf = conf_for(real_cluster, unique_group, tmp_path, proto, **extra)
    a = start_a(members, {**conf, "group.instance.id": "pod-0"}, topic)
    a.kill()
    b = Consumer({**conf, "group.instance.id": "pod-1"})
    try:
        b.subscribe([topic])
        for _ in range(10):
            b.poll(0.1)
        assert b.catchup_status().removed_members == ()
        assert len(list(tmp_path.glob("*.lock"))) >= 1  # pod-0's, still there
    finally:
        b.close()
    c = Consumer({**conf, "group.instance.id": "pod-0"})
    try:
        c.subscribe([topic])
        assert poll_until_assigned(c, 1, 40.0) is not None
        handled = [(m["member_id"], m["result"]) for m in c.catchup_status().removed_members]
        assert handled == [(a.member_id, "removed" if proto == "consumer" else "replaced")]
    finally:
        c.close()


#: A member that subscribes and never polls: the broker assigns it partitions (the consumer
#: protocol's heartbeats run on librdkafka's own thread) but no callback of it ever runs.
_SILENT_MEMBER = textwrap.dedent(
    """
    import json, sys, time
    from fastrebalance import Consumer
    c = Consumer(json.loads(sys.argv[1]))
    c.subscribe([sys.argv[2]])
    print(json.dumps({"member_id": c.memberid()}), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.kafka4
def test_a_member_killed_before_its_first_assignment_is_removed_under_the_consumer_protocol(
    kip848_cluster: KafkaCluster,
    topic_factory: Any,
    unique_group: str,
    tmp_path: Path,
) -> None:
    # adversary of issue 45 (Kafka 4, consumer protocol): a member SIGKILLed 2-5 s after
    # its start had been assigned a partition by the broker, but its assignment had not
    # reached the application: nothing was recorded, and its restart waited out the 45 s
    # session for that partition (4 of 6 runs)
    if kip848_cluster.kind == "embedded":
        pytest.skip("the removal needs a real broker")
    topic = topic_factory(2)
    conf = conf_for(kip848_cluster, unique_group, tmp_path, "consumer")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SILENT_MEMBER, json.dumps(conf), topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "member A exited before it subscribed"
        member_id = json.loads(line)["member_id"]
        time.sleep(3.0)  # A's heartbeats (librdkafka's thread) make it a member with partitions
    finally:
        proc.kill()
        proc.wait(30)
    b = Consumer(conf)
    try:
        b.subscribe([topic])
        took = poll_until_assigned(b, 2, 40.0)
        handled = [(m["member_id"], m["result"]) for m in b.catchup_status().removed_members]
        assert handled == [(member_id, "removed")]
        assert took is not None and took < 20.0, took  # A's session is 45 s
    finally:
        b.close()
