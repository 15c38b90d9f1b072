"""The executor's read loop over logs with offsets that hold no record, on a fake consumer.

Transaction markers, aborted records under read_committed and compacted records leave
offsets without a record. A slice then ends at its first record past ``end`` (or at
partition EOF), and that record may belong to the task's next slice of the same partition.
Issue 33's adversary lost exactly such records on Apache Kafka 3.9 (committed transactions,
aborted ones under read_committed, a compacted topic). The fake consumer here hands out a
log's records in order, in consume() results of drawn sizes, with the prefetch a seek
throws away, so that every interleaving of slice ends, gaps and result boundaries is tried.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

from fastrebalance.spark._kafka import _Reading
from fastrebalance.spark._options import parse_options
from fastrebalance.spark._plan import Slice

T = "orders"
# a read that waits for a record the log will never hold fails in 1 s, not 120
OPTIONS = parse_options(
    {"kafka.bootstrap.servers": "fake:9092", "subscribe": T, "kafkaConsumer.pollTimeoutMs": "1000"}
)


class _Record:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def topic(self) -> str:
        return T

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"%d" % self._o

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_000

    def headers(self) -> None:
        return None


class _Eof(_Record):
    def error(self) -> KafkaError:
        return KafkaError(KafkaError._PARTITION_EOF)


class FakeConsumer:
    """Each partition's records (``logs``: the offsets that hold one, below ``end``), fetched
    in order from where the partition was assigned; an EOF event at the log end, once per
    position reached, as librdkafka sends it."""

    def __init__(self, logs: dict[int, list[int]], end: int, sizes: list[int]) -> None:
        self.logs, self.end, self.sizes = logs, end, sizes or [1]
        self.position: dict[int, int] = {}
        self.eof_sent: dict[int, bool] = {}
        self.calls = 0

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            assert tp.partition not in self.position, "assigned twice"
            self.position[tp.partition] = tp.offset
            self.eof_sent[tp.partition] = False

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            del self.position[tp.partition]

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        """Up to ``num_messages``, as librdkafka: the reader asks for what its slices still
        hold summed over the task's partitions, so one partition may fill the result past
        its own slice's end. The partition served first turns with every call."""
        want = min(num_messages, self.sizes[self.calls % len(self.sizes)])
        order = sorted(self.position)
        if order:
            turn = self.calls % len(order)
            order = order[turn:] + order[:turn]
        self.calls += 1
        out: list[Any] = []
        for p in order:
            at = self.position[p]
            for o in self.logs[p]:
                if len(out) >= want:
                    break
                if o >= at:
                    out.append(_Record(p, o))
                    at = o + 1
            left = any(o >= at for o in self.logs[p])
            if len(out) < want and not left and not self.eof_sent[p]:
                at = self.end
                out.append(_Eof(p, self.end))
                self.eof_sent[p] = True
            self.position[p] = at
        return out

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        return 0, self.end


def _read(consumer: FakeConsumer, slices: list[Slice]) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    for batch in _Reading(consumer, slices, OPTIONS, batch_rows=7).run():
        rows = batch.to_pydict()
        got.extend(zip(rows["partition"], rows["offset"], strict=True))
    return got


def test_a_record_after_a_marker_that_ends_a_chunk_is_read_by_the_next_chunk() -> None:
    # the adversary's case: [(2, 4800, 6300), (2, 6300, 6800)] in one task, offset 6299 a
    # commit marker: the record at 6300 came in the same consume() result as the records
    # after it, ended the first chunk, and was dropped with the seek to 6300
    # (the task held another partition's chunk too: the reader asks consume() for what all
    # its slices still hold, so partition 2's records came past its first chunk's end)
    log = [o for o in range(4800, 6800) if o != 6299]
    other = list(range(0, 6800))
    consumer = FakeConsumer({1: other, 2: log}, 6800, sizes=[450])
    slices = [
        Slice(T, 1, 0, 6800, True),
        Slice(T, 2, 4800, 6300, True),
        Slice(T, 2, 6300, 6800, True),
    ]
    got = _read(consumer, slices)
    assert [o for p, o in got if p == 2] == log
    assert [o for p, o in got if p == 1] == other


def test_a_gap_across_a_chunk_boundary_loses_nothing_either() -> None:
    # compaction removed 95-109: the first record past the first chunk's end (111) lies
    # inside the next chunk, which starts in the gap
    log = [o for o in range(0, 300) if not 95 <= o <= 110]
    consumer = FakeConsumer({0: log, 1: list(range(300))}, 300, sizes=[64])
    slices = [Slice(T, 0, 0, 100, True), Slice(T, 0, 105, 200, True), Slice(T, 0, 250, 300, True)]
    got = _read(consumer, [*slices, Slice(T, 1, 0, 300, True)])
    assert [o for p, o in got if p == 0] == [o for o in log if o < 200 or o >= 250]
    assert [o for p, o in got if p == 1] == list(range(300))


def _slices(partition: int, end: int, cuts: list[int], taken: list[bool]) -> list[Slice]:
    bounds = sorted({0, end, *(min(c, end) for c in cuts)})
    chunks = list(itertools.pairwise(bounds))
    keep = taken * len(chunks)
    return [Slice(T, partition, a, b, True) for (a, b), k in zip(chunks, keep, strict=False) if k]


_LOG = st.lists(st.booleans(), min_size=1, max_size=100)  # which offsets hold a record
_CUTS = st.lists(st.integers(0, 100), max_size=8)  # where chunks are cut
_TAKEN = st.lists(st.booleans(), min_size=1, max_size=9)  # which chunks the task reads


@settings(max_examples=400, deadline=None)
@given(
    _LOG, _CUTS, _TAKEN, _LOG, _CUTS, _TAKEN,
    st.lists(st.integers(1, 40), min_size=1, max_size=6),  # consume() result sizes
)  # fmt: skip
def test_a_task_reads_every_record_of_its_slices_once_in_order(
    present0: list[bool], cuts0: list[int], taken0: list[bool],
    present1: list[bool], cuts1: list[int], taken1: list[bool], sizes: list[int],
) -> None:  # fmt: skip
    end = max(len(present0), len(present1))
    logs = {
        p: [o for o, here in enumerate(present) if here]
        for p, present in ((0, present0), (1, present1))
    }
    slices = _slices(0, end, cuts0, taken0) + _slices(1, end, cuts1, taken1)
    if not slices:
        return
    consumer = FakeConsumer(logs, end, sizes)
    got = _read(consumer, slices)
    for p in (0, 1):
        mine = [s for s in slices if s.partition == p]
        want = [o for o in logs[p] if any(s.start <= o < s.end for s in mine)]
        assert [o for q, o in got if q == p] == want
    assert consumer.position == {}  # let go of every partition at the end
