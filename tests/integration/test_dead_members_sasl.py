"""The removal of a dead member over SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), on a real
broker with a SASL listener that this module starts itself: the consumer's librdkafka
settings, mapped onto kafka-python's admin client, authenticate as the consumer does.

The broker is a copy of the Kafka distribution's config with a SASL_PLAINTEXT listener
added beside the PLAINTEXT one (which the harness uses to start it and to create the SCRAM
credentials). Runs where the suite runs against a real broker and a Kafka distribution is
at hand (``FASTREBALANCE_TEST_BOOTSTRAP`` and ``FASTREBALANCE_KAFKA_HOME``, as
``make test-kafka``); skips elsewhere.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from fastrebalance import Consumer
from fastrebalance.testing._apache import ApacheKafka, kafka_home

from .test_dead_members import MemberA, conf_for, poll_until_assigned

pytestmark = [pytest.mark.integration]

USER, PASSWORD = "alice", "alice-secret"


def _free_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def _sasl_distribution(home: Path, into: Path, sasl_port: int) -> Path:
    """A distribution whose config adds a SASL_PLAINTEXT listener on ``sasl_port``."""
    (into / "bin").mkdir(parents=True)
    for script in ("kafka-up", "kafka-down"):
        shutil.copy2(home / "bin" / script, into / "bin" / script)
    os.symlink(home / "lib", into / "lib")
    shutil.copytree(home / "config", into / "config")
    props = (home / "config" / "server.properties").read_text()
    sasl = f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    props = props.replace(
        "listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CTL@",
        f"listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CTL@,{sasl}",
    ).replace(
        "advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,{sasl}",
    )
    props = props.replace(
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
        "SASL_PLAINTEXT:SASL_PLAINTEXT",
    )
    assert sasl in props, "the distribution's listeners line is not the expected one"
    props += (
        "\nsasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512\n"
        "listener.name.sasl_plaintext.plain.sasl.jaas.config="
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{USER}="{PASSWORD}";\n'
    )
    for mech in ("scram-sha-256", "scram-sha-512"):
        props += (
            f"listener.name.sasl_plaintext.{mech}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;\n"
        )
    (into / "config" / "server.properties").write_text(props)
    return into


class SaslKafka:
    def __init__(self, broker: ApacheKafka, sasl_bootstrap: str) -> None:
        self.broker = broker
        self.bootstrap_servers = sasl_bootstrap
        self.kind = "apache"


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslKafka]:
    home = kafka_home()
    if not os.environ.get("FASTREBALANCE_TEST_BOOTSTRAP", "").strip() or home is None:
        pytest.skip("needs a Kafka distribution (FASTREBALANCE_KAFKA_HOME) and a real-broker run")
    sasl_port = _free_port()
    dist = _sasl_distribution(home, tmp_path_factory.mktemp("kafka-sasl") / "dist", sasl_port)
    broker = ApacheKafka(dist)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for mech in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            # one mechanism per request: the broker refuses a user twice in one
            info = ScramCredentialInfo(mech, 4096)
            upsert = UserScramCredentialUpsertion(USER, info, PASSWORD.encode())
            for f in admin.alter_user_scram_credentials([upsert]).values():
                f.result(30)
        yield SaslKafka(broker, f"127.0.0.1:{sasl_port}")
    finally:
        broker.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_dead_member_is_removed_over_sasl(
    sasl_kafka: SaslKafka, tmp_path: Path, mechanism: str
) -> None:
    topic = group = f"sasl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": sasl_kafka.broker.bootstrap_servers})
    for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(30)
    conf = conf_for(
        sasl_kafka,  # type: ignore[arg-type]
        group,
        tmp_path,
        "classic",
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": USER,
            "sasl.password": PASSWORD,
        },
    )
    a = MemberA(conf, topic)
    try:
        a.kill()
        b = Consumer(conf)
        try:
            b.subscribe([topic])
            took = poll_until_assigned(b, 2, 40.0)
            handled: Any = b.catchup_status().removed_members
            assert [(m["member_id"], m["result"], m["error"]) for m in handled] == [
                (a.member_id, "removed", "")
            ]
            assert took is not None and took < 20.0, took  # A's session: 45 s
        finally:
            b.close()
    finally:
        a.kill()


def test_wrong_credentials_fail_the_removal_not_the_consumer(
    sasl_kafka: SaslKafka,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The admin client authenticates with what the consumer has: here the consumer's
    own password is right, and the admin's is made wrong (a credential rotated under
    it, say): the removal fails, subscribe() does not, and the failure is one line of
    ours (kafka-python's own retries of the refused login stay at DEBUG)."""
    from fastrebalance import _recovery
    from fastrebalance._eviction import admin_settings

    topic = group = f"sasl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": sasl_kafka.broker.bootstrap_servers})
    for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(30)
    conf = conf_for(
        sasl_kafka,  # type: ignore[arg-type]
        group,
        tmp_path,
        "classic",
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
            "session.timeout.ms": 6000,
        },
    )
    monkeypatch.setattr(
        _recovery,
        "admin_settings",
        lambda c: admin_settings({**c, "sasl.password": "wrong"}),
    )
    a = MemberA(conf, topic)
    try:
        a.kill()
        b = Consumer(conf)
        caplog.set_level(logging.INFO)
        try:
            b.subscribe([topic])
            assert poll_until_assigned(b, 2, 40.0) is not None  # after A's 6 s session
            handled: Any = ()
            deadline = time.monotonic() + 30  # kafka-python gives up its login after 10 s
            while not handled and time.monotonic() < deadline:
                b.poll(0.2)
                handled = b.catchup_status().removed_members
            assert [(m["member_id"], m["result"]) for m in handled] == [(a.member_id, "failed")]
            assert "wrong" not in handled[0]["error"]
            ours = [r for r in caplog.records if r.name == "fastrebalance.recovery"]
            assert [r.levelno for r in ours] == [logging.WARNING], [r.getMessage() for r in ours]
            assert not [r for r in caplog.records if r.name.startswith("kafka")]
        finally:
            b.close()
    finally:
        a.kill()
