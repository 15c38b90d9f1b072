"""The command line without a cluster: help, usage errors, and how ``status`` reads and
shows the two commit logs (the merge and the rendering are pure, so every kind of
metadata is tried here; tests/integration/test_status.py reads them from Kafka)."""

from __future__ import annotations

import argparse
import json
import socket
import urllib.request

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException

from fastrebalance._token import (
    ChildCheckpoint,
    GroupToken,
    encode_child_checkpoint,
    encode_group_token,
)
from fastrebalance.tools._args import listen_address
from fastrebalance.tools._runner import machine_info
from fastrebalance.tools.bench import (
    OFF,
    ON,
    RAW,
    RECOVERY_CONSUMERS,
    BenchResult,
    BenchSettings,
    format_markdown,
    make_consumer,
    settings_from_args,
)
from fastrebalance.tools.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, build_parser, main
from fastrebalance.tools.status import (
    GroupStatus,
    PartitionStatus,
    ProgressTracker,
    RangeStatus,
    format_status,
    listen,
    partition_status,
)
from fastrebalance.tools.workload import CLASSIC_ONLY_KEYS, GROUP_PROTOCOLS, restart_conf


def token(position: int, *ranges: tuple[int, int], user: str = "") -> str:
    text, written = encode_group_token(GroupToken(position, tuple(ranges), user))
    assert written.ranges == tuple(ranges)
    return text


def checkpoint(start: int, end: int, offset: int) -> str:
    return encode_child_checkpoint(ChildCheckpoint(start, end, offset))


# ------------------------------------------------------------------- help, usage
def _subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)  # type: ignore[arg-type]


def test_every_command_has_help_with_exit_codes(capsys: pytest.CaptureFixture) -> None:
    assert main(["--help"]) == EXIT_OK
    top = capsys.readouterr().out
    assert "exit codes:" in top
    commands = _subcommands()
    assert {"demo", "status"} <= set(commands)
    for name in commands:
        assert main([name, "--help"]) == EXIT_OK, name
        text = capsys.readouterr().out
        assert text.startswith(f"usage: fastrebalance {name}"), name
        assert name in top, f"{name} missing from the top-level help"
    assert main(["status", "--help"]) == EXIT_OK
    text = capsys.readouterr().out
    for needle in ("--bootstrap-servers", "--group", "--topic", "--watch", "--json", "exit codes"):
        assert needle in text


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--bootstrap-servers", "x:9092"],
        ["status", "--group", "g"],
        ["status", "-b", "x:9092", "-g", "g", "-X", "novalue"],
        ["status", "-b", "x:9092", "-g", "g", "--interval", "0"],
        ["status", "-b", "x:9092", "-g", "g", "--count", "0"],
        ["status", "-b", "x:9092", "-g", "g", "--timeout", "-1"],
        # each ended in a traceback (exit 1) or a run "within nan s" before
        ["status", "-b", "x:9092", "-g", "g", "--timeout", "nan"],
        ["status", "-b", "x:9092", "-g", "g", "--prometheus", "99999"],
        ["status", "-b", "x:9092", "-g", ""],
        ["bench", "--rate", "inf"],
        ["bench", "--backlogs", "5000,,6000"],  # an empty item was dropped silently
        ["bench", "--backlogs", "5000,"],
        ["bench-spark", "--modes", "catchup,,plain"],
        ["nosuchcommand"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--count", "2"], "--count needs --watch or --prometheus"),
        (["--interval", "5"], "--interval needs --watch or --prometheus"),
        (["--json", "--prometheus", "9101"], "--json does not apply to --prometheus"),
    ],
)
def test_options_that_would_be_ignored_are_usage_errors(
    extra: list[str], why: str, capsys: pytest.CaptureFixture
) -> None:
    """Both were silently ignored (a snapshot printed once; metrics served, --json
    dropped): found by the adversary of the tools cut. Nothing is read: no cluster here."""
    assert main(["status", "-b", "127.0.0.1:9", "-g", "g", *extra]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and why in err


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("9101", ("127.0.0.1", 9101)),  # a port alone: loopback, not every interface
        ("127.0.0.1:29895", ("127.0.0.1", 29895)),  # refused as "not a valid int" before
        ("0.0.0.0:9101", ("0.0.0.0", 9101)),
        (":9101", ("0.0.0.0", 9101)),  # the exporters' spelling of every interface
        ("[::1]:9101", ("::1", 9101)),
        ("[::]:9101", ("::", 9101)),
        ("metrics.example:65535", ("metrics.example", 65535)),
    ],
)
def test_listen_address_takes_host_and_port(text: str, address: tuple[str, int]) -> None:
    assert listen_address(text) == address


