"""Relay for Django projects.

- ``relay_task("email.send")``: a ``django.tasks`` task that runs on Relay. ``.enqueue(**params)``
  writes an outbox row in the project's database inside the caller's transaction; after the
  commit the row is posted with its id as the idempotency key (``relay_drain`` posts what a
  crash left behind).
- ``RelayJob``: the outbox row and the projection of the job's state, kept by signed callbacks
  (``views.callback``), ``relay_reconcile`` and ``refresh``.
- ``RelayMessageEvent``: bounces, complaints, suppressions (the message event types the tenant
  subscribes to) kept once from signed callbacks or ``replay_message_events`` (the feed), each
  new one sent as the ``message_event`` signal.
- ``views.status``: ``relay.status/v1`` for the project's local ``django.tasks`` work.

Add ``"relay_client.django"`` to ``INSTALLED_APPS``; see the package README for settings.
"""

from typing import Any

from .context import correlation, current_correlation

__all__ = [
    "InvalidParams",
    "correlation",
    "current_correlation",
    "relay_task",
    "refresh",
    "drain",
    "reconcile",
    "replay_message_events",
]


def __getattr__(name: str) -> Any:  # Lazy: these import models, which need the app registry.
    if name == "relay_task":
        from .backend import relay_task

        return relay_task
    if name == "InvalidParams":
        from .catalogue import InvalidParams

        return InvalidParams
    if name in ("refresh", "drain", "reconcile"):
        from . import outbox

        return getattr(outbox, name)
    if name == "replay_message_events":
        from .message_events import replay_message_events

        return replay_message_events
    raise AttributeError(name)
