"""Item 4 of issue 48: an ASL-style campaign through public calls only: the template uploaded
(``RelayClient.put_template``), the campaign enqueued with ``pages`` in the project's transaction,
its recipient pages handed over (``send_recipient_pages``), its end learned through ``job_finished``.
Also the tenant's destinations (no secret read back) and suppressions."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from relay_client import InvalidRequest, NotFound, RelayClient
from relay_client.django import correlation, relay_task, send_recipient_pages
from relay_client.django.models import RelayJob
from relay_client.django.signals import job_finished

from .conftest import jobs_on_relay, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

email_campaign = relay_task("email.campaign")


def test_a_paged_campaign_from_template_to_completion(relay, callbacks, relay_settings):
    ended: list[tuple[str, str]] = []

    def receiver(sender, row, status, **kwargs):
        if row.task_type == "email.campaign":
            ended.append((str(row.pk), status))

    job_finished.connect(receiver, weak=False)
    name = f"newsletter-{uuid.uuid4().hex[:8]}"
    corr = f"campaign-{uuid.uuid4()}"
    try:
        with RelayClient(relay.url, relay.key) as client:
            stored = client.put_template(name, subject="Hello {{ name }}", text="Dear {{ name }}, news.")
            assert (stored.name, stored.subject) == (name, "Hello {{ name }}")
            assert name in [t.name for t in client.templates()]
            with pytest.raises(InvalidRequest) as bad:
                client.put_template(f"{name}-bad", subject="Hi", text="{{ unclosed")
            assert bad.value.code == "template_syntax"
        recipients = [{"to": f"reader{i}@example.com", "data": {"name": f"Reader {i}"}} for i in range(7)]
        with transaction.atomic(), correlation(corr):
            result = email_campaign.enqueue(message={"from": "news@example.com", "template": name}, pages=3)
        [first] = send_recipient_pages(result.id, recipients[:3], page_size=3)
        assert (first.page, first.stored, first.released) == (0, True, False)
        receipts = send_recipient_pages(result.id, recipients, page_size=3)  # again, after a failure say
        assert [(r.page, r.stored, r.released) for r in receipts] == [
            (0, False, False),
            (1, True, False),
            (2, True, True),
        ]
        wait_for("the campaign's end", lambda: ended, timeout=60)
        row = RelayJob.objects.get(pk=result.id)
        assert ended == [(result.id, row.status)] and row.status == "succeeded", row.last_error
        children = [j for j in jobs_on_relay(relay, corr) if j.task_type == "email.send"]
        assert len(children) == 7
    finally:
        job_finished.disconnect(receiver)


def test_destinations_and_suppressions_through_the_client(relay):
    name = f"crm-{uuid.uuid4().hex[:8]}"
    with RelayClient(relay.url, relay.key) as client:
        d = client.put_destination(
            name, base_url="https://crm.example.com/api", auth_header="Authorization", timeout_ms=5000
        )
        assert (d.name, d.base_url, d.auth_header, d.timeout_ms, d.secret_set_at) == (
            name,
            "https://crm.example.com/api",
            "Authorization",
            5000,
            None,
        )
        client.set_destination_secret(name, "Bearer s3cret")
        got = client.get_destination(name)
        assert got.secret_set_at is not None
        assert "s3cret" not in repr(got.raw), "the secret is never read back"
        assert name in [x.name for x in client.destinations()]
        assert client.set_destination_writes(name, False, reason="maintenance").writes_enabled is False
        client.delete_destination(name)
        with pytest.raises(NotFound):
            client.get_destination(name)

        address = f"gone-{uuid.uuid4().hex[:8]}@example.com"
        client.suppress(address)
        listed = []
        page = client.suppressions(limit=100)
        listed += page.suppressions
        while page.next_after:
            page = client.suppressions(after=page.next_after, limit=100)
            listed += page.suppressions
        [mine] = [s for s in listed if s.address == address]
        assert mine.reason == "manual"
        client.unsuppress(address)
        with pytest.raises(NotFound):
            client.unsuppress(address)
