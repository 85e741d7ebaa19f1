"""Message events (``message.*`` callbacks) keep ``RelayMessageEvent`` rows once and send the
``message_event`` signal; a forged one changes nothing; the feed replays what callbacks missed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from relay_client.django.message_events import replay_message_events
from relay_client.django.models import RelayMessageEvent
from relay_client.django.signals import message_event
from relay_client.errors import BadRequest

from .test_callbacks import send

pytestmark = pytest.mark.django_db(transaction=True)


def bounce(event_id: int) -> dict:
    """A ``message.bounced`` callback body as Relay sends it."""
    return {
        "type": "message.bounced",
        "timestamp": datetime.now(UTC).isoformat(),
        "data": {
            "id": event_id,
            "type": "message.bounced",
            "message_id": str(uuid.uuid4()),
            "job_id": str(uuid.uuid4()),
            "correlation_id": "signup-7",
            "recipients": ["bo@example.com"],
            "occurred_at": "2026-11-30T10:00:06Z",
            "received_at": "2026-11-30T10:00:07.123456Z",
            "bounce_type": "Permanent",
            "bounce_subtype": "General",
            "complaint_type": None,
            "note": "Permanent bounce (General)",
        },
    }


def test_a_bounce_callback_is_kept_once_and_signalled(relay, signing, live_server):
    secret = signing["SIGNING_SECRETS"][0]
    got: list[RelayMessageEvent] = []

    def receiver(sender, event, **kwargs):
        got.append(event)

    message_event.connect(receiver)
    try:
        body = bounce(41)
        res = send(live_server, body, secret)
        assert res.status_code == 200, res.text
        assert res.json() == {"applied": True}
        assert send(live_server, body, secret).json() == {"applied": False}, "a repeat changes nothing"
    finally:
        message_event.disconnect(receiver)
    row = RelayMessageEvent.objects.get(event_id=41)
    assert (row.type, row.recipients, row.bounce_type, row.correlation_id) == (
        "message.bounced",
        ["bo@example.com"],
        "Permanent",
        "signup-7",
    )
    assert [e.event_id for e in got] == [41], "signalled once"

    # Forged, or not a message event: 400, nothing kept.
    assert send(live_server, bounce(42), "whsec_" + "A" * 43).status_code == 400
    broken = bounce(43)
    del broken["data"]["received_at"]
    res = send(live_server, broken, secret)
    assert (res.status_code, res.json()["error"]["code"]) == (400, "invalid_payload")
    assert not RelayMessageEvent.objects.filter(event_id__in=[42, 43]).exists()


def test_replay_pages_the_feed_keeps_each_event_once_and_returns_the_resume_cursor(relay):
    with relay.client() as client:
        resume = replay_message_events(client)
        assert resume.startswith("A") and len(resume) == 32, resume
        with pytest.raises(BadRequest):
            client.message_events(cursor="not-a-cursor")

    class Pages:
        """Two pages of the feed, as Relay answers them."""

        def __init__(self) -> None:
            self.asked: list[dict] = []

        def message_events(self, **query):
            self.asked.append(query)
            if "cursor" not in query:
                return {"events": [bounce(51)["data"]], "next_cursor": "c1", "resume_cursor": "r1"}
            return {"events": [bounce(51)["data"], bounce(52)["data"]], "next_cursor": None, "resume_cursor": "r2"}

    pages = Pages()
    assert replay_message_events(pages, "2026-11-30T00:00:00Z") == "r2"
    assert pages.asked == [{"updated_since": "2026-11-30T00:00:00Z"}, {"cursor": "c1"}]
    assert sorted(RelayMessageEvent.objects.values_list("event_id", flat=True)) == [51, 52]
