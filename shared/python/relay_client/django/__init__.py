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
- ``relay_job(result.id)``: the row with Relay's job id (posting it now if need be), e.g. to
  ``send_recipient_pages`` of a paged ``email.campaign``; ``relay_client.RelayClient`` has the
  tenant's templates, destinations and suppressions.
- ``signals.job_finished``: a job ended (however the project learned it).
- ``views.status``: ``relay.status/v1`` for the project's local ``django.tasks`` work.

Add ``"relay_client.django"`` to ``INSTALLED_APPS``; see the package README for settings.
"""

from typing import Any

from .context import correlation, current_correlation

__all__ = [
    "InvalidParams",
    "InvalidTask",
    "correlation",
    "current_correlation",
    "relay_task",
    "refresh",
    "drain",
    "reconcile",
    "replay_message_events",
    "relay_job",
    "send_recipient_pages",
]


def __getattr__(name: str) -> Any:  # Lazy: these import models, which need the app registry.
    if name == "relay_task":
        from .backend import relay_task

        return relay_task
    if name == "InvalidTask":  # django.tasks' InvalidTask, InvalidTaskError in the 5.2 backport
        from ._compat import InvalidTask

        return InvalidTask
    if name == "InvalidParams":
        from .catalogue import InvalidParams

        return InvalidParams
    if name in ("refresh", "drain", "reconcile", "relay_job"):
        from . import outbox

        return getattr(outbox, name)
    if name == "send_recipient_pages":
        from .campaigns import send_recipient_pages

        return send_recipient_pages
    if name == "replay_message_events":
        from .message_events import replay_message_events

        return replay_message_events
    raise AttributeError(name)
