"""Item 2 of issue 48: what Relay's intake refuses for a reason the client can know is refused at
``.enqueue()``, before the commit, from the rules Relay publishes with each task's schema (written
by the task beside its own check); the tenant's sending identities are published on ``from``."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import transaction

from relay_client import InvalidRequest
from relay_client.django import InvalidParams, catalogue, correlation
from relay_client.django.models import RelayJob
from shop.tasks import email_send

from .conftest import Relay

pytestmark = pytest.mark.django_db(transaction=True)

MAIL = {"from": "shop@example.com", "subject": "Hi", "text": "Hello"}


def published(relay: Relay, task: str) -> dict:
    with relay.client() as client:
        return next(t["params_schema"] for t in client.tasks() if t["name"] == task)


def relay_refuses(relay: Relay, params: dict) -> InvalidRequest:
    """What Relay's intake answers to these params, submitted directly."""
    from relay_client import JobRequest

    request = JobRequest("email.send", f"rules-{uuid.uuid4()}", "rules", params)
    with relay.client() as client, pytest.raises(InvalidRequest) as refused:
        client.submit(request)
    return refused.value


def test_an_address_that_is_not_one_is_refused_at_enqueue_as_relay_would(relay, relay_conf):
    corr = f"rules-{uuid.uuid4()}"
    with pytest.raises(InvalidParams) as e, transaction.atomic(), correlation(corr):
        email_send.enqueue(**MAIL, to=["not an address"])
    assert e.value.message_dict == {"to[0]": ["'not an address' is not an email address"]}
    assert not RelayJob.objects.exists(), "nothing was written: the view can answer 400"
    assert relay_refuses(relay, {**MAIL, "to": ["not an address"]}).field == "params.to[0]"


def test_a_published_limit_holds_on_both_sides(relay, relay_conf):
    most = published(relay, "email.send")["properties"]["to"]["maxItems"]
    assert most == 50
    too_many = [f"r{i}@example.com" for i in range(most + 1)]
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(**MAIL, to=too_many)
    assert list(e.value.message_dict) == ["to"]
    assert relay_refuses(relay, {**MAIL, "to": too_many}).field == "params.to"
    bad_name = {"from": "shop@example.com", "to": ["a@example.com"], "template": "no spaces allowed"}
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(**bad_name)
    assert list(e.value.message_dict) == ["template"]
    assert relay_refuses(relay, bad_name).field == "params.template"


def test_a_sender_outside_the_tenants_identities_is_refused_and_a_new_identity_is_followed(relay, relay_conf):
    outside = {**MAIL, "from": "news@globex.example", "to": ["a@example.com"]}
    schema = published(relay, "email.send")
    assert "example.com" in schema["properties"]["from"]["description"]
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(**outside)
    assert list(e.value.message_dict) == ["from"] and "sending identities" in e.value.message_dict["from"][0]
    email_send.enqueue(**{**outside, "from": "Shop <Shop@Example.com>"})  # a display name, any case

    # The tenant's identities change in one place, Relay's: the next catalogue the client reads follows.
    with psycopg.connect(relay.database_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO sending_identities (tenant_id, identity) "
            "SELECT id, 'globex.example' FROM tenants WHERE name = 'dev' ON CONFLICT DO NOTHING"
        )
    try:
        catalogue.invalidate()
        with transaction.atomic():
            email_send.enqueue(**outside)
    finally:
        with psycopg.connect(relay.database_url, autocommit=True) as db:
            db.execute("DELETE FROM sending_identities WHERE identity = 'globex.example'")
        catalogue.invalidate()
    with pytest.raises(InvalidParams):
        email_send.enqueue(**outside)