@pytest.mark.parametrize(
    "text",
    ["", "0", "65536", "x", "host:", "host:port", "::1:9101", "[::1]", "[]:9101", "[[::1]]:9101",
     "1.2.3.4:-1", "1.2.3.4: 80", "١٢٣"],
)  # fmt: skip
def test_listen_address_refuses_what_is_not_host_and_port(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not"):
        listen_address(text)


@pytest.mark.parametrize("flag", ["127.0.0.1:0", "::1:9101", "9101:x"])
def test_a_bad_prometheus_address_is_a_usage_error(
    flag: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["status", "-b", "127.0.0.1:9", "-g", "g", "--prometheus", flag]) == EXIT_USAGE
    assert "[HOST:]PORT" in capsys.readouterr().err


def test_the_help_says_where_a_port_alone_listens(capsys: pytest.CaptureFixture) -> None:
    assert main(["status", "--help"]) == EXIT_OK
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--prometheus [HOST:]PORT" in help_text
    assert "A PORT alone listens on loopback (127.0.0.1) only" in help_text


def test_the_exporter_listens_on_loopback_given_a_port_alone() -> None:
    """The server's own socket says where it listens (it was every interface, 0.0.0.0)."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    port = _closed_port()
    started = listen(listen_address(str(port)), CollectorRegistry())
    server = started[0]
    try:
        assert server.socket.getsockname()[:2] == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
            assert got.status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_in_use_exits_3_naming_it(capsys: pytest.CaptureFixture) -> None:
    """Before any read of the cluster (there is none here): not a traceback, not a
    10 s wait for the first snapshot."""
    pytest.importorskip("prometheus_client")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["status", "-b", "127.0.0.1:9", "-g", "g", "--prometheus", f"127.0.0.1:{port}"]
        assert main(argv) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == ""
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err


def test_a_property_librdkafka_rejects_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    argv = ["status", "-b", "127.0.0.1:9", "-g", "g", "-X", "no.such.property=1"]
    assert main(argv) == EXIT_USAGE
    assert "no.such.property" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("as_json", [False, True])
def test_unreachable_cluster_exits_3_with_the_address(
    as_json: bool, capsys: pytest.CaptureFixture
) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    argv = ["status", "-b", bootstrap, "-g", "g", "--timeout", "1"] + ["--json"] * as_json
    assert main(argv) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert f"no Kafka broker answered at {bootstrap}" in err
    assert "FAIL" not in err, "librdkafka's own log lines must not bury the message"
    if as_json:
        assert json.loads(out)["error"] == "cluster_unreachable"
    else:
        assert out == ""


# ------------------------------------------------------ bench --group-protocol
def _bench_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_bench_group_protocol_defaults_to_classic_and_is_spelled_in_the_command() -> None:
    settings, command = settings_from_args(_bench_args("--scenario", "recovery"))
    assert settings.group_protocol == "classic"
    assert "--group-protocol classic" in command  # the report names it even by default


def test_bench_group_protocol_consumer_reaches_the_settings_and_the_command() -> None:
    args = _bench_args("--scenario", "recovery", "--group-protocol", "consumer",
                       "--backlogs", "400000", "--reps", "2")  # fmt: skip
    settings, command = settings_from_args(args)
    assert settings.group_protocol == "consumer"
    assert settings.scenarios == ("recovery",) and settings.backlogs == (400_000,)
    assert command.startswith("fastrebalance bench --scenario recovery")
    assert "--group-protocol consumer" in command


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--group-protocol", "cooperative"],  # an assignor, not a protocol
        ["bench", "--group-protocol", ""],
        # groupbench configures its members itself: the option would be ignored
        ["bench", "--scenario", "group", "--group-protocol", "consumer"],
    ],
)
def test_bench_group_protocol_usage_errors(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == EXIT_USAGE
    assert "--group-protocol" in capsys.readouterr().err


@pytest.mark.parametrize("key", CLASSIC_ONLY_KEYS)
def test_librdkafka_refuses_each_classic_only_key_under_the_consumer_protocol(key: str) -> None:
    """Pins CLASSIC_ONLY_KEYS to librdkafka: should a release accept one (or refuse
    another), the list, and the bench's config, must follow."""
    value = {"partition.assignment.strategy": "range", "group.protocol.type": "consumer"}
    conf = {**restart_conf(f"127.0.0.1:{_closed_port()}", "g", "consumer"),
            key: value.get(key, 6000)}  # fmt: skip
    with pytest.raises(KafkaException, match=r"not supported for `group\.protocol=consumer`"):
        PlainConsumer(conf)


@pytest.mark.parametrize("protocol", GROUP_PROTOCOLS)
@pytest.mark.parametrize("kind", [*RECOVERY_CONSUMERS, RAW, OFF, ON])
def test_every_bench_consumer_is_built_under_either_protocol(kind: str, protocol: str) -> None:
    """The bench's own config for every kind it measures: librdkafka builds it (no broker
    needed to construct), with group.protocol set exactly under the consumer protocol."""
    conf = restart_conf(f"127.0.0.1:{_closed_port()}", "g", protocol)
    assert ("group.protocol" in conf) == (protocol == "consumer")
    if protocol == "consumer":
        assert not set(CLASSIC_ONLY_KEYS) & set(conf)
    consumer = make_consumer(kind, conf)
    consumer.close()


def test_bench_report_names_the_group_protocol() -> None:
    for protocol, needle in (("consumer", "group.protocol=consumer"), ("classic", "classic")):
        settings = BenchSettings(scenarios=("recovery",), group_protocol=protocol)
        result = BenchResult(settings, "embedded cluster at x", machine_info(), (), (), 0, 0, 1.0)
        text = format_markdown(result, "fastrebalance bench --group-protocol " + protocol)
        assert f"Group protocol: {protocol}" in text and needle in text


# ------------------------------------------------------------- the pure merge
def test_no_commit() -> None:
    p = partition_status("t", 0, -1001, None, log_start=0, log_end=50)
    assert p.metadata == "none" and p.committed is None and p.position is None
    assert p.lag is None and not p.ranges and p.problem is None


def test_plain_offset_is_caught_up() -> None:
    p = partition_status("t", 0, 130, "", log_start=0, log_end=150)
    assert p.metadata == "plain" and p.committed == p.position == 130
    assert p.lag == p.tool_lag == 20 and p.pending == 0


def test_kip_example_crash_at_100_committed_70_end_120() -> None:
    """Right after the restart: the primary is at 120, [70, 120) pending, no checkpoint."""
    p = partition_status("t", 0, 70, token(120, (70, 120)), log_start=0, log_end=125)
    assert p.metadata == "token" and p.committed == 70 and p.position == 120
    (r,) = p.ranges
    assert (r.start, r.end, r.since, r.remaining, r.done) == (70, 120, 70, 50, 0)
    assert r.child_committed is None and r.fraction == 0.0
    assert p.pending == 50 and p.primary_lag == 5 and p.lag == 55
    assert p.tool_lag == 55  # the same here: nothing between 120 and the backlog is processed


def test_child_progress_from_both_logs() -> None:
    """Child committed 90 (its previous checkpoint was at 80), primary committed 126."""
    p = partition_status(
        "t", 0, 90, token(126, (90, 120)), 90, checkpoint(80, 120, 90), log_start=0, log_end=130
    )
    (r,) = p.ranges
    assert (r.start, r.end, r.since, r.child_committed) == (90, 120, 80, 90)
    assert r.done == 10 and r.fraction == 0.25
    assert p.lag == 30 + 4 and p.tool_lag == 40
    assert p.checkpoint == ChildCheckpoint(80, 120, 90)


def test_checkpoint_ahead_of_a_failed_group_commit_is_applied() -> None:
    """The group commit failed after the child's: the restart still starts at 100."""
    p = partition_status("t", 0, 70, token(126, (70, 120)), 100, checkpoint(70, 120, 100))
    (r,) = p.ranges
    assert (r.start, r.since, r.child_committed) == (100, 70, 100)
    assert p.committed == 70, "what Kafka stores for the group, unchanged"


def test_stale_checkpoint_of_a_finished_range_is_not_applied() -> None:
    p = partition_status("t", 0, 300, token(400, (300, 350)), 120, checkpoint(70, 120, 120))
    (r,) = p.ranges
    assert (r.start, r.end, r.since, r.child_committed) == (300, 350, 300, None)
    assert p.problem is None


def test_retention_deleted_part_of_a_range() -> None:
    p = partition_status("t", 0, 70, token(120, (70, 120)), log_start=100, log_end=120)
    assert p.ranges[0].deleted == 30


def test_application_metadata_is_foreign_but_safe() -> None:
    p = partition_status("t", 0, 130, "app-state-42", log_start=0, log_end=130)
    assert p.metadata == "foreign" and p.problem is None
    assert p.user_metadata == "app-state-42" and p.position == 130


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        ("~fr1:00000000:3c;1y+1e|", "checksum"),
        ("~fr9:abc:whatever", "version"),
        (token(126, (90, 120)), "moved by another tool"),  # stored with offset 100
    ],
)
def test_untrustworthy_token_is_a_problem(metadata: str, why: str) -> None:
    p = partition_status("t", 0, 100, metadata, log_start=0, log_end=130)
    assert p.metadata == "unreadable" and not p.ranges
    assert p.position == 100, "a restart falls back to the bare offset"
    assert p.problem is not None and why in p.problem


