"""Signed callbacks from a real Relay keep the projection; forged, replayed and reordered ones
never move it backwards; reconciliation and refresh repair what lost callbacks left."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial

import httpx
import pytest
from django.db import transaction
from standardwebhooks import Webhook

from relay_client.django import correlation, reconcile, refresh
from relay_client.django._compat import TaskResultStatus
from relay_client.django.models import RelayJob
from shop.tasks import noop

from .conftest import Relay, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def enqueue_noop(**params) -> RelayJob:
    with transaction.atomic(), correlation(f"cb-{uuid.uuid4()}"):
        result = noop.using(**params).enqueue() if params else noop.enqueue()
    return RelayJob.objects.get(pk=result.id)


def row_status(pk) -> str:
    return RelayJob.objects.get(pk=pk).status


def send(live_server, body: dict, secret: str, *, msg_id: str | None = None) -> httpx.Response:
    """POST a callback signed the way Relay signs (Standard Webhooks)."""
    data = json.dumps(body)
    msg_id = msg_id or f"cb_{uuid.uuid4()}"
    now = datetime.now(UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, data),
        "content-type": "application/json",
    }
    return httpx.post(f"{live_server.url}/relay/callbacks", content=data, headers=headers, timeout=10)


def as_of(job: dict, status: str, at: datetime) -> dict:
    """The job resource as Relay would have sent it at another moment."""
    return {
        "type": f"job.{status}",
        "timestamp": at.isoformat(),
        "data": {**job, "status": status, "updated_at": at.isoformat().replace("+00:00", "Z")},
    }


def test_a_real_callback_moves_the_projection_to_the_terminal_state(relay: Relay, callbacks, live_server):
    row = enqueue_noop()
    wait_for("the callback", lambda: row_status(row.pk) == "succeeded")
    row.refresh_from_db()
    assert row.relay_updated_at is not None and row.finished_at is not None
    assert noop.get_result(str(row.pk)).status == TaskResultStatus.SUCCESSFUL
    with relay.client() as client:
        attempts = relay.api("GET", f"/v1/jobs/{row.relay_id}/callbacks").json()["attempts"]
        assert client.get(str(row.relay_id)).status == "succeeded"
    assert [a["outcome"] for a in attempts] == ["delivered"]


def test_replayed_and_reordered_callbacks_never_move_the_projection_backwards(relay, signing, live_server):
    secret = signing["SIGNING_SECRETS"][0]
    row = enqueue_noop()
    wait_for("the real callback", lambda: row_status(row.pk) == "succeeded")
    with relay.client() as client:
        job = client.get(str(row.relay_id)).raw
    done_at = datetime.fromisoformat(job["updated_at"].replace("Z", "+00:00"))
    before = RelayJob.objects.values().get(pk=row.pk)

    # An older "running" arrives late, then the same update again, then a "pending" with the
    # same time as the terminal one: none changes the row.
    for body in (
        as_of(job, "running", done_at - timedelta(seconds=1)),
        as_of(job, "succeeded", done_at),
        as_of(job, "pending", done_at),
    ):
        res = send(live_server, body, secret)
        assert res.status_code == 200 and res.json() == {"applied": False}, res.text
    assert RelayJob.objects.values().get(pk=row.pk) == before

    # Reordered: the later state first, the earlier after it.
    later = enqueue_noop(run_after=datetime.now(UTC) + timedelta(hours=1))
    wait_for("the post", lambda: RelayJob.objects.get(pk=later.pk).relay_id)
    with relay.client() as client:
        pending = client.get(str(RelayJob.objects.get(pk=later.pk).relay_id)).raw
    t = datetime.fromisoformat(pending["updated_at"].replace("Z", "+00:00"))
    assert send(live_server, as_of(pending, "cancelled", t + timedelta(seconds=2)), secret).json()["applied"]
    assert not send(live_server, as_of(pending, "running", t + timedelta(seconds=1)), secret).json()["applied"]
    assert row_status(later.pk) == "cancelled"


def test_a_bad_signature_is_refused_with_400_and_changes_nothing(relay, signing, live_server):
    secret = signing["SIGNING_SECRETS"][0]
    row = enqueue_noop(run_after=datetime.now(UTC) + timedelta(hours=1))
    with relay.client() as client:
        job = client.get(str(RelayJob.objects.get(pk=row.pk).relay_id)).raw
    before = RelayJob.objects.values().get(pk=row.pk)
    forged = as_of(job, "succeeded", datetime.now(UTC))
    other = "whsec_" + "A" * 43 + "="
    res = send(live_server, forged, other)
    assert res.status_code == 400 and res.json()["error"]["code"] == "bad_signature", res.text
    # A body changed after signing.
    data = json.dumps(forged)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": "cb_x",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign("cb_x", now, data),
    }
    res = httpx.post(f"{live_server.url}/relay/callbacks", content=data.replace("succeeded", "failed"), headers=headers)
    assert res.status_code == 400
    res = httpx.post(f"{live_server.url}/relay/callbacks", content=data, headers={"webhook-id": "cb_y"})
    assert res.status_code == 400, "no signature"
    assert RelayJob.objects.values().get(pk=row.pk) == before


def test_secret_rotation_overlap_either_secret_verifies(relay, signing, live_server):
    old = signing["SIGNING_SECRETS"][0]
    res = relay.api("POST", "/v1/callbacks/rotate", json={"overlap_seconds": 3600})
    assert res.status_code == 200, res.text
    new = res.json()["secret"]
    try:
        for secrets in ([new], [old]):
            signing["SIGNING_SECRETS"] = secrets
            row = enqueue_noop()
            wait_for(
                f"a callback verified by {'new' if secrets == [new] else 'old'} secret",
                partial(lambda pk: row_status(pk) == "succeeded", row.pk),
            )
        signing["SIGNING_SECRETS"] = ["whsec_" + "B" * 43 + "="]
        row = enqueue_noop()
        with relay.client() as client:
            wait_for("Relay to finish the job", lambda: client.get(str(row.relay_id)).terminal)
        wait_for(
            "a refused delivery",
            lambda: any(
                a["http_status"] == 400
                for a in relay.api("GET", f"/v1/jobs/{row.relay_id}/callbacks").json()["attempts"]
            ),
        )
        assert row_status(row.pk) == "pending", "a callback no secret verifies changes nothing"
    finally:
        signing["SIGNING_SECRETS"] = [new, old]


def test_reconciliation_repairs_a_projection_whose_callbacks_were_dropped(relay, signing, live_server):
    signing["SIGNING_SECRETS"] = ["whsec_" + "C" * 43 + "="]  # every callback is refused: dropped
    rows = [enqueue_noop() for _ in range(3)]
    with relay.client() as client:
        for r in rows:
            wait_for("Relay to finish", partial(lambda rid: client.get(str(rid)).status == "succeeded", r.relay_id))
    assert {row_status(r.pk) for r in rows} == {"pending"}, "no callback reached the projection"
    assert reconcile(older_than=timedelta(hours=1)) == 0, "not yet older than the bound"
    assert reconcile(older_than=timedelta(0)) == 3
    assert {row_status(r.pk) for r in rows} == {"succeeded"}
    assert reconcile(older_than=timedelta(0)) == 0, "nothing left to repair"


def test_refresh_asks_relay_now(relay, signing, live_server):
    signing["SIGNING_SECRETS"] = ["whsec_" + "D" * 43 + "="]
    row = enqueue_noop()
    with relay.client() as client:
        wait_for("Relay to finish", lambda: client.get(str(row.relay_id)).status == "succeeded")
    assert row_status(row.pk) == "pending"
    assert refresh(RelayJob.objects.get(pk=row.pk)).status == "succeeded"
    res = httpx.get(f"{live_server.url}/orders/{row.pk}/refresh")
    assert res.json()["status"] == "succeeded"
