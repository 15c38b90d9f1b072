"""Generated call sequences (hypothesis stateful testing, issue 44): confluent-kafka's
consumer and ours, mode off and on, receive the same random sequence of calls without a
broker (wrong types, None and empty values, hand-built messages, close() anywhere in the
sequence) and must answer each call alike: the value returned, or the exception type and
error code. The one difference kept on purpose (docs/api.md) is asserted as such.

Calls that would queue a request for the broker are left out: confluent-kafka's own
close() then waits for the broker (a synchronous commit of a real offset never returns).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from ._differential import FLAVOURS, UNREACHABLE, make, outcome

pytestmark = pytest.mark.timeout(300)

PARTITIONS = st.sampled_from(
    [[], [TopicPartition("t", 0)], (TopicPartition("t", 0),), None, ["t"]]
)
TIMEOUTS = st.sampled_from([0, 0.0, None, "1", 0.01])
MESSAGES = st.sampled_from(
    [
        None,
        Message(topic="t"),
        Message(topic="t", partition=0),
        Message(topic="t", partition=0, offset=3, error=KafkaError(KafkaError._PARTITION_EOF)),
        "not a message",
    ]
)
LOGICAL = st.sampled_from([None, [], [TopicPartition("t", 0)], (TopicPartition("t", 0),), 5])


class SameAnswers(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        conf = {"bootstrap.servers": UNREACHABLE, "group.id": "g", "socket.timeout.ms": 2000}
        self.consumers = {f: make(f, **conf) for f in FLAVOURS}
        self.closed = False

    def same(self, call: Any, on_differs: tuple[Any, ...] | None = None) -> None:
        got = {f: outcome(lambda c=c: call(c)) for f, c in self.consumers.items()}
        assert got["off"] == got["confluent"], got
        if on_differs is not None:
            assert got["on"] == on_differs, got
        else:
            assert got["on"] == got["confluent"], got

    @rule(timeout=TIMEOUTS)
    def poll(self, timeout: Any) -> None:
        self.same(lambda c: c.poll(timeout))

    @rule(n=st.sampled_from([0, 1, 3, -1, None, 1.5]), timeout=TIMEOUTS)
    def consume(self, n: Any, timeout: Any) -> None:
        self.same(lambda c: c.consume(n, timeout))

    @rule(message=MESSAGES, offsets=LOGICAL, asynchronous=st.booleans())
    def commit(self, message: Any, offsets: Any, asynchronous: bool) -> None:
        if message is None and offsets is None and asynchronous and not self.closed:
            # deliberate: a bare asynchronous commit() before anything was consumed
            self.same(lambda c: c.commit(), ("raised", "KafkaException", KafkaError._NO_OFFSET))
            return
        if message is not None and offsets is None and not asynchronous:
            return  # (a hand-built message's OffsetCommit may be queued: see above)
        self.same(lambda c: c.commit(message=message, offsets=offsets, asynchronous=asynchronous))

    @rule(message=MESSAGES, offsets=LOGICAL)
    def store_offsets(self, message: Any, offsets: Any) -> None:
        self.same(lambda c: c.store_offsets(message=message, offsets=offsets))

    @rule(partitions=PARTITIONS, name=st.sampled_from(["pause", "resume", "position"]))
    def partitions_call(self, partitions: Any, name: str) -> None:
        self.same(lambda c: getattr(c, name)(partitions))

    @rule(partitions=st.sampled_from([[], None, (), ["t"]]))
    def assign(self, partitions: Any) -> None:
        self.same(lambda c: c.assign(partitions))

    @rule(name=st.sampled_from(["assignment", "unassign", "unsubscribe", "memberid"]))
    def no_argument_call(self, name: str) -> None:
        self.same(lambda c: getattr(c, name)())

    @rule(partition=st.sampled_from([TopicPartition("t", 0, 5), None, "t"]))
    def seek(self, partition: Any) -> None:
        self.same(lambda c: c.seek(partition))

    @rule(topics=st.sampled_from([["t"], "t", [], None]))
    def subscribe(self, topics: Any) -> None:
        self.same(lambda c: c.subscribe(topics))

    @rule()
    def close(self) -> None:
        self.same(lambda c: c.close())
        self.closed = True

    def teardown(self) -> None:
        for c in self.consumers.values():
            c.close()


TestSameAnswers = SameAnswers.TestCase
TestSameAnswers.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
