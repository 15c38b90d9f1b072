"""parallel.rebalance.group.*: validation, and the default that leaves everything as it was."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrebalance._config import (
    CHUNK_KEY,
    CLAIM_TIMEOUT_KEY,
    CLAIMS_TOPIC_KEY,
    DEFAULT_CHUNK_RECORDS,
    DEFAULT_CLAIM_TIMEOUT_MS,
    ENABLE_KEY,
    GROUP_KEY,
    TRANSACTIONAL_KEY,
    default_claims_topic,
    split_config,
)

BASE = {"bootstrap.servers": "broker:9092", "group.id": "orders", ENABLE_KEY: "true"}


def test_the_exact_key_name_and_its_default_off() -> None:
    assert GROUP_KEY == "parallel.rebalance.group.catchup"
    settings, rest = split_config(BASE)
    assert settings.group_catchup is False
    assert not any(k.startswith("parallel.rebalance.") for k in rest)


def test_on_with_defaults_and_overrides() -> None:
    settings, rest = split_config({**BASE, GROUP_KEY: "true"})
    assert settings.group_catchup
    assert settings.claim_timeout_ms == DEFAULT_CLAIM_TIMEOUT_MS
    assert settings.chunk_records == DEFAULT_CHUNK_RECORDS
    assert settings.claims_topic == "orders.catchup.claims"
    assert GROUP_KEY not in rest and CLAIMS_TOPIC_KEY not in rest
    settings, _ = split_config(
        {**BASE, GROUP_KEY: True, CLAIM_TIMEOUT_KEY: "3000", CHUNK_KEY: 500, CLAIMS_TOPIC_KEY: "c"}
    )
    assert (settings.claim_timeout_ms, settings.chunk_records, settings.claims_topic) == (
        3000,
        500,
        "c",
    )


def test_needs_the_mode_on() -> None:
    with pytest.raises(ValueError, match=f"{GROUP_KEY}=true requires {ENABLE_KEY}=true"):
        split_config({"group.id": "g", GROUP_KEY: "true"})


def test_refused_with_exactly_once_naming_both_keys() -> None:
    conf = {**BASE, GROUP_KEY: "true", TRANSACTIONAL_KEY: "true", "enable.auto.commit": False}
    with pytest.raises(ValueError) as info:
        split_config(conf)
    assert GROUP_KEY in str(info.value) and TRANSACTIONAL_KEY in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (GROUP_KEY, "yes"),
        (CLAIM_TIMEOUT_KEY, 999),
        (CLAIM_TIMEOUT_KEY, "x"),
        (CHUNK_KEY, 99),
        (CHUNK_KEY, True),
        (CLAIMS_TOPIC_KEY, ""),
        (CLAIMS_TOPIC_KEY, 5),
    ],
)
def test_invalid_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        split_config({**BASE, GROUP_KEY: "true", key: value})


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({CLAIMS_TOPIC_KEY: "a b/c"}, "characters"),
        ({CLAIMS_TOPIC_KEY: "x" * 250}, "249"),
        ({CLAIMS_TOPIC_KEY: ".."}, "'.'"),
    ],
)
def test_a_claims_topic_kafka_would_refuse_is_refused_here(
    extra: dict[str, str], why: str
) -> None:
    # adversary of issue 22 (repro/r16): "a b/c" was accepted; every start of the claims
    # log then failed (TOPIC_EXCEPTION, a WARNING every 2 s) and no backlog was read at all
    # (0 of 5000 records in 20 s)
    with pytest.raises(ValueError, match=r"claims\.topic") as err:
        split_config({**BASE, GROUP_KEY: True, **extra})
    assert why in str(err.value)
    # a valid name, and an odd group.id with its own valid claims topic, are fine
    settings, _ = split_config({**BASE, GROUP_KEY: True, CLAIMS_TOPIC_KEY: "A-z_0.9"})
    assert settings.claims_topic == "A-z_0.9"
    settings, _ = split_config(
        {**BASE, "group.id": "svc/orders", GROUP_KEY: True, CLAIMS_TOPIC_KEY: "svc.claims"}
    )
    assert settings.claims_topic == "svc.claims"


def _kafka_collision_key(topic: str) -> str:
    """Kafka refuses a topic whose name equals another's once '.' is read as '_'."""
    return topic.replace(".", "_")


def test_default_claims_topics_of_two_groups_never_collide_in_kafka() -> None:
    # issue 48: app_1's claims topic existed, app.1's (app.1.catchup.claims) was refused as
    # colliding with it, and app.1's 20,000-record backlog was never read
    a, b = default_claims_topic("app_1"), default_claims_topic("app.1")
    assert _kafka_collision_key(a) != _kafka_collision_key(b)
    assert default_claims_topic("orders") == "orders.catchup.claims"  # a plain id reads as it is
    # docs/configuration.md's examples
    assert (a, b) == ("app-u1.catchup.claims", "app-d1.catchup.claims")
    settings, _ = split_config({**BASE, "group.id": "svc/orders", GROUP_KEY: True})
    assert re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", settings.claims_topic)  # any group.id


_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_any_two_group_ids_get_valid_claims_topics_kafka_keeps_apart(g1: str, g2: str) -> None:
    t1, t2 = default_claims_topic(g1), default_claims_topic(g2)
    assert _TOPIC.fullmatch(t1) and t1 not in (".", "..")
    if g1 != g2:
        assert _kafka_collision_key(t1) != _kafka_collision_key(t2)


def test_long_group_ids_keep_apart_past_the_length_limit() -> None:
    base = "x" * 300
    names = {_kafka_collision_key(default_claims_topic(base + s)) for s in ("a", "b", ".", "_")}
    assert len(names) == 4
