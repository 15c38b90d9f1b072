"""parallel.rebalance.group.*: validation, and the default that leaves everything as it was."""

from __future__ import annotations

import pytest

from fastrebalance._config import (
    CHUNK_KEY,
    CLAIM_TIMEOUT_KEY,
    CLAIMS_TOPIC_KEY,
    DEFAULT_CHUNK_RECORDS,
    DEFAULT_CLAIM_TIMEOUT_MS,
    ENABLE_KEY,
    GROUP_KEY,
    TRANSACTIONAL_KEY,
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
        # the default is built from group.id, which may hold what a topic name may not
        ({"group.id": "svc/orders"}, CLAIMS_TOPIC_KEY),
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
