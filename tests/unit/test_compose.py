"""docker-compose.yml is checked without a Docker engine: it parses, and its pieces agree."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # PyYAML comes with the docs extra that make test installs

COMPOSE = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())


def test_single_node_kraft_kafka_on_localhost_9092():
    kafka = COMPOSE["services"]["kafka"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "9092:9092" in kafka["ports"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "PLAINTEXT://localhost:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@")
    listeners = {entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")}
    mapped = {
        entry.split(":")[0] for entry in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    }
    assert listeners <= mapped, "every listener needs a security protocol"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1


def test_demo_profile_reaches_the_broker_through_an_advertised_listener():
    demo = COMPOSE["services"]["demo"]
    assert demo["profiles"] == ["demo"], "a plain `up` must not start the demo"
    command = " ".join(demo["command"])
    bootstrap = command.split("--bootstrap-servers ")[1].split()[0]
    advertised = COMPOSE["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert bootstrap in advertised, (bootstrap, advertised)
    assert demo["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_kafka4_profile_serves_the_consumer_protocol_like_shared_kafka4():
    """Configured like ../shared/kafka4, where CI runs the kafka4 tests (its server.properties
    is compared key by key where it sits beside the checkout)."""
    kafka4 = COMPOSE["services"]["kafka4"]
    env = kafka4["environment"]
    assert kafka4["profiles"] == ["kafka4"], "a plain `up` starts only the 3.9 broker"
    assert kafka4["image"].startswith("apache/kafka:4.")
    assert "PLAINTEXT://localhost:9192" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "9192:9192" in kafka4["ports"]
    assert "localhost:9192" in " ".join(kafka4["healthcheck"]["test"])
    assert env["CLUSTER_ID"] != COMPOSE["services"]["kafka"]["environment"]["CLUSTER_ID"]
    assert "consumer" in env["KAFKA_GROUP_COORDINATOR_REBALANCE_PROTOCOLS"].split(",")
    shared = Path(__file__).parents[3] / "shared" / "kafka4" / "config" / "server.properties"
    if not shared.exists():
        return
    props = dict(
        line.split("=", 1) for line in shared.read_text().splitlines() if "=" in line
        and not line.startswith("#")
    )
    for key in (
        "group.initial.rebalance.delay.ms",
        "group.min.session.timeout.ms",
        "group.consumer.min.session.timeout.ms",
        "group.consumer.min.heartbeat.interval.ms",
        "num.partitions",
        "offsets.topic.replication.factor",
    ):
        variable = "KAFKA_" + key.upper().replace(".", "_")
        assert str(env[variable]) == props[key], (key, env[variable], props[key])
