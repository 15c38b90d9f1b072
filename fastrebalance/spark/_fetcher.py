"""The driver's view of Kafka: the partitions a query reads and their log ends.

Spark asks for the latest offset every ~10 ms while a query is idle, and after a restart the
source polls the log ends while it waits for a live record, so these fetches are batched:
one metadata request lists every topic, and one ListOffsets request per broker gives the log
ends of all partitions (``Consumer.offsets_for_times`` with the special timestamps -1 and -2,
grouped by leader by librdkafka, in the consumer's isolation level). A per-partition
watermark query cost 581 ms per planning call at 256 partitions (issue 19).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ._options import SourceOptions
from ._plan import Marks, TopicPartitionKey

__all__ = ["OffsetFetcher"]

log = logging.getLogger("fastrebalance.spark")

#: How often the partition list, and the log starts, are fetched again without being asked.
#: Log starts only move with retention; the executors' reads detect deleted records anyway.
_REFRESH_S = 5.0
_LATEST, _EARLIEST = -1, -2


class OffsetFetcher:
    """The partitions and watermarks of the subscription, cached briefly.

    Watermarks are reused for ``watermark_cache_s``, the partition list and the log starts
    for a few seconds. The consumer is created on first use: this object lives in the reader,
    which Spark pickles. Thread ownership: the consumer is used only by the thread that calls
    this object (Spark's source runner serves the reader from one thread).
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._partitions: list[TopicPartitionKey] = []
        self._partitions_at = float("-inf")
        self._marks: dict[TopicPartitionKey, Marks] = {}
        self._marks_at = float("-inf")
        self._lows: dict[TopicPartitionKey, int] = {}
        self._lows_at = float("-inf")
        # The last thing a broker connection said (librdkafka's error_cb): why a call failed.
        self._last_error: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Never ship a live handle (or its cache) to an executor.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    def _client(self) -> Consumer:
        if self._consumer is None:
            conf = self._options.consumer_config("driver")
            self._consumer = Consumer({**conf, "error_cb": self._on_error})
        return self._consumer

    def _on_error(self, err: KafkaError) -> None:
        # "1/1 brokers are down" follows every failed connection and says less than it does
        if err.code() != KafkaError._ALL_BROKERS_DOWN:
            self._last_error = err.str()

    def partitions(self, *, refresh: bool = False) -> list[TopicPartitionKey]:
        """The partitions the subscription reads now: one metadata request for all topics."""
        now = time.monotonic()
        if refresh or now - self._partitions_at > _REFRESH_S:
            self._partitions = self._options.subscription.select(self.topics())
            self._partitions_at = now
        return list(self._partitions)

    def topics(self) -> dict[str, list[int]]:
        """``{topic: partitions}`` of the cluster (topics with an error left out)."""
        md = self._retry(lambda: self._client().list_topics(timeout=10))
        out: dict[str, list[int]] = {}
        for name, meta in md.topics.items():
            if meta.error is not None:
                log.debug("topic %s has no metadata (%s)", name, meta.error)
                continue
            out[name] = sorted(meta.partitions)
        return out

    def marks(self, *, refresh: bool = False, lows: bool = False) -> dict[TopicPartitionKey, Marks]:
        """Watermarks of every partition read; ``refresh`` bypasses the cache of log ends,
        ``lows`` that of log starts (refreshed every few seconds anyway, and for a partition
        seen for the first time or whose log end fell below its cached start)."""
        now = time.monotonic()
        if refresh or now - self._marks_at > self._options.watermark_cache_s:
            parts = self.partitions(refresh=refresh and lows)
            highs = self.offsets(parts, _LATEST)
            stale = [tp for tp in highs if tp not in self._lows or highs[tp] < self._lows[tp]]
            if lows or stale or now - self._lows_at > _REFRESH_S:
                self._lows = self.offsets(parts, _EARLIEST)
                self._lows_at = now
            self._marks = {
                tp: Marks(min(self._lows[tp], high), high)
                for tp, high in highs.items()
                if tp in self._lows
            }
            self._marks_at = time.monotonic()
        return dict(self._marks)

    def offsets(self, parts: Iterable[TopicPartitionKey], at: int) -> dict[TopicPartitionKey, int]:
        """ListOffsets for many partitions at once: -1 log ends, -2 log starts, or a timestamp
        (the first offset at or after it, -1 if there is none). A partition that still fails
        after fetchOffset.numRetries tries is left out: the plan stands still on it."""
        todo = sorted(set(parts))
        out: dict[TopicPartitionKey, int] = {}
        for attempt in range(self._options.fetch_retries):
            if attempt:
                time.sleep(self._options.fetch_retry_interval_s * attempt)
            todo = self._ask(todo, at, out)
            if not todo:
                break
        if todo:
            log.warning("no offsets for %d partition(s) this time: %s", len(todo), todo[:5])
        return out

    def _ask(
        self, parts: list[TopicPartitionKey], at: int, out: dict[TopicPartitionKey, int]
    ) -> list[TopicPartitionKey]:
        """One request per broker for ``parts``; returns those without an answer.

        One partition without a leader (a new topic, a leader election) fails the whole call,
        so a failed call is split in halves, recursively, to get every other answer and find
        the few that fail: about 2·log2(n) calls for one bad partition among n.
        """
        if not parts:
            return []
        query = [TopicPartition(t, p, at) for t, p in parts]
        try:
            found = self._client().offsets_for_times(query, timeout=10)
        except KafkaException as exc:
            if len(parts) == 1:
                log.debug("ListOffsets %s: %s", parts[0], exc)
                return parts
            half = len(parts) // 2
            return self._ask(parts[:half], at, out) + self._ask(parts[half:], at, out)
        failed = []
        for tp in found:
            key = (tp.topic, tp.partition)
            if tp.error is None and (tp.offset >= 0 or at >= 0):
                out[key] = tp.offset if tp.offset >= 0 else -1
            else:
                failed.append(key)
        return failed

    def offsets_for_times(
        self, stamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """Each partition's first offset at or after its timestamp (ms), or -1 if none."""
        out: dict[TopicPartitionKey, int] = {}
        for ts in sorted(set(stamps.values())):
            found = self.offsets([tp for tp, t in stamps.items() if t == ts], ts)
            missing = set(tp for tp, t in stamps.items() if t == ts) - set(found)
            if missing:
                raise RuntimeError(f"no answer to ListOffsets by timestamp for {sorted(missing)}")
            out.update(found)
        return out

    def _retry(self, call: Any) -> Any:
        """fetchOffset.numRetries tries: a broker restart should not fail the whole query.

        The last failure is raised with what the user can act on: librdkafka says only
        "Broker transport failure" after each try's timeout (30 s with the defaults), while
        its error callback had said why at once (e.g. "SSL handshake failed ... connecting to
        a PLAINTEXT broker listener?"). A config librdkafka refuses is not tried again.
        """
        tries = self._options.fetch_retries
        for attempt in range(tries):
            try:
                return call()
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.code() == KafkaError._INVALID_ARG:
                    raise
                if attempt == tries - 1:
                    raise self._unreachable(exc, err, tries) from exc
                time.sleep(self._options.fetch_retry_interval_s * (attempt + 1))
        raise AssertionError("unreachable")

    def _unreachable(
        self, exc: KafkaException, err: KafkaError | None, tries: int
    ) -> KafkaException:
        """``exc`` with the brokers and security.protocol tried, and the brokers' last word
        (the KafkaError code is kept)."""
        if self._consumer is not None:
            self._consumer.poll(0)  # serves the error callbacks queued meanwhile
        kafka = self._options.kafka
        protocol = kafka.get("security.protocol", "PLAINTEXT (the default)")
        message = (
            f"Kafka at kafka.bootstrap.servers={kafka.get('bootstrap.servers')} with"
            f" kafka.security.protocol={protocol} did not answer after {tries} tries"
            f" (fetchOffset.numRetries): {err.str() if err is not None else exc}"
        )
        if self._last_error:
            message += f"; last connection error: {self._last_error}"
        return KafkaException(KafkaError(err.code() if err is not None else -1, message))

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()
