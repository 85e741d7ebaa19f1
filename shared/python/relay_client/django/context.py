"""The correlation id the next enqueues carry (minted by the originator, e.g. "campaign-42")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[str | None] = ContextVar("relay_correlation_id", default=None)


@contextmanager
def correlation(correlation_id: str) -> Iterator[str]:
    """Every Relay task enqueued inside the block carries ``correlation_id``."""
    token = _current.set(correlation_id)
    try:
        yield correlation_id
    finally:
        _current.reset(token)


def current_correlation() -> str | None:
    return _current.get()
