"""Conformance of the wrappers (issue 44): ``fastrebalance.DeserializingConsumer`` against
``confluent_kafka.DeserializingConsumer``, and ``fastrebalance.aio.AIOConsumer`` against
``confluent_kafka.aio.AIOConsumer``, mode off and on, without a broker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import confluent_kafka
import confluent_kafka.aio
import pytest

import fastrebalance
import fastrebalance.aio

from ._differential import FLAVOURS, UNREACHABLE, config, outcome, tp

pytestmark = pytest.mark.timeout(120)


def conf(flavour: str, **extra: Any) -> dict[str, Any]:
    return config(flavour, **{"bootstrap.servers": UNREACHABLE, "group.id": "g", **extra})


def deserializing(flavour: str) -> type:
    if flavour == "confluent":
        return confluent_kafka.DeserializingConsumer
    return fastrebalance.DeserializingConsumer


CALLS = {
    "poll": lambda c: c.poll(0),
    "poll(None)": lambda c: c.poll(None),
    "consume": lambda c: c.consume(1, 0),
    "assignment": lambda c: c.assignment(),
    "commit(logical)": lambda c: c.commit(offsets=[tp()]),
    "position": lambda c: c.position([tp()]),
    "seek": lambda c: c.seek(tp(offset=5)),
    "pause(tuple)": lambda c: c.pause((tp(),)),
    "subscribe(str)": lambda c: c.subscribe("t"),
    "memberid": lambda c: c.memberid(),
}


def same(run: Any) -> dict[str, Any]:
    got = {f: run(f) for f in FLAVOURS}
    differ = {f: got[f] for f in FLAVOURS[1:] if got[f] != got["confluent"]}
    assert not differ, f"confluent-kafka: {got['confluent']}, ours: {differ}"
    return got


def test_deserializing_consumer_open_closed_and_with_a_uuid_group_id() -> None:
    def run(flavour: str) -> dict[str, Any]:
        c = deserializing(flavour)(conf(flavour, **{"group.id": uuid.UUID(int=44)}))
        out = {f"open {n}": outcome(lambda call=call: call(c)) for n, call in CALLS.items()}
        out["close"] = outcome(c.close)
        out.update({f"closed {n}": outcome(lambda call=call: call(c)) for n, call in CALLS.items()})
        out["close again"] = outcome(c.close)
        return out

    same(run)


def test_an_unopened_deserializing_consumer_subclass() -> None:
    def run(flavour: str) -> dict[str, Any]:
        class Unopened(deserializing(flavour)):  # type: ignore[misc]
            def __init__(self) -> None:
                pass

        c = Unopened()
        # (poll(None): confluent-kafka's C layer reads the argument before it finds no
        # handle; ours finds none first. Both raise.)
        return {n: outcome(lambda call=call: call(c)) for n, call in CALLS.items()
                if n not in ("consume", "poll(None)")}  # fmt: skip

    got = same(run)
    assert got["on"]["poll"] == ("raised", "RuntimeError", "Consumer closed")
    # confluent-kafka's own close() of such an object raises AttributeError (it looks for
    # its deserializers); ours succeeds, as confluent_kafka.Consumer's does
    for flavour in ("off", "on"):

        class Unopened(deserializing(flavour)):  # type: ignore[misc]
            def __init__(self) -> None:
                pass

        assert Unopened().close() is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_deserializing_consumer_subclass_s_poll_override_runs(flavour: str) -> None:
    seen = []

    class Traced(deserializing(flavour)):  # type: ignore[misc]
        def poll(self, timeout: float = -1) -> Any:
            seen.append(timeout)
            return super().poll(timeout)

    c = Traced(conf(flavour))
    try:
        assert c.poll(0) is None
    finally:
        c.close()
    assert seen == [0]


def test_aio_consumer_open_and_closed() -> None:
    async def calls(c: Any) -> list[Any]:
        out = []
        for name, call in (
            ("poll", lambda: c.poll(0)),
            ("assignment", lambda: c.assignment()),
            ("commit(logical)", lambda: c.commit(offsets=[tp()])),
            ("position", lambda: c.position([tp()])),
        ):
            try:
                out.append((name, "returned", await call()))
            except Exception as exc:
                out.append((name, "raised", type(exc).__name__))
        return out

    def run(flavour: str) -> list[Any]:
        cls = confluent_kafka.aio.AIOConsumer if flavour == "confluent" else (
            fastrebalance.aio.AIOConsumer
        )

        async def main() -> list[Any]:
            c = cls(conf(flavour))
            out = await calls(c)
            await c.close()
            return out + await calls(c)

        return asyncio.run(asyncio.wait_for(main(), 60))

    same(run)
