"""Message events (``message.*`` callbacks) keep ``RelayMessageEvent`` rows once and send the
``message_event`` signal; a forged one changes nothing; the feed replays what callbacks missed."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import transaction

from relay_client.django import correlation
from relay_client.django.message_events import replay_message_events
from relay_client.django.models import RelayJob, RelayMessageEvent
from relay_client.django.signals import message_event
from relay_client.errors import BadRequest
from shop.tasks import email_send

from .conftest import wait_for
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


def test_a_bounce_fed_to_relays_ingress_reaches_the_projection_and_the_signal(relay, callbacks, live_server):
    """End to end: an email job, a hard bounce through ``relay ingress send`` (ingress's own
    handler), the signed ``message.bounced`` callback, the ``RelayMessageEvent`` row."""
    got: list[str] = []

    def receiver(sender, event, **kwargs):
        got.append(event.type)

    message_event.connect(receiver)
    try:
        with transaction.atomic(), correlation("signup-bounce"):
            result = email_send.enqueue(
                **{"from": "shop@example.com"}, to=["bounce@simulator.amazonses.com"], subject="hi", text="t"
            )
        row = RelayJob.objects.get(pk=result.id)
        wait_for("the email job's callback", lambda: RelayJob.objects.get(pk=row.pk).terminal)
        row.refresh_from_db()
        relay_id = row.relay_id
        assert relay_id is not None
        example = Path(__file__).resolve().parents[2] / "docs/examples/ses-bounce.json"
        subprocess.run(
            [relay.bin, "ingress", "send", str(example), "--message", str(relay_id)],
            env={**os.environ, "DATABASE_URL": relay.database_url},
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(
            "the bounce's callback",
            lambda: RelayMessageEvent.objects.filter(job_id=relay_id, type="message.bounced").exists(),
        )
        # The signal is sent once the row's transaction commits, in the live server's thread:
        # the row can be seen a moment before its signal has run.
        wait_for("the bounce's signal", lambda: "message.bounced" in got)
    finally:
        message_event.disconnect(receiver)
    event = RelayMessageEvent.objects.get(job_id=relay_id, type="message.bounced")
    assert (event.correlation_id, event.recipients, event.bounce_type) == (
        "signup-bounce",
        ["bounce@simulator.amazonses.com"],
        "Permanent",
    )
