"""Security: the child connects exactly as the user configured; no secret ever leaks.

* The child consumer's config is the primary's, key for key and value for value (the same
  callables, not copies), minus group membership and plus the handful of keys the child
  must own: a TLS or SASL setting dropped on the way would make the child connect
  differently, or fail only after a crash, when the catch-up first needs it.
* No secret (``sasl.password``, ``ssl.*password``, private keys, OAUTHBEARER client secrets
  and config) appears in our logs, reprs, exceptions or ``catchup_status()``.

No broker: the consumers point at a closed port. A real catch-up with secrets configured,
librdkafka's own config dump included, is ``tests/integration/test_security.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaException

from fastrebalance import Consumer
from fastrebalance._config import _MEMBERSHIP_KEYS, child_config, split_config

#: What the child must set itself (its own commit log, no membership, reset=error).
CHILD_OWNED = {
    "group.id",
    "client.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "fetch.queue.backoff.ms",
}
#: The group-membership keys the child drops (plus on_commit: the user's callback must not
#: receive the child's commits).
GROUP_KEYS = set(_MEMBERSHIP_KEYS) | {"on_commit"}

SECRETS = {
    "sasl.password": "S3CRET-sasl-password",
    "ssl.key.password": "S3CRET-ssl-key-password",
    "ssl.keystore.password": "S3CRET-keystore-password",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----S3CRET-key-pem-----END PRIVATE KEY-----",
    "sasl.oauthbearer.client.secret": "S3CRET-oauth-client-secret",
    "sasl.oauthbearer.config": "principal=svc clientSecret=S3CRET-oauth-config",
}


def _oauth_cb(_config: str) -> tuple[str, float]:  # pragma: no cover - identity only
    return "token", 0.0


def _error_cb(_err: Any) -> None:  # pragma: no cover - identity only
    pass


def secure_config(**extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": "127.0.0.1:1",  # nothing listens: no broker needed
        "group.id": "payments",
        "client.id": "billing",
        "enable.parallel.rebalance": True,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc-billing",
        "sasl.kerberos.service.name": "kafka",
        "sasl.oauthbearer.method": "default",
        "sasl.oauthbearer.client.id": "billing-client",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.oauthbearer.scope": "kafka",
        "ssl.ca.location": "/etc/ssl/ca.pem",
        "ssl.certificate.location": "/etc/ssl/client.pem",
        "ssl.key.location": "/etc/ssl/client.key",
        "ssl.keystore.location": "/etc/ssl/client.p12",
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384",
        "ssl.providers": "default",
        "enable.ssl.certificate.verification": True,
        "socket.timeout.ms": 10000,
        "oauth_cb": _oauth_cb,
        "error_cb": _error_cb,
        "fetch.wait.max.ms": 10,
        # group membership, which the child must not have
        "group.instance.id": "billing-1",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 45000,
        "heartbeat.interval.ms": 3000,
        "max.poll.interval.ms": 300000,
        "auto.commit.interval.ms": 1000,
        "on_commit": lambda err, parts: None,
        **SECRETS,
    }
    conf.update(extra)
    return conf


def handle_config(**extra: Any) -> dict[str, Any]:
    """What librdkafka accepts without files or a TLS stack to load: SASL over plaintext,
    the secrets still set (librdkafka only reads them when it connects)."""
    conf = secure_config(**{"security.protocol": "SASL_PLAINTEXT", **extra})
    for key in (
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.keystore.location",
        "ssl.key.pem",
        "ssl.providers",
        "oauth_cb",
    ):
        del conf[key]  # oauth_cb: confluent-kafka waits for a first token in the constructor
    return conf


def test_child_config_is_the_primarys_minus_group_keys() -> None:
    settings, primary = split_config(secure_config())
    child = child_config(primary, settings)
    expected = {k: v for k, v in primary.items() if k not in GROUP_KEYS | CHILD_OWNED}
    inherited = {k: v for k, v in child.items() if k not in CHILD_OWNED}
    assert inherited.keys() == expected.keys()
    for key, value in expected.items():
        assert inherited[key] is value or inherited[key] == value, key
    assert child["oauth_cb"] is _oauth_cb and child["error_cb"] is _error_cb
    # every security setting arrives untouched, secrets included
    for key, value in primary.items():
        if key.startswith(("security.", "sasl.", "ssl.", "enable.ssl.")):
            assert child[key] == value, key
    assert not GROUP_KEYS & child.keys()
    assert child["group.id"] == "payments.catchup" and child["client.id"] == "billing-catchup"


def test_child_handle_is_built_from_that_config() -> None:
    """The config librdkafka actually receives for the child is that one (and librdkafka
    accepts it: a mistyped or dropped property would fail here, not after a crash)."""
    c = Consumer(handle_config())
    try:
        child = c._child
        assert child is not None
        settings, primary = split_config(handle_config())
        assert child._conf.keys() == child_config(primary, settings).keys()
        child.handle()  # librdkafka validates the whole config here
        assert c.child_consumer_is_alive()
    finally:
        c.close()


def _leaks(text: str) -> list[str]:
    needles = [*SECRETS.values(), "S3CRET"]
    return [n for n in needles if n in text]


def test_no_secret_in_repr_status_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fastrebalance")
    c = Consumer(handle_config())
    try:
        c._child.handle()  # the child's start is logged
        texts = [repr(c), str(c), repr(c.catchup_status()), repr(c._settings)]
        texts += [repr(c._child), repr(c._child.state)]
    finally:
        c.close()
    texts += [r.getMessage() for r in caplog.records]
    assert any("child consumer started" in t for t in texts), "the child's start was logged"
    for text in texts:
        assert not _leaks(text), text


@pytest.mark.parametrize(
    ("extra", "exc"),
    [
        ({"parallel.rebalance.lag.threshold": "lots"}, ValueError),
        ({"parallel.rebalance.metadata.max.bytes": 10}, ValueError),
        ({"parallel.rebalance.catchup.group.id": "payments"}, ValueError),
        ({"parallel.rebalance.colour": "blue"}, ValueError),
        ({"enable.parallel.rebalance": "ture"}, ValueError),
        ({"group.id": None}, ValueError),
        ({"auto.commit.interval.ms": "soon"}, ValueError),
        ({"security.protocol": "bogus"}, KafkaException),  # librdkafka's own rejection
        ({"sasl.mechanism": "BOGUS"}, KafkaException),
    ],
)
def test_no_secret_in_config_errors(extra: dict[str, Any], exc: type[Exception]) -> None:
    conf = handle_config(**extra)
    if conf.get("group.id") is None:
        del conf["group.id"]
    with pytest.raises(exc) as info:
        Consumer(conf).close()
    text = str(info.value) + repr(info.value)
    assert not _leaks(text), text
    key = next(iter(extra))
    if exc is ValueError:
        assert key in text, f"the error must name {key}: {text}"


def test_the_key_named_in_an_error_never_carries_a_secret_value() -> None:
    """Our ValueErrors echo the value given, but only for our own keys, which never hold
    secrets; a secret put in one by mistake is not echoed either when it is valid."""
    conf = handle_config(**{"parallel.rebalance.catchup.group.id": SECRETS["sasl.password"]})
    Consumer(conf).close()  # accepted, no error to leak through
