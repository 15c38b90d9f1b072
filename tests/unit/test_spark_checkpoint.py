"""Moving a query between Spark's format("kafka") and this source (issue 46, item 2): the
position a checkpoint holds, read from files in Spark's documented offset-log format (Spark's
Kafka connector jar is not in pyspark's wheel, and Maven's repository cannot be reached from
the machines this was written on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrebalance.spark._checkpoint import read_checkpoint
from fastrebalance.spark._offsetspec import EARLIEST
from fastrebalance.spark._options import parse_options
from fastrebalance.tools.cli import main

META = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'


def write_batch(root: Path, batch: int, *sources: object, commit: bool = True) -> None:
    """One batch of Spark's offset log: ``v1``, the metadata, one line per source."""
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    lines = ["v1", META, *(s if isinstance(s, str) else json.dumps(s) for s in sources)]
    (root / "offsets" / str(batch)).write_text("\n".join(lines))
    if commit:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_a_kafka_checkpoint_gives_the_end_of_its_last_committed_batch(tmp_path: Path) -> None:
    write_batch(tmp_path, 0, {"orders": {"0": 10, "1": 20}})
    write_batch(tmp_path, 1, {"orders": {"0": 110, "1": 120}})
    # logged, not committed: Spark would replay it, so it was not read
    write_batch(tmp_path, 2, {"orders": {"0": 210, "1": 220}}, commit=False)
    found = read_checkpoint(str(tmp_path))
    assert found.kind == "kafka" and found.batch == 1 and found.reread == 0
    assert found.offsets == {("orders", 0): 110, ("orders", 1): 120}
    assert json.loads(found.starting_offsets()) == {"orders": {"0": 110, "1": 120}}
    assert read_checkpoint(f"file://{tmp_path}").offsets == found.offsets


def test_our_checkpoint_gives_the_lowest_unread_offset_and_what_is_read_again(
    tmp_path: Path,
) -> None:
    write_batch(tmp_path, 0, {"orders": {"0": 5, "1": 5}, "@from": {"orders": {"0": 0, "1": 0}}})
    write_batch(tmp_path, 1, {"orders": {"0": [900, [100, 300], [500, 600]], "1": 800}})
    found = read_checkpoint(str(tmp_path))
    assert found.kind == "fastrebalance" and found.batch == 1
    assert found.offsets == {("orders", 0): 100, ("orders", 1): 800}
    # [100, 900) minus the 300 pending: 500 records it had read are read again
    assert found.reread == 500
    # without pending ranges it is still told apart (batch 0's @from)
    write_batch(tmp_path, 2, {"orders": {"0": 950, "1": 800}})
    assert read_checkpoint(str(tmp_path)).kind == "fastrebalance"


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda r: None, "no committed batch"),
        (lambda r: write_batch(r, 0, {"a": {"0": 1}}, commit=False), "no committed batch"),
        (lambda r: write_batch(r, 0, {"a": {"0": 1}}, {"b": {"0": 1}}), "holds 2 sources"),
        (lambda r: write_batch(r, 0, {"@initial": "latest"}), "not a Kafka offset"),
        (lambda r: write_batch(r, 0, "{not json"), "not JSON"),
    ],
)
def test_checkpoints_that_say_nothing_usable_are_refused(tmp_path: Path, write, message) -> None:
    write(tmp_path)
    with pytest.raises(ValueError, match=message):
        read_checkpoint(str(tmp_path))


def test_a_remote_checkpoint_path_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="local"):
        read_checkpoint("s3a://bucket/chk")


def _options(**extra: str):
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "orders,refunds"}
    return parse_options({**base, **extra})


def test_the_option_starts_a_new_query_at_the_checkpoint_and_new_partitions_at_earliest(
    tmp_path: Path,
) -> None:
    write_batch(tmp_path, 0, {"orders": {"0": 110, "1": 120}, "gone": {"0": 7}})
    starting = _options(startingOffsetsFromCheckpoint=str(tmp_path)).starting
    parts = [("orders", 0), ("orders", 1), ("orders", 2), ("refunds", 0)]
    assert starting.per_partition(parts) == {
        ("orders", 0): 110,
        ("orders", 1): 120,
        ("orders", 2): EARLIEST,  # appeared after the old query's last batch
        ("refunds", 0): EARLIEST,  # a topic the old query did not read
    }
    # the initial offset holds the checkpoint's offsets, the same on every call
    assert starting.spec() == {"gone": {"0": 7}, "orders": {"0": 110, "1": 120}}
    # a partition the checkpoint names that Kafka does not have: as startingOffsets
    with pytest.raises(ValueError, match="orders-1"):
        starting.per_partition([("orders", 0)])


def test_the_option_is_read_only_when_the_query_starts(tmp_path: Path) -> None:
    """A restart from the new query's own checkpoint must not need the old one."""
    options = _options(startingOffsetsFromCheckpoint=str(tmp_path / "deleted"))
    with pytest.raises(ValueError, match="no committed batch"):
        options.starting.per_partition([("orders", 0)])


@pytest.mark.parametrize("other", ["startingOffsets", "startingTimestamp"])
def test_the_option_refuses_a_second_starting_option(tmp_path: Path, other: str) -> None:
    with pytest.raises(ValueError, match=f"leave out {other}"):
        _options(startingOffsetsFromCheckpoint=str(tmp_path), **{other: "1"})


def test_the_cli_prints_starting_offsets_both_ways(tmp_path: Path, capsys) -> None:
    kafka, ours = tmp_path / "kafka", tmp_path / "ours"
    write_batch(kafka, 3, {"orders": {"0": 110}})
    write_batch(ours, 0, {"orders": {"0": 5}, "@from": {"orders": {"0": 0}}})
    write_batch(ours, 1, {"orders": {"0": [900, [100, 300]]}})
    assert main(["spark-offsets", str(kafka)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"orders": {"0": 110}} and "kafka checkpoint, batch 3" in err
    assert main(["spark-offsets", str(ours)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"orders": {"0": 100}}
    assert "reads 600 records again" in err
    assert main(["spark-offsets", str(tmp_path / "none")]) == 3
    assert "no committed batch" in capsys.readouterr().err
