"""Remove dead members from the group, through kafka-python's admin LeaveGroup.

confluent-kafka's AdminClient has no remove-members call (librdkafka's own LeaveGroup only
leaves itself); kafka-python's ``KafkaAdminClient.remove_group_members`` sends KIP-345's
batch LeaveGroup, the request behind the Java Admin's ``removeMembersFromConsumerGroup``
(for consumer-protocol members since Apache Kafka 4.0.0, KAFKA-18188). kafka-python is
imported here only when there is someone to remove: a start with no dead entry pays
nothing for it.

Thread ownership: a removal runs on a helper thread of its own (``Removal``), with its own
kafka-python client, created, used and closed there. It never touches a confluent-kafka
handle. What it learns it hands back under a lock (``Removal.outcomes``).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AdminSettings", "Outcome", "Removal", "admin_settings"]

log = logging.getLogger("fastrebalance.recovery")

#: The admin client's connection and request bounds: a removal that has not happened by
#: then is worth nothing (the dead member's session expires at about that time anyway).
ADMIN_TIMEOUT_MS = 10_000
#: Classic protocol: how long to wait for our JoinGroup to be pending before removing
#: anyway, and how often to look.
JOIN_WAIT_S = 10.0
JOIN_POLL_S = 0.05
#: librdkafka's mechanisms kafka-python speaks with the same settings.
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: librdkafka settings that change how a connection is made and that we cannot map: with
#: one of them the admin client would not reach the cluster as the consumer does, so no
#: removal is tried (the old wait, and a log line naming the setting).
_UNMAPPED = (
    "ssl.certificate.pem", "ssl.key.pem", "ssl.keystore.location", "ssl_engine",
    "ssl.engine.location", "sasl.oauthbearer.method", "sasl.oauthbearer.config",
    "oauth_cb", "sasl.kerberos.keytab", "client.dns.lookup", "ssl.providers",
)  # fmt: skip


@dataclass(frozen=True)
class AdminSettings:
    """kafka-python ``KafkaAdminClient`` keyword arguments, or why there are none."""

    kwargs: Mapping[str, Any] | None
    refused: str = ""


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "t", "1")


def admin_settings(conf: Mapping[str, Any]) -> AdminSettings:
    """Map the consumer's librdkafka settings onto kafka-python's: the bootstrap, the
    security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), SASL PLAIN and SCRAM
    credentials, and TLS (CA, client certificate and key, CRL, verification), so the
    admin client reaches the cluster exactly as the consumer does."""
    bootstrap = conf.get("bootstrap.servers") or conf.get("metadata.broker.list")
    if not bootstrap:
        return AdminSettings(None, "no bootstrap.servers")
    for key in _UNMAPPED:
        if conf.get(key) not in (None, ""):
            return AdminSettings(None, f"{key} is set, and the admin client cannot use it")
    protocol = str(conf.get("security.protocol", "plaintext")).strip().upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        return AdminSettings(None, f"security.protocol={protocol.lower()} is not supported")
    client_id = str(conf.get("client.id") or "rdkafka")
    kwargs: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in str(bootstrap).split(",") if s.strip()],
        "client_id": f"{client_id}-recovery",
        "security_protocol": protocol,
        "request_timeout_ms": ADMIN_TIMEOUT_MS,
        "bootstrap_timeout_ms": ADMIN_TIMEOUT_MS,
    }
    if protocol.startswith("SASL"):
        mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI")))
        mechanism = mechanism.strip().upper()
        if mechanism not in _MECHANISMS:
            return AdminSettings(None, f"sasl.mechanism={mechanism} is not supported")
        kwargs["sasl_mechanism"] = mechanism
        kwargs["sasl_plain_username"] = conf.get("sasl.username")
        kwargs["sasl_plain_password"] = conf.get("sasl.password")
    if protocol.endswith("SSL"):
        try:
            kwargs["ssl_context"] = _ssl_context(conf)
        except (OSError, ssl.SSLError, ValueError) as exc:
            return AdminSettings(None, f"the TLS settings could not be loaded: {exc}")
    return AdminSettings(kwargs)


def _ssl_context(conf: Mapping[str, Any]) -> ssl.SSLContext:
    """librdkafka's TLS settings as an ``ssl.SSLContext`` (its defaults: the system CAs,
    certificate verification on, host names checked since librdkafka 2.0)."""
    ctx = ssl.create_default_context()
    ca = conf.get("ssl.ca.location")
    if ca and str(ca) != "probe":
        if os.path.isdir(str(ca)):
            ctx.load_verify_locations(capath=str(ca))
        else:
            ctx.load_verify_locations(cafile=str(ca))
    if conf.get("ssl.ca.pem"):
        ctx.load_verify_locations(cadata=str(conf["ssl.ca.pem"]))
    if conf.get("ssl.certificate.location"):
        ctx.load_cert_chain(
            str(conf["ssl.certificate.location"]),
            conf.get("ssl.key.location"),
            conf.get("ssl.key.password"),
        )
    if conf.get("ssl.crl.location"):
        ctx.load_verify_locations(cafile=str(conf["ssl.crl.location"]))
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    algorithm = str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower()
    if algorithm == "none":
        ctx.check_hostname = False
    if not _truthy(conf.get("enable.ssl.certificate.verification", True)):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class _OurThreads(logging.Filter):
    """Drops kafka-python's own records from a removal's threads (ours, and its client's
    I/O thread ``kafka-io-<client.id>-recovery``) unless that logger is enabled for DEBUG:
    a removal that fails says so in one line of ours, not in kafka-python's retries
    (dozens of WARNING and ERROR lines while it gives up on a refused login)."""

    def filter(self, record: logging.LogRecord) -> bool:
        thread = record.threadName or ""
        ours = thread.startswith("fastrebalance-recovery") or (
            thread.startswith("kafka-io-") and thread.endswith("-recovery")
        )
        return not ours or logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_FILTER = _OurThreads()


def _quiet_kafka_python() -> None:
    """Put the filter on kafka-python's loggers (a logger's filters apply to the records
    it makes, not to its children's: each one needs it)."""
    for name in list(logging.root.manager.loggerDict):
        if name == "kafka" or name.startswith("kafka."):
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


