"""Differential conformance without a broker (issue 44): confluent-kafka's consumer and
ours, mode off and on, given the same calls, must answer the same. An unreachable
bootstrap, a closed consumer, subclasses (also one whose ``__init__`` skips ours),
callbacks that raise, wrong types, ``None`` and empty values, non-``str`` config.

Each case is a sequence run on every flavour; the outcomes (value, or exception type and
error code) are compared with confluent-kafka's. The differences kept on purpose are
asserted as such at the end (docs/api.md lists them).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

import fastrebalance
from fastrebalance import _assigning

from ._differential import CALLS, FLAVOURS, UNREACHABLE, base_class, make, outcome, tp

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _short_plan_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the mode on, assign() reads both commit logs first, for up to 30 s with no
    broker: 1 s is enough to find there is none (the partitions are then deferred)."""
    monkeypatch.setattr(_assigning, "PLAN_BUDGET_S", 1.0)


def conf(**extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": UNREACHABLE, "group.id": "g", "socket.timeout.ms": 2000, **extra}


def against_confluent(run: Any) -> dict[str, Any]:
    """``run(flavour)`` for each flavour; fails naming each that differs from confluent's."""
    got = {f: run(f) for f in FLAVOURS}
    differ = {f: got[f] for f in FLAVOURS[1:] if got[f] != got["confluent"]}
    assert not differ, f"confluent-kafka: {got['confluent']}, ours: {differ}"
    return got


# -- 1: a subclass's overrides run (they were bypassed: bound methods on the instance) ----
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_subclass_s_overrides_run_and_reach_the_consumer_through_super(flavour: str) -> None:
    seen: list[str] = []

    class Traced(base_class(flavour)):  # type: ignore[misc]
        def poll(self, timeout: float = -1) -> Any:
            seen.append("poll")
            return super().poll(timeout)

        def consume(self, num_messages: int = 1, timeout: float = -1) -> Any:
            seen.append("consume")
            return super().consume(num_messages, timeout)

        def unassign(self, *args: Any) -> Any:  # a signature of its own, as in the issue
            seen.append("unassign")
            return super().unassign()

        def commit(self, *args: Any, **kwargs: Any) -> Any:
            seen.append("commit")
            return super().commit(*args, **kwargs)

        def assignment(self) -> Any:
            seen.append("assignment")
            return super().assignment()

        def close(self) -> None:
            seen.append("close")
            super().close()

    c = make(flavour, Traced, **conf())
    try:
        assert c.poll(0) is None
        assert c.consume(5, 0) == []
        c.unassign("extra")
        assert c.assignment() == []
        assert c.commit(offsets=[tp()]) is None  # a logical offset: nothing to write
    finally:
        c.close()
    assert seen == ["poll", "consume", "unassign", "assignment", "commit", "close"]


# -- 6: a subclass whose __init__ does not call ours ----------------------------------------
def test_an_unopened_subclass_answers_consumer_closed_and_closes() -> None:
    def run(flavour: str) -> dict[str, Any]:
        class Unopened(base_class(flavour)):  # type: ignore[misc]
            def __init__(self) -> None:  # no super().__init__()
                pass

        c = Unopened()
        answers = {name: outcome(lambda call=call: call(c)) for name, call in CALLS.items()}
        answers["close again"] = outcome(c.close)
        return answers

    got = against_confluent(run)
    assert got["on"]["poll"] == ("raised", "RuntimeError", "Consumer closed")
    assert got["on"]["close"] == ("returned", None)


# -- a closed consumer -------------------------------------------------------------------
def test_a_closed_consumer_answers_as_confluent_kafka_s() -> None:
    def run(flavour: str) -> dict[str, Any]:
        c = make(flavour, **conf())
        c.close()
        return {name: outcome(lambda call=call: call(c)) for name, call in CALLS.items()}

    got = against_confluent(run)
    assert got["on"]["commit"] == ("raised", "RuntimeError", "Consumer closed")


# -- 2: close() after an error_cb that raises ----------------------------------------------
class Boom(Exception):
    pass


def _raise(err: KafkaError) -> None:
    raise Boom(err.str())


def _consume_until_boom(c: Any) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            c.consume(1, 0.5)
        except Boom:
            return True
    return False


def test_close_closes_after_an_error_cb_raised() -> None:
    """The error_cb's exception leaves consume(), as confluent-kafka's; close() then closes
    (afterwards: "Consumer closed", and close() returns), on each of several tries."""

    def run(flavour: str) -> list[tuple[Any, ...]]:
        c = make(flavour, **conf(error_cb=_raise))
        c.subscribe(["t"])
        raised = _consume_until_boom(c)
        first = outcome(c.close)
        # confluent-kafka's own close() may raise it too (if an error event is pending):
        # either way the consumer is closed
        closed = first in (("returned", None),) or first[1] == "Boom"
        return [("raised in consume", raised), ("closed", closed), outcome(lambda: c.poll(0)),
                outcome(c.close)]  # fmt: skip

    got = against_confluent(run)
    assert got["on"][2] == ("raised", "RuntimeError", "Consumer closed")


def test_close_returns_after_an_error_cb_raised_with_the_mode_on() -> None:
    """The issue's case: close() re-raised the error_cb's exception (4-5 of 5 tries) and
    left both handles and the group member open."""
    for _ in range(3):
        c = make("on", **conf(error_cb=_raise))
        c.subscribe(["t"])
        assert _consume_until_boom(c)
        c.close()  # returns
        with pytest.raises(RuntimeError, match="Consumer closed"):
            c.poll(0)
        assert c._child is not None and not c._child.alive


# -- 3: seek() of a partition whose committed offset is not known yet -------------------------
def test_seek_of_an_assigned_partition_not_started_raises_state() -> None:
    def run(flavour: str) -> tuple[Any, ...]:
        c = make(flavour, **conf())
        try:
            c.assign([tp()])
            c.poll(0.2)
            return outcome(lambda: c.seek(tp(offset=5)))
        finally:
            c.close()

    got = against_confluent(run)
    assert got["on"] == ("raised", "KafkaException", KafkaError._STATE)


# -- 7: config values that are not str -----------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        {"group.id": uuid.UUID(int=44)},
        {"group.id": 44},
        {"client.id": uuid.UUID(int=7)},
        {"group.protocol": b"classic".decode()},  # str stays str
        {"enable.auto.commit": "True"},
        {"enable.auto.commit": 0},
        {"auto.offset.reset": "EARLIEST"},
    ],
    ids=repr,
)
def test_config_values_that_are_not_str_are_read_as_confluent_kafka_reads_them(
    extra: dict[str, Any],
) -> None:
    def run(flavour: str) -> tuple[Any, ...]:
        def build() -> str:
            c = make(flavour, **{**conf(), **extra})
            c.close()
            return "made"

        return outcome(build)

    against_confluent(run)


