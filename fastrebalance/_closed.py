"""The handle an unopened ``Consumer`` reads through: every call is confluent-kafka's
``RuntimeError("Consumer closed")``, and ``close()`` succeeds.

A subclass whose ``__init__`` never calls ``super().__init__()`` has no handle of its own.
confluent-kafka's C type answers every method of such an object with "Consumer closed"
and lets ``close()`` return; the facade's class attributes point here, so that its
methods, which only delegate, do the same without a check of their own (no cost on the
hot path). Owned by no thread: it holds nothing.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["CLOSED"]


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise RuntimeError("Consumer closed")


def _refuse_handle(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise RuntimeError("Handle has been closed")


#: confluent-kafka's methods shared with its Producer and AdminClient say this instead
_HANDLE_METHODS = frozenset({"cluster_id", "list_topics", "set_sasl_credentials"})


class _Closed:
    """Stands in for both confluent-kafka handles and the delivery of records."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _refuse_handle if name in _HANDLE_METHODS else _refuse

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return "<no consumer: closed>"


CLOSED: Any = _Closed()
