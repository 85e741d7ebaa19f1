"""Message events (bounces, complaints, suppressions, deliveries...) kept as ``RelayMessageEvent``
rows, once per Relay event id, with the ``message_event`` signal sent for each new one after its
commit. From a signed callback (``views.callback``) or the feed (``replay_message_events``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import transaction

from .models import RelayMessageEvent
from .signals import message_event


def _time(s: Any) -> datetime | None:
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if isinstance(s, str) and s else None


def apply_message_event(data: dict[str, Any]) -> bool:
    """Keep one event (a callback's ``data`` or a feed entry); False when kept before. Raises
    ``KeyError``/``ValueError``/``TypeError`` for something that is not a message event."""
    kind = data["type"]
    if not isinstance(kind, str) or not kind.startswith("message."):
        raise ValueError(f"not a message event type: {kind!r}")
    received_at = _time(data["received_at"])
    if received_at is None:
        raise ValueError("received_at is required")
    recipients = data.get("recipients") or []
    if not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients):
        raise ValueError("recipients must be a list of strings")
    with transaction.atomic():
        row, created = RelayMessageEvent.objects.get_or_create(
            event_id=int(data["id"]),
            defaults={
                "type": kind,
                "message_id": uuid.UUID(str(data["message_id"])),
                "job_id": uuid.UUID(str(data["job_id"])),
                "correlation_id": str(data.get("correlation_id") or "")[:200],
                "recipients": recipients,
                "occurred_at": _time(data.get("occurred_at")),
                "received_at": received_at,
                "bounce_type": str(data.get("bounce_type") or "")[:40],
                "bounce_subtype": str(data.get("bounce_subtype") or "")[:60],
                "complaint_type": str(data.get("complaint_type") or "")[:60],
                "note": str(data.get("note") or ""),
            },
        )
        if created:
            transaction.on_commit(lambda: message_event.send(sender=RelayMessageEvent, event=row))
    return created


def replay_message_events(client: Any, updated_since: str | None = None) -> str:
    """Page through ``GET /v1/messages/events`` from ``updated_since`` (an RFC 3339 time or the
    ``resume_cursor`` a previous call returned), keeping every event (new ones signalled).
    Returns the ``resume_cursor`` to pass next time. ``client`` is a ``relay_client.RelayClient``."""
    page = client.message_events(updated_since=updated_since)
    while True:
        for event in page["events"]:
            apply_message_event(event)
        if not page.get("next_cursor"):
            return str(page["resume_cursor"])
        page = client.message_events(cursor=page["next_cursor"])