def test_a_uuid_group_id_names_the_catch_up_group_as_its_text() -> None:
    group = uuid.uuid4()
    c = make("on", **conf(**{"group.id": group}))
    try:
        assert c._settings.catchup_group_id == f"{group}.catchup"
    finally:
        c.close()


# -- wrong types, None and empty values ------------------------------------------------------
ONE = Message(topic="t", partition=0, offset=1)
WRONG = {
    "poll(None)": lambda c: c.poll(None),
    "poll('1')": lambda c: c.poll("1"),
    "consume(None)": lambda c: c.consume(None),
    "consume(1, None)": lambda c: c.consume(1, None),
    "consume(0, 0)": lambda c: c.consume(0, 0),
    "assign(tuple)": lambda c: c.assign((tp(),)),
    "assign([str])": lambda c: c.assign(["t"]),
    "assign(None)": lambda c: c.assign(None),
    "assign([])": lambda c: c.assign([]),
    "incremental_assign([])": lambda c: c.incremental_assign([]),
    "pause(tuple)": lambda c: c.pause((tp(),)),
    "resume(None)": lambda c: c.resume(None),
    "seek(None)": lambda c: c.seek(None),
    "seek(str)": lambda c: c.seek("t"),
    "subscribe(str)": lambda c: c.subscribe("t"),
    "subscribe([], on_assign=1)": lambda c: c.subscribe(["t"], on_assign=1),
    "commit(message=str)": lambda c: c.commit(message="m"),
    "commit(offsets=tuple)": lambda c: c.commit(offsets=(tp(offset=1),)),
    "commit(both)": lambda c: c.commit(message=ONE, offsets=[tp(offset=1)]),
    "commit(offsets=[], async)": lambda c: c.commit(offsets=[]),
    "commit(offsets=[logical], async)": lambda c: c.commit(offsets=[tp()]),
    "commit(offsets=[logical], sync)": lambda c: c.commit(offsets=[tp()], asynchronous=False),
    "store_offsets()": lambda c: c.store_offsets(),
    "store_offsets(message=str)": lambda c: c.store_offsets(message="m"),
    "store_offsets(both)": lambda c: c.store_offsets(message=ONE, offsets=[tp(offset=1)]),
    "committed(None)": lambda c: c.committed(None),
    "committed([], 'x')": lambda c: c.committed([], "x"),
    "position(tuple)": lambda c: c.position((tp(),)),
    "get_watermark_offsets(None)": lambda c: c.get_watermark_offsets(None),
    "list_topics(timeout=None)": lambda c: c.list_topics(timeout=None),
}


