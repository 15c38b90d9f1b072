"""The driver's log-end fetch against a fake client: batching, and one bad partition."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrebalance.spark._fetcher import OffsetFetcher
from fastrebalance.spark._options import parse_options


class FakeClient:
    """offsets_for_times as librdkafka answers it: one partition without a leader fails the
    whole call (NOT_LEADER_FOR_PARTITION), as on a real broker right after a topic is made."""

    def __init__(self, leaderless: set[int]) -> None:
        self.leaderless = leaderless
        self.calls: list[int] = []

    def offsets_for_times(self, query: list[TopicPartition], timeout: float) -> list:
        self.calls.append(len(query))
        if any(tp.partition in self.leaderless for tp in query):
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return [TopicPartition(tp.topic, tp.partition, 1000 + tp.partition) for tp in query]


def fetcher_with(client: FakeClient) -> OffsetFetcher:
    options = parse_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "fetchOffset.retryIntervalMs": "0"}
    )
    fetcher = OffsetFetcher(options)
    fetcher._client = lambda: client  # type: ignore[assignment,method-assign,return-value]
    return fetcher


def test_all_partitions_in_one_call() -> None:
    client = FakeClient(set())
    got = fetcher_with(client).offsets([("t", p) for p in range(1000)], -1)
    assert got == {("t", p): 1000 + p for p in range(1000)}
    assert client.calls == [1000]


def test_one_leaderless_partition_does_not_hide_the_others() -> None:
    client = FakeClient({613})
    got = fetcher_with(client).offsets([("t", p) for p in range(1000)], -1)
    assert set(got) == {("t", p) for p in range(1000)} - {("t", 613)}
    # split in halves to find it: a few dozen calls per try, not one per partition
    assert len(client.calls) <= 3 * 2 * 11, len(client.calls)
