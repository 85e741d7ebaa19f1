"""One post per commit: every row a transaction enqueued goes to Relay together once it commits.

``enqueue`` registers its row here. The first of the transaction's on-commit callbacks to run
takes every row the transaction enqueued and hands them to a small thread pool, which posts them
as ``POST /v1/jobs:batch`` requests (cut by bytes and 500 items), each network wait bounded by
``TIMEOUT`` and tried once. By default (``POST_IN_BACKGROUND``) the commit does not wait at all;
otherwise it waits for the whole post at most ``POST_TIMEOUT`` less what its enqueues already
waited for the catalogue, however many rows it enqueued, and the post goes on without it. What did not reach Relay stays
unsent for ``relay_drain`` (the same idempotency keys: still one job each).

A row registered inside a savepoint that rolls back loses its on-commit callback and its row
together; the post reads the rows that exist, so it never posts one the database does not hold.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import connections, transaction

from . import conf

log = logging.getLogger("relay_client")

#: The attribute on a database connection holding the rows its open transaction enqueued.
_STATE = "_relay_enqueued"


@dataclass
class Enqueued:
    """The rows one transaction enqueued, and what its enqueues already waited for (seconds)."""

    #: The on-commit callback every enqueue of this transaction registers (the same object).
    hook: Callable[[], None]
    #: Where the first registration sits in the connection's on-commit list.
    index: int
    ids: list[uuid.UUID] = field(default_factory=list)
    waited: float = 0.0

    def current(self, hooks: list[Any]) -> bool:
        """Whether this is still the open transaction's state: its first callback is in place. A
        savepoint rolled back drops the callbacks registered inside it, always a suffix of the
        list, so one look at that place tells, however many rows were enqueued."""
        return self.index < len(hooks) and hooks[self.index][1] is self.hook


def enqueued(row_id: uuid.UUID, db: str, *, waited: float = 0.0) -> None:
    """Register a row written in the current transaction on ``db``: posted once it commits."""
    conn = connections[db]
    hooks: list[Any] = conn.run_on_commit
    state: Enqueued | None = getattr(conn, _STATE, None)
    if state is None or not state.current(hooks):
        # No callback of ours waits on this connection: a new transaction (a rolled-back one
        # took its callbacks and rows with it).
        state = Enqueued(hook=partial(_committed, db), index=len(hooks))
        setattr(conn, _STATE, state)
    state.ids.append(row_id)
    state.waited += waited
    transaction.on_commit(state.hook, using=db, robust=True)


def _committed(db: str) -> None:
    """The transaction committed: post every row it enqueued (the later callbacks find none)."""
    conn = connections[db]
    state: Enqueued | None = getattr(conn, _STATE, None)
    setattr(conn, _STATE, None)
    if state is not None and state.ids:
        post_committed(state.ids, waited=state.waited)


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="relay-post")
        return _executor


def post_committed(ids: list[uuid.UUID], *, waited: float = 0.0) -> Future[None] | None:
    """Post committed rows on the pool; wait for it at most ``POST_TIMEOUT`` less ``waited``
    (not at all with ``POST_IN_BACKGROUND``). Never raises; None when posting at commit is off."""
    budget = conf.post_timeout()
    if budget <= 0:
        return None
    future = _pool().submit(_post_on_thread, list(ids), float(conf.get("TIMEOUT")))
    if conf.get("POST_IN_BACKGROUND"):
        return future
    try:
        future.result(timeout=max(budget - waited, 0.0))
    except FutureTimeout:
        log.warning(
            "relay post of %d rows not done after %.1fs: the request goes on, the drain has what is left",
            len(ids),
            budget,
        )
    return future


def _post_on_thread(ids: list[uuid.UUID], timeout: float) -> None:
    from .outbox import post_rows

    try:
        post_rows(ids, timeout=timeout)
    except Exception:  # a misconfiguration (ImproperlyConfigured) or a bug: the drain has the rows
        log.exception("relay post of %d committed rows failed, left for the drain", len(ids))
    finally:
        connections.close_all()  # this thread's connections only