def test_wrong_types_none_and_empty_values_raise_as_confluent_kafka_s() -> None:
    def run(flavour: str) -> dict[str, Any]:
        c = make(flavour, **conf())
        try:
            return {name: outcome(lambda call=call: call(c)) for name, call in WRONG.items()}
        finally:
            c.close()

    against_confluent(run)


def test_config_that_is_not_a_dict_is_refused_as_confluent_kafka_s() -> None:
    for bad in (None, "group.id=g", [("group.id", "g")]):
        against_confluent(lambda f, bad=bad: outcome(lambda: base_class(f)(bad)))


# -- 5: hand-built messages, with no broker ---------------------------------------------------
def test_hand_built_messages_without_a_broker() -> None:
    messages = {
        "topic": Message(topic="t"),
        "no offset": Message(topic="t", partition=0),
        "no partition": Message(topic="t", offset=4),
        "error": Message(
            topic="t", partition=0, offset=4, error=KafkaError(KafkaError._PARTITION_EOF)
        ),
    }

    def run(flavour: str) -> dict[str, Any]:
        c = make(flavour, **conf(**{"enable.auto.offset.store": False}))
        try:
            out = {}
            for name, m in messages.items():
                if name != "no partition":  # (an OffsetCommit for partition -1 is queued,
                    # and confluent-kafka's close() then waits for the broker: 90 s)
                    out[f"commit {name}"] = outcome(lambda m=m: c.commit(message=m))
                out[f"store {name}"] = outcome(lambda m=m: c.store_offsets(message=m))
            return out
        finally:
            c.close()

    against_confluent(run)


# -- the differences kept on purpose (docs/api.md, "Deliberate differences") ----------------
def test_deliberate_difference_bare_asynchronous_commit_before_anything_consumed() -> None:
    got = {f: None for f in FLAVOURS}
    for f in FLAVOURS:
        c = make(f, **conf())
        try:
            got[f] = outcome(c.commit)
        finally:
            c.close()
    assert got["confluent"] == got["off"] == ("returned", None)
    assert got["on"] == ("raised", "KafkaException", KafkaError._NO_OFFSET)


def test_deliberate_difference_not_an_instance_of_confluent_kafka_s_class() -> None:
    for f in ("off", "on"):
        c = make(f, **conf())
        try:
            assert not isinstance(c, confluent_kafka.Consumer)
            assert isinstance(c, fastrebalance.Consumer)
        finally:
            c.close()


def test_the_docs_list_every_deliberate_difference() -> None:
    from pathlib import Path

    api = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    section = api.split("## Deliberate differences", 1)[1].split("\n## ", 1)[0]
    for named in ("commit()", "_NO_OFFSET", "isinstance", "test_no_broker.py",
                  "test_conformance.py"):
        assert named in section, named


def test_the_suite_calls_every_public_method_of_confluent_kafka_s_consumer() -> None:
    public = {n for n in dir(confluent_kafka.Consumer) if not n.startswith("_")}
    assert public == set(CALLS)
    assert KafkaException  # re-exported names stay confluent-kafka's
    assert fastrebalance.TopicPartition is TopicPartition
