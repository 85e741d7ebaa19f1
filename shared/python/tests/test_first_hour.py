"""Item 5 of issue 48: what a team hits in its first hour. ``relay_drain`` fails when Relay did
not take the outbox; a Relay task on a backend that would run it here is refused by name;
``relay_client.testing`` records enqueues; a key Relay refused takes the corrected request; the
commands say their units."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

from relay_client.django import InvalidTask, correlation, relay_task
from relay_client.django._compat import DummyBackend
from relay_client.django._compat import InvalidTask as CompatInvalidTask
from relay_client.django.models import RelayJob
from relay_client.testing import relay_enqueues
from shop.tasks import email_send, noop

from .conftest import jobs_on_relay, run_manage

pytestmark = pytest.mark.django_db(transaction=True)

IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
if DummyBackend.__module__.startswith("django_tasks"):
    IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"


@pytest.mark.parametrize("relay_url", ["http://127.0.0.1:1", "silent"])
def test_relay_drain_exits_non_zero_when_relay_does_not_take_the_rows(relay, relay_settings, silent_relay, relay_url):
    corr = f"drain-exit-{uuid.uuid4()}"
    RelayJob.objects.create(task_type="noop", params={}, correlation_id=corr)
    url = silent_relay if relay_url == "silent" else relay_url
    started = time.monotonic()
    out = run_manage(
        "relay_drain",
        "--timeout",
        "0.5",
        db_name=connection.settings_dict["NAME"],
        check=False,
        env_overrides={"RELAY_URL": url},
        timeout=60,
    )
    took = time.monotonic() - started
    assert out.returncode != 0, out.stdout
    assert "left unsent" in out.stderr and "transport" in out.stderr, out.stderr
    assert took < 10, f"--timeout 0.5: the drain took {took:.1f}s"
    assert RelayJob.objects.get(correlation_id=corr).posted_at is None
    ok = run_manage("relay_drain", db_name=connection.settings_dict["NAME"], check=False)
    assert ok.returncode == 0, ok.stderr
    assert len(jobs_on_relay(relay, corr)) == 1


def test_a_relay_task_on_a_backend_that_would_run_it_here_is_refused_by_name(relay_settings):
    assert InvalidTask is CompatInvalidTask, "one name on both Djangos"
    with pytest.raises(InvalidTask, match=r"TASKS\['default'\] is relay_client\.django\.local\.LocalBackend"):
        relay_task("noop", backend="default")
    with override_settings(TASKS={"default": {"BACKEND": IMMEDIATE}, "relay": {"BACKEND": IMMEDIATE}}):
        with pytest.raises(InvalidTask, match="ImmediateBackend.*relay_enqueues"):
            noop.enqueue(echo="x")
    assert not RelayJob.objects.exists()


def test_relay_enqueues_records_what_a_view_enqueued(relay_settings):
    with relay_enqueues() as relay:
        res = Client().post("/orders", {"email": "a@example.com", "total_cents": 100}, content_type="application/json")
        assert res.status_code == 201
    result = relay.assert_enqueued("email.send", to=["a@example.com"], subject="Your order")
    assert result.id == res.json()["job"]
    with pytest.raises(AssertionError, match="0 enqueues of email.send"):
        relay.assert_enqueued("email.send", to=["b@example.com"])
    assert not RelayJob.objects.exists(), "nothing reached the outbox"
    with relay_enqueues() as nothing:
        nothing.assert_nothing_enqueued()


def test_a_key_relay_refused_takes_the_corrected_request(relay, relay_settings):
    key, corr = f"order-confirmation:{uuid.uuid4()}", f"rekey-{uuid.uuid4()}"
    relay_settings["VALIDATE"] = False  # as if the client could not know: Relay refuses at the post
    try:
        with transaction.atomic(), correlation(corr):
            bad = email_send.using(idempotency_key=key).enqueue(
                **{"from": "shop@example.com"}, to=["not an address"], subject="s", text="t"
            )
    finally:
        relay_settings["VALIDATE"] = True
    assert RelayJob.objects.get(pk=bad.id).status == "refused"
    with transaction.atomic(), correlation(corr):
        good = email_send.using(idempotency_key=key).enqueue(
            **{"from": "shop@example.com"}, to=["a@example.com"], subject="s", text="t"
        )
    assert good.id != bad.id
    row = RelayJob.objects.get(pk=good.id)
    assert (row.idempotency_key, row.status != "refused", row.relay_id is not None) == (key, True, True)
    refused = RelayJob.objects.get(pk=bad.id)
    assert refused.status == "refused" and refused.idempotency_key is None and key in refused.post_error
    [job] = jobs_on_relay(relay, corr)
    assert job.idempotency_key == key
    # The same (corrected) request again is the same row; another one is still refused.
    again = email_send.using(idempotency_key=key).enqueue(
        **{"from": "shop@example.com"}, to=["a@example.com"], subject="s", text="t"
    )
    assert again.id == good.id


def test_the_commands_say_their_units_and_defaults(relay_settings):
    db = connection.settings_dict["NAME"]
    reconcile = run_manage("relay_reconcile", "--help", db_name=db).stdout
    assert "--older-than SECONDS" in reconcile and "default 600" in reconcile, reconcile
    prune = run_manage("relay_prune", "--help", db_name=db).stdout
    assert "--days DAYS" in prune and "default 30" in prune, prune
