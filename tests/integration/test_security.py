"""No secret leaks during a real crash-and-catch-up, librdkafka's own logs included.

The consumer is configured with SASL and TLS secrets (unused on the plaintext test cluster,
which librdkafka accepts) and ``debug=conf``, so both handles, the primary and the child,
dump their whole configuration into the ``logger`` we capture. librdkafka redacts the
properties it knows to be sensitive; this proves that neither our code nor the child's
construction undoes that. Pure config checks: ``tests/unit/test_security.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from fastrebalance import Consumer, TopicPartition

from .helpers import base_conf, drain, group_metadata, produce

pytestmark = pytest.mark.integration

SECRETS = {
    "sasl.password": "S3CRET-sasl-password",
    "ssl.key.password": "S3CRET-ssl-key-password",
    "ssl.keystore.password": "S3CRET-keystore-password",
    "sasl.oauthbearer.client.secret": "S3CRET-oauth-client-secret",
    "sasl.oauthbearer.config": "clientSecret=S3CRET-oauth-config",
}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_no_secret_in_logs_during_a_catch_up(
    kafka_cluster: Any, topic_factory: Callable[..., str], unique_group: str
) -> None:
    bs, topic = kafka_cluster.bootstrap_servers, topic_factory(1)
    produce(bs, topic, 120)
    capture = _Capture()
    ours = logging.getLogger("fastrebalance")
    rdkafka = logging.getLogger("test.rdkafka")
    for logger in (ours, rdkafka):
        logger.addHandler(capture)
    level = ours.level
    ours.setLevel(logging.DEBUG)
    rdkafka.setLevel(logging.DEBUG)
    errors: list[Any] = []
    conf = base_conf(
        bs,
        unique_group,
        logger=rdkafka,
        error_cb=errors.append,
        debug="conf",
        **{"sasl.username": "svc", "sasl.mechanism": "PLAIN", **SECRETS},
    )
    try:
        c = Consumer(conf)
        c.assign([TopicPartition(topic, 0, 70)])  # the previous incarnation committed 70
        c.commit(offsets=[TopicPartition(topic, 0, 70)], asynchronous=False)
        c.close()
        c = Consumer(conf)  # the restart: catch-up of [70, 120)
        try:
            c.assign([TopicPartition(topic, 0)])
            produce(bs, topic, 5, start=120)
            drain(c, lambda ms: len(ms) >= 55)
            c.commit(offsets=[TopicPartition(topic, 0, 125)], asynchronous=False)
            texts = [repr(c), repr(c.catchup_status()), *map(str, errors)]
            texts.append(group_metadata(bs, unique_group, topic)[1])
        finally:
            c.close()
    finally:
        for logger in (ours, rdkafka):
            logger.removeHandler(capture)
        ours.setLevel(level)
    texts += capture.lines
    dumps = [t for t in capture.lines if "sasl.password" in t]
    assert len(dumps) >= 3, "librdkafka dumped the configs: two primaries and the child"
    assert any("child consumer started" in t for t in capture.lines)
    leaks = [t for t in texts if "S3CRET" in t]
    assert not leaks, leaks[:5]