def test_corrupt_checkpoint_is_a_problem_the_range_stays() -> None:
    p = partition_status("t", 0, 70, token(120, (70, 120)), 90, checkpoint(70, 120, 95))
    assert p.problem is not None and "checkpoint" in p.problem
    assert p.ranges[0].start == 70


# ---------------------------------------------------------------- rendering
def _group(*partitions: PartitionStatus, taken_at: float = 1_700_000_000.0) -> GroupStatus:
    return GroupStatus("orders", "orders.catchup", "k:9092", tuple(partitions), taken_at)


def test_text_view_shows_offsets_and_bars() -> None:
    mid = partition_status(
        "orders", 0, 90, token(126, (90, 120)), 90, checkpoint(80, 120, 90), 0, 130
    )
    done = partition_status("orders", 1, 500, "", log_start=0, log_end=500)
    text = format_status(_group(mid, done), bar_width=20)
    assert "1 of 2 partitions catching up: 30 backlog records pending" in text
    row = next(line for line in text.splitlines() if line.startswith("orders [0]"))
    assert row.split()[2:7] == ["90", "126", "130", "34", "1"]
    bar = next(line for line in text.splitlines() if "backlog [90, 120)" in line)
    assert "\u2588" * 5 + "\u2591" * 15 in bar and "25% of [80, 120)" in bar
    assert "child committed 90" in bar
    assert "plain offset" in text and "safe offset" in text
    ascii_text = format_status(_group(mid, done), bar_width=20, ascii_only=True)
    assert "#" * 5 + "." * 15 in ascii_text
    ascii_text.encode("ascii")  # nothing but ASCII for terminals that cannot show blocks