@dataclass(frozen=True)
class Outcome:
    """What became of one dead member.

    ``result``: ``removed``; ``gone`` (the group no longer knew it: its session had
    expired, or it was replaced); ``failed`` (see ``error``: the old wait applies)."""

    member: Mapping[str, Any]
    result: str
    at: float  # wall clock, epoch seconds
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {**self.member, "result": self.result, "at": self.at, "error": self.error}


#: Per-member answers meaning "not in the group (any more)": nothing left to remove.
_GONE = ("UnknownMemberIdError", "FencedInstanceIdError", "GroupIdNotFoundError")


class Removal(threading.Thread):
    """One removal of dead members of ``group_id``, on its own thread.

    ``join_pending``: for the classic protocol, an event the consumer's thread sets once
    it has subscribed; the removal then waits (bounded) until the group is rebalancing,
    i.e. our JoinGroup is pending, so that the group is never left empty before we join
    (which would make our join wait ``group.initial.rebalance.delay.ms``).
    """

    def __init__(
        self,
        settings: AdminSettings,
        group_id: str,
        members: list[dict[str, Any]],
        join_pending: threading.Event | None,
        on_done: Callable[[list[Outcome]], None],
    ) -> None:
        super().__init__(name=f"fastrebalance-recovery-{group_id}", daemon=True)
        self._settings = settings
        self._group_id = group_id
        self._members = members
        self._join_pending = join_pending
        self._on_done = on_done
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            outcomes = self._remove()
        except Exception as exc:  # a removal never fails the consumer: the old wait
            now = time.time()
            outcomes = [Outcome(m, "failed", now, f"{type(exc).__name__}: {exc}")
                        for m in self._members]  # fmt: skip
        try:
            self._on_done(outcomes)
        finally:
            self.finished.set()

    def _remove(self) -> list[Outcome]:
        if self._settings.kwargs is None:
            now = time.time()
            return [Outcome(m, "failed", now, self._settings.refused) for m in self._members]
        from kafka.admin import KafkaAdminClient, MemberToRemove  # only when needed

        _quiet_kafka_python()
        admin = KafkaAdminClient(**self._settings.kwargs)
        try:
            if self._join_pending is not None:
                self._wait_for_join(admin)
            targets = [
                MemberToRemove(
                    member_id=m["member_id"] or None,
                    group_instance_id=m.get("group_instance_id"),
                    reason="fastrebalance: the member's process is dead (its lock was free)",
                )
                for m in self._members
            ]
            answers = admin.remove_group_members(self._group_id, targets)
        finally:
            admin.close()
        now = time.time()
        by_id = {str(k): v for k, v in answers.items()}
        outcomes = []
        for m in self._members:
            err = by_id.get(m["member_id"]) or by_id.get(str(m.get("group_instance_id")))
            name = getattr(err, "__name__", "NoError") if err is not None else "NoError"
            if name == "NoError":
                outcomes.append(Outcome(m, "removed", now))
            elif name in _GONE:
                outcomes.append(Outcome(m, "gone", now, name))
            else:
                outcomes.append(Outcome(m, "failed", now, name))
        return outcomes

    def _wait_for_join(self, admin: Any) -> None:
        """Until the group rebalances (our JoinGroup pending), at most JOIN_WAIT_S."""
        assert self._join_pending is not None
        deadline = time.monotonic() + JOIN_WAIT_S
        self._join_pending.wait(JOIN_WAIT_S)
        while time.monotonic() < deadline:
            try:
                described = admin.describe_groups([self._group_id]).get(self._group_id, {})
            except Exception:  # the coordinator moving, say: look again
                described = {}
            if described.get("group_state") in ("PreparingRebalance", "CompletingRebalance"):
                return
            time.sleep(JOIN_POLL_S)
