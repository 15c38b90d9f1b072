"""The removal of dead members, without a broker: the librdkafka -> kafka-python security
mapping, the config keys, and a removal that fails (it reports, never raises).

The removal on real brokers (both protocols, SASL included) is
tests/integration/test_dead_members.py.
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from fastrebalance._config import REMOVE_DEAD_KEY, STATE_DIR_KEY, split_config
from fastrebalance._eviction import AdminSettings, Outcome, Removal, admin_settings
from fastrebalance._membership import Membership, Registration, group_key
from fastrebalance._recovery import Recovery

BASE = {"bootstrap.servers": "b1:9092, b2:9092", "group.id": "orders"}


def test_plaintext() -> None:
    kw = admin_settings({**BASE, "client.id": "app"}).kwargs
    assert kw is not None
    assert kw["bootstrap_servers"] == ["b1:9092", "b2:9092"]
    assert kw["security_protocol"] == "PLAINTEXT"
    assert kw["client_id"] == "app-recovery"
    assert "sasl_mechanism" not in kw and "ssl_context" not in kw


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "scram-sha-512"])
@pytest.mark.parametrize("key", ["sasl.mechanism", "sasl.mechanisms"])
def test_sasl(mechanism: str, key: str) -> None:
    kw = admin_settings(
        {
            **BASE,
            "security.protocol": "sasl_plaintext",
            key: mechanism,
            "sasl.username": "alice",
            "sasl.password": "s3cret",
        }
    ).kwargs
    assert kw is not None
    assert kw["security_protocol"] == "SASL_PLAINTEXT"
    assert kw["sasl_mechanism"] == mechanism.upper()
    assert (kw["sasl_plain_username"], kw["sasl_plain_password"]) == ("alice", "s3cret")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_ssl(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    conf = {
        **BASE,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": str(cert),
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
    }
    kw = admin_settings(conf).kwargs
    assert kw is not None
    ctx = kw["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED  # librdkafka's default
    assert any("localhost" in str(c.get("subject")) for c in ctx.get_ca_certs())
    loose = admin_settings({**conf, "ssl.endpoint.identification.algorithm": "none"}).kwargs
    assert loose is not None and not loose["ssl_context"].check_hostname
    off = admin_settings({**conf, "enable.ssl.certificate.verification": "false"}).kwargs
    assert off is not None and off["ssl_context"].verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "GSSAPI"),
        ({"security.protocol": "sasl_plaintext", "sasl.mechanism": "OAUTHBEARER"}, "OAUTH"),
        ({"security.protocol": "ssl", "ssl.keystore.location": "/k.p12"}, "keystore"),
        ({"security.protocol": "ssl", "ssl.ca.location": "/nonexistent.pem"}, "TLS"),
        ({"bootstrap.servers": ""}, "bootstrap"),
    ],
)
def test_what_cannot_be_mapped_is_refused_with_the_reason(extra: dict, why: str) -> None:
    settings = admin_settings({**BASE, **extra})
    assert settings.kwargs is None
    assert why in settings.refused


def run_removal(settings: AdminSettings) -> list[Outcome]:
    got: list[list[Outcome]] = []
    removal = Removal(settings, "orders", [{"member_id": "m1"}], None, got.append)
    removal.start()
    assert removal.finished.wait(30)
    return got[0]


def test_a_refused_mapping_fails_the_removal_without_raising() -> None:
    (outcome,) = run_removal(AdminSettings(None, "sasl.mechanism=GSSAPI is not supported"))
    assert outcome.result == "failed" and "GSSAPI" in outcome.error


def test_an_unreachable_cluster_fails_the_removal_without_raising() -> None:
    settings = AdminSettings(
        {
            "bootstrap_servers": ["127.0.0.1:1"],
            "bootstrap_timeout_ms": 500,
            "request_timeout_ms": 500,
        }
    )
    (outcome,) = run_removal(settings)
    assert outcome.result == "failed" and outcome.error


# -- config ---------------------------------------------------------------------------------
def test_on_by_default_in_the_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTREBALANCE_STATE_DIR", str(tmp_path / "state"))
    settings, rest = split_config({**BASE, "enable.parallel.rebalance": True})
    assert settings.state_dir == tmp_path / "state" and settings.state_dir.is_dir()
    assert STATE_DIR_KEY not in rest and REMOVE_DEAD_KEY not in rest
    off, _ = split_config({**BASE, "enable.parallel.rebalance": True, REMOVE_DEAD_KEY: "false"})
    assert off.state_dir is None
    plain, rest = split_config({**BASE, STATE_DIR_KEY: str(tmp_path)})
    assert plain.state_dir is None and STATE_DIR_KEY not in rest  # no mode, no removal


def test_an_unusable_named_directory_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(KafkaException) as info:
        split_config({**BASE, "enable.parallel.rebalance": True, STATE_DIR_KEY: str(blocker)})
    message = info.value.args[0].str()
    assert STATE_DIR_KEY in message and str(blocker) in message and REMOVE_DEAD_KEY in message
    assert isinstance(info.value, ValueError)


def test_an_unusable_default_directory_turns_the_removal_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FASTREBALANCE_STATE_DIR", str(blocker / "state"))
    with caplog.at_level(logging.WARNING, "fastrebalance"):
        settings, _ = split_config({**BASE, "enable.parallel.rebalance": True})
    assert settings.state_dir is None
    assert any(STATE_DIR_KEY in r.getMessage() for r in caplog.records)


# -- which dead entries a start takes ---------------------------------------------------------
def dead_entry(directory: Path, member: str, instance: str | None, protocol: str) -> None:
    reg = Registration(directory, group_key(BASE["bootstrap.servers"], "orders"))
    reg.record(Membership("orders", member, instance, protocol, BASE["bootstrap.servers"]))
    reg.close(forget=False)


class FakeRemoval(threading.Thread):
    """Stands in for the admin client: every member is removed."""

    made: list[FakeRemoval] = []

    def __init__(self, settings: Any, group: str, members: list[dict], join: Any, done: Any):
        super().__init__(daemon=True)
        self.members, self.join_pending, self.done = members, join, done
        self.finished = threading.Event()
        FakeRemoval.made.append(self)

    def run(self) -> None:
        self.done([Outcome(m, "removed", 1.0) for m in self.members])
        self.finished.set()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_start_takes_dynamic_entries_and_its_own_instance_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setattr("fastrebalance._recovery.Removal", FakeRemoval)
    FakeRemoval.made.clear()
    dead_entry(tmp_path, "dyn", None, protocol)
    dead_entry(tmp_path, "mine", "pod-0", protocol)
    dead_entry(tmp_path, "theirs", "pod-1", protocol)
    conf = {**BASE, "group.instance.id": "pod-0"}
    recovery = Recovery(tmp_path, conf, consumer_protocol=protocol == "consumer")
    recovery.before_subscribe()
    recovery.after_subscribe(lambda: None)
    (removal,) = FakeRemoval.made
    assert removal.finished.wait(10)
    removed = sorted(m["member_id"] for m in removal.members)
    handled = {r["member_id"]: r["result"] for r in recovery.removals()}
    if protocol == "consumer":
        assert removal.join_pending is None  # before the first heartbeat
        assert removed == ["dyn", "mine"]
    else:
        assert removal.join_pending is not None and removal.join_pending.is_set()
        # classic: the broker hands our static identity over at our JoinGroup itself
        assert removed == ["dyn"] and handled["mine"] == "replaced"
    assert "theirs" not in handled
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and all("." in n for n in left)  # pod-1's entry, for its restart
    assert recovery.counts()["removed"] == len(removed)


def test_the_import_costs_no_removal_and_no_retry_machinery() -> None:
    """kafka-python (the removal) and tenacity (retries) are imported when first needed:
    a restarted process imports fastrebalance on its way to its first fresh record."""
    code = (
        "import sys, fastrebalance; "
        "print(sorted(m for m in ('kafka', 'tenacity') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_import_costs_no_admin_client() -> None:
    """confluent-kafka's admin package (15-21 ms of the 150-210 ms `python -X importtime`
    gave `import fastrebalance`) serves only the claims topic of group catch-up: imported
    when that topic is first made sure of, not on a restarted process's way to its first
    fresh record."""
    code = "import sys, fastrebalance; print('confluent_kafka.admin' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_consumer_protocol_records_the_member_at_subscribe(
    tmp_path: Path, protocol: str
) -> None:
    """Under the consumer protocol the member id is the client's own from subscribe() on,
    and the broker may assign partitions before any callback runs: a process killed then
    must leave an entry its restart can remove. Under classic the id comes with the join:
    the assignment records it."""
    from fastrebalance._membership import find_dead

    recovery = Recovery(tmp_path, BASE, consumer_protocol=protocol == "consumer")
    recovery.before_subscribe()
    recovery.after_subscribe(lambda: "member-1" if protocol == "consumer" else None)
    recovery.close(left=False)  # as a crash leaves it: released, the entry stays
    dead = find_dead(tmp_path, group_key(BASE["bootstrap.servers"], BASE["group.id"]))
    try:
        found = [d.membership.member_id for d in dead if d.membership is not None]
        assert found == (["member-1"] if protocol == "consumer" else [])
    finally:
        for d in dead:
            d.discard()