def test_text_view_for_problems_and_foreign_metadata() -> None:
    bad = partition_status("orders", 0, 100, "~fr1:00000000:x|", log_start=0, log_end=130)
    foreign = partition_status("orders", 1, 7, "someone-else", log_start=0, log_end=9)
    text = format_status(_group(bad, foreign))
    assert "ignored by a restart" in text and "orders [0]: ignored commit metadata" in text
    assert "metadata not written by fastrebalance" in text
    assert _group(bad, foreign).problems
    assert "'someone-else': the offset stands alone" in format_status(_group(foreign))


def test_json_document() -> None:
    mid = partition_status(
        "orders", 0, 90, token(126, (90, 120)), 90, checkpoint(80, 120, 90), 0, 130
    )
    doc = json.loads(json.dumps(_group(mid).to_dict()))
    assert doc["schema"] == 1 and doc["group"] == "orders" and doc["catching_up"] is True
    assert doc["time"] == "2023-11-14T22:13:20+00:00"
    (p,) = doc["partitions"]
    assert (p["committed"], p["position"], p["log_end"], p["lag"], p["tool_lag"]) == (
        90,
        126,
        130,
        34,
        40,
    )
    assert p["child_checkpoint"] == {"start": 80, "end": 120, "offset": 90}
    (r,) = p["ranges"]
    assert r == {
        "start": 90,
        "end": 120,
        "remaining": 30,
        "since": 80,
        "done": 10,
        "fraction": 0.25,
        "child_committed": 90,
        "deleted": 0,
        "rate": None,
        "eta_s": None,
    }


def test_watch_tracks_the_range_from_its_first_sighting() -> None:
    """Two refreshes 10 s apart: the child went from 70 to 90 of [70, 120)."""
    tracker = ProgressTracker()
    first = partition_status("t", 0, 70, token(120, (70, 120)), log_end=120)
    seen = tracker.update(_group(first, taken_at=100.0))
    assert seen.partitions[0].ranges[0].rate is None
    later = partition_status("t", 0, 90, token(126, (90, 120)), 90, checkpoint(80, 120, 90))
    seen = tracker.update(_group(later, taken_at=110.0))
    r = seen.partitions[0].ranges[0]
    assert (r.since, r.start, r.done, r.fraction) == (70, 90, 20, 0.4)
    assert r.rate == pytest.approx(2.0) and r.eta_s == pytest.approx(15.0)
    assert "2 records/s, ETA 15 s" in format_status(seen)
    # finished: forgotten, so a later range with the same end starts afresh
    tracker.update(_group(partition_status("t", 0, 130, ""), taken_at=120.0))
    again = tracker.update(_group(later, taken_at=130.0)).partitions[0].ranges[0]
    assert again.since == 80 and again.rate is None


def test_range_status_edge_values() -> None:
    r = RangeStatus(start=5, end=5, since=5)
    assert r.remaining == 0 and r.fraction == 0.0 and r.eta_s is None
