"""split_config() and child_config(): validation messages, key removal, the child's config."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrebalance._config import (
    CATCHUP_GROUP_KEY,
    CHUNK_KEY,
    CLAIM_TIMEOUT_KEY,
    CLAIMS_TOPIC_KEY,
    CONFIG_KEYS,
    DEFAULT_LAG_THRESHOLD,
    ENABLE_KEY,
    GROUP_KEY,
    METADATA_MAX_KEY,
    REMOVE_DEAD_KEY,
    STATE_DIR_KEY,
    THRESHOLD_KEY,
    TRANSACTIONAL_KEY,
    UNCOMMITTED_KEY,
    ParallelConfig,
    child_config,
    split_config,
)
from fastrebalance._membership import default_state_dir
from fastrebalance._token import DEFAULT_METADATA_MAX_BYTES

BASE = {"bootstrap.servers": "broker:9092", "group.id": "orders"}
OURS = (
    ENABLE_KEY,
    THRESHOLD_KEY,
    CATCHUP_GROUP_KEY,
    METADATA_MAX_KEY,
    TRANSACTIONAL_KEY,
    GROUP_KEY,
    CLAIM_TIMEOUT_KEY,
    CHUNK_KEY,
    CLAIMS_TOPIC_KEY,
    REMOVE_DEAD_KEY,
    STATE_DIR_KEY,
    UNCOMMITTED_KEY,
)


def enabled(**extra) -> dict:
    return {**BASE, ENABLE_KEY: "true", **extra}


def test_our_keys_are_the_documented_ones() -> None:
    assert set(CONFIG_KEYS) == set(OURS)
    assert ENABLE_KEY == "enable.parallel.rebalance"
    assert THRESHOLD_KEY == "parallel.rebalance.lag.threshold"
    assert CATCHUP_GROUP_KEY == "parallel.rebalance.catchup.group.id"
    assert METADATA_MAX_KEY == "parallel.rebalance.metadata.max.bytes"


# -- rejections name the key -------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ENABLE_KEY, "ture"),
        (ENABLE_KEY, ""),
        (ENABLE_KEY, "yes"),
        (ENABLE_KEY, 2),
        (ENABLE_KEY, None),
        (THRESHOLD_KEY, -1),
        (THRESHOLD_KEY, "-1"),
        (THRESHOLD_KEY, "x"),
        (THRESHOLD_KEY, ""),
        (THRESHOLD_KEY, True),
        (THRESHOLD_KEY, False),
        (THRESHOLD_KEY, 1.5),
        (THRESHOLD_KEY, "1.5"),
        (THRESHOLD_KEY, None),
        (CATCHUP_GROUP_KEY, "orders"),  # == group.id: the child would join the user's group
        (CATCHUP_GROUP_KEY, ""),
        (CATCHUP_GROUP_KEY, 7),
        (METADATA_MAX_KEY, 10),
        (METADATA_MAX_KEY, 255),
        (METADATA_MAX_KEY, (1 << 20) + 1),
        (METADATA_MAX_KEY, "lots"),
        (METADATA_MAX_KEY, True),
    ],
)
def test_invalid_value_names_its_key(key: str, value) -> None:
    conf = enabled(**{key: value})
    with pytest.raises(ValueError) as info:
        split_config(conf)
    message = str(info.value)
    assert key in message
    assert repr(value) in message  # and shows what was given
    assert conf[key] == value, "the caller's dict must not be modified"


@pytest.mark.parametrize(("key", "value"), [(THRESHOLD_KEY, -1), (METADATA_MAX_KEY, 10)])
def test_numbers_are_validated_even_when_disabled(key: str, value) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        split_config({**BASE, key: value})


@pytest.mark.parametrize(
    "key", ["parallel.rebalance.foo", "parallel.rebalance.lag.thresold", "parallel.rebalance."]
)
def test_unknown_key_is_named(key: str) -> None:
    for conf in (enabled(**{key: 1}), {**BASE, key: 1}):
        with pytest.raises(ValueError) as info:
            split_config(conf)
        assert repr(key) in str(info.value)
        assert THRESHOLD_KEY in str(info.value)  # and the valid ones are listed


@pytest.mark.parametrize("group", [None, ""])
def test_enabled_requires_group_id(group) -> None:
    conf = {"bootstrap.servers": "b:9092", ENABLE_KEY: True}
    if group is not None:
        conf["group.id"] = group
    with pytest.raises(ValueError) as info:
        split_config(conf)
    assert "group.id" in str(info.value)


def test_config_must_be_a_mapping() -> None:
    with pytest.raises(TypeError):
        split_config([("group.id", "g")])  # type: ignore[arg-type]


# -- accepted values ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        ("true", True),
        (" TRUE ", True),
        ("True", True),
        (False, False),
        ("false", False),
    ],
)
def test_enable_accepts_bools_and_strings(value, expected: bool) -> None:
    settings_, _ = split_config({**BASE, ENABLE_KEY: value})
    assert settings_.enabled is expected


@settings(max_examples=100, deadline=None)
@given(
    threshold=st.integers(0, 10**12),
    as_text=st.booleans(),
    max_bytes=st.integers(256, 1 << 20),
)
def test_valid_numbers_round_trip(threshold: int, as_text: bool, max_bytes: int) -> None:
    conf = enabled(
        **{
            THRESHOLD_KEY: str(threshold) if as_text else threshold,
            METADATA_MAX_KEY: str(max_bytes) if as_text else max_bytes,
        }
    )
    settings_, rest = split_config(conf)
    assert settings_.lag_threshold == threshold
    assert settings_.metadata_max_bytes == max_bytes
    assert not set(OURS) & set(rest)


def test_defaults() -> None:
    settings_, rest = split_config(enabled())
    assert settings_.state_dir == default_state_dir()  # dead members removed at start
    assert settings_ == ParallelConfig(
        state_dir=default_state_dir(),
        enabled=True,
        lag_threshold=DEFAULT_LAG_THRESHOLD,
        catchup_group_id="orders.catchup",
        metadata_max_bytes=DEFAULT_METADATA_MAX_BYTES,
        auto_commit=True,
        auto_commit_interval_s=5.0,
        auto_offset_store=True,
        incremental=False,
        catch_up_uncommitted=True,  # a log never committed catches up (earliest)
    )
    assert CONFIG_KEYS[UNCOMMITTED_KEY][0] == "true"
    assert rest == {**BASE, "enable.auto.commit": False}


def test_disabled_is_a_plain_consumer() -> None:
    conf = {
        **BASE,
        ENABLE_KEY: "false",
        THRESHOLD_KEY: 5,
        CATCHUP_GROUP_KEY: "x",
        METADATA_MAX_KEY: 1000,
        "enable.auto.commit": True,
    }
    settings_, rest = split_config(conf)
    assert settings_ == ParallelConfig(enabled=False)
    assert rest == {**BASE, "enable.auto.commit": True}, "librdkafka's auto-commit untouched"
    # no group.id needed either
    settings_, rest = split_config({"bootstrap.servers": "b"})
    assert not settings_.enabled and rest == {"bootstrap.servers": "b"}


def test_our_keys_removed_and_input_untouched() -> None:
    conf = enabled(**{THRESHOLD_KEY: "0", CATCHUP_GROUP_KEY: "orders-cu", METADATA_MAX_KEY: "2048"})
    snapshot = dict(conf)
    settings_, rest = split_config(conf)
    assert conf == snapshot
    assert not set(OURS) & set(rest)
    assert rest["bootstrap.servers"] == "broker:9092" and rest["group.id"] == "orders"
    assert settings_.lag_threshold == 0
    assert settings_.catchup_group_id == "orders-cu"
    assert settings_.metadata_max_bytes == 2048


@pytest.mark.parametrize(
    ("value", "remembered"),
    [(None, True), (True, True), ("true", True), (False, False), ("false", False), ("0", False)],
)
def test_auto_commit_forced_off_and_remembered(value, remembered: bool) -> None:
    conf = enabled(**({} if value is None else {"enable.auto.commit": value}))
    settings_, rest = split_config(conf)
    assert rest["enable.auto.commit"] is False
    assert settings_.auto_commit is remembered


BOOL_SPELLINGS = [True, False, 1, 0, "true", "FALSE", "True", "t", "F", "1", "0",
                  "yes", "no", "on", "off", " true", "2", 2, 1.0, None]  # fmt: skip


@pytest.mark.parametrize("key", ["enable.auto.commit", "enable.auto.offset.store"])
@pytest.mark.parametrize("value", BOOL_SPELLINGS, ids=repr)
def test_booleans_we_read_are_read_as_librdkafka_reads_them(key: str, value) -> None:
    """Repro adv3-04: a boolean this library reads before librdkafka (it replaces the
    feature) is accepted and refused exactly as confluent_kafka.Consumer does it, with the
    same exception. Side by side, no broker needed."""
    from confluent_kafka import Consumer as PlainConsumer

    conf = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "log_level": 0, key: value}
    try:
        PlainConsumer(conf).close()
        plain: type[Exception] | None = None
    except KafkaException:
        plain = KafkaException
    if plain is None:
        split_config(enabled(**{key: value}))
    else:
        with pytest.raises(plain, match="Expected bool value"):
            split_config(enabled(**{key: value}))


def test_commit_settings_are_carried_over() -> None:
    settings_, rest = split_config(
        enabled(**{"auto.commit.interval.ms": "250", "enable.auto.offset.store": "false"})
    )
    assert settings_.auto_commit_interval_s == 0.25
    assert settings_.auto_offset_store is False
    assert rest["enable.auto.offset.store"] == "false", "librdkafka still needs it"
    with pytest.raises(ValueError, match=r"auto\.commit\.interval\.ms"):
        split_config(enabled(**{"auto.commit.interval.ms": "soon"}))


@pytest.mark.parametrize(
    ("extra", "incremental"),
    [
        ({}, False),
        ({"partition.assignment.strategy": "range,roundrobin"}, False),
        ({"partition.assignment.strategy": "cooperative-sticky"}, True),
        ({"group.protocol": "consumer"}, True),
        ({"group.protocol": "CONSUMER"}, True),
        ({"group.protocol": "classic"}, False),
    ],
)
def test_incremental_detection(extra: dict, incremental: bool) -> None:
    settings_, _ = split_config(enabled(**extra))
    assert settings_.incremental is incremental


# -- the child's config ----------------------------------------------------------------
def test_child_config() -> None:
    def error_cb(err):  # pragma: no cover - identity only
        pass

    def oauth_cb(conf):  # pragma: no cover
        pass

    def on_assign(c, p):  # pragma: no cover
        pass

    logger = object()
    user = {
        **BASE,
        ENABLE_KEY: True,
        "client.id": "billing",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
        "error_cb": error_cb,
        "oauth_cb": oauth_cb,
        "logger": logger,
        "on_commit": lambda err, parts: None,
        "fetch.max.bytes": 1234,
        "auto.offset.reset": "earliest",
        "group.instance.id": "static-1",
        "partition.assignment.strategy": "cooperative-sticky",
        "group.protocol": "classic",
        "group.protocol.type": "consumer",
        "group.remote.assignor": "uniform",
        "session.timeout.ms": 45000,
        "heartbeat.interval.ms": 3000,
        "max.poll.interval.ms": 300000,
        "auto.commit.interval.ms": 1000,
        "on_assign": on_assign,
        "on_revoke": on_assign,
        "on_lost": on_assign,
    }
    settings_, primary = split_config(user)
    child = child_config(primary, settings_)

    for key in (
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.endpoint.identification.algorithm",
        "fetch.max.bytes",
    ):
        assert child[key] == user[key], key
    assert child["error_cb"] is error_cb
    assert child["oauth_cb"] is oauth_cb
    assert child["logger"] is logger
    for key in (
        "group.instance.id",
        "partition.assignment.strategy",
        "group.protocol",
        "group.protocol.type",
        "group.remote.assignor",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "auto.commit.interval.ms",
        "on_assign",
        "on_revoke",
        "on_lost",
        "on_commit",  # the user's commit callback must not see the child's commits
        *OURS,
    ):
        assert key not in child, key
    assert child["group.id"] == "orders.catchup"
    assert child["client.id"] == "billing-catchup"
    assert child["auto.offset.reset"] == "error"
    assert child["enable.auto.commit"] is False
    assert child["enable.auto.offset.store"] is False
    assert child["enable.partition.eof"] is True
    # the primary's config is not modified by deriving the child's
    assert primary["group.id"] == "orders" and primary["client.id"] == "billing"
    assert primary["on_assign"] is on_assign


def test_child_config_default_client_id_and_custom_group() -> None:
    settings_, primary = split_config(enabled(**{CATCHUP_GROUP_KEY: "orders-backlog"}))
    child = child_config(primary, settings_)
    assert child["client.id"] == "rdkafka-catchup"
    assert child["group.id"] == "orders-backlog"
    assert "client.id" not in primary


def test_child_fetch_queue_backoff_defaults_short_but_user_value_wins() -> None:
    settings_, primary = split_config(enabled())
    assert child_config(primary, settings_)["fetch.queue.backoff.ms"] == 10
    settings_, primary = split_config(enabled(**{"fetch.queue.backoff.ms": 500}))
    assert child_config(primary, settings_)["fetch.queue.backoff.ms"] == 500
    assert primary["fetch.queue.backoff.ms"] == 500  # the primary keeps the user's value


def test_child_fetch_wait_is_short_for_group_catchup_whatever_the_primarys() -> None:
    """A chunk's cost must not be a fetch wait (group-wide catch-up): the user's value is
    the primary's, for its long poll at the log end; the child's is at most 10 ms (set to
    500, each 5,000-record chunk cost 200 ms: the adversary of issue 32)."""
    settings_, primary = split_config(enabled(**{"parallel.rebalance.group.catchup": True}))
    assert child_config(primary, settings_)["fetch.wait.max.ms"] == 10
    assert "fetch.wait.max.ms" not in primary  # the primary keeps librdkafka's default
    settings_, primary = split_config(
        enabled(**{"parallel.rebalance.group.catchup": True, "fetch.wait.max.ms": 200})
    )
    assert child_config(primary, settings_)["fetch.wait.max.ms"] == 10
    assert primary["fetch.wait.max.ms"] == 200
    settings_, primary = split_config(
        enabled(**{"parallel.rebalance.group.catchup": True, "fetch.wait.max.ms": "5"})
    )
    assert child_config(primary, settings_)["fetch.wait.max.ms"] == 5
    settings_, primary = split_config(enabled())
    assert "fetch.wait.max.ms" not in child_config(primary, settings_)


def test_transactional_mode_requires_auto_commit_off() -> None:
    with pytest.raises(ValueError, match=r"enable\.auto\.commit=false"):
        split_config(enabled(**{TRANSACTIONAL_KEY: "true"}))
    settings, rest = split_config(
        enabled(**{TRANSACTIONAL_KEY: True, "enable.auto.commit": False})
    )
    assert settings.transactional and not settings.auto_commit
    assert TRANSACTIONAL_KEY not in rest
