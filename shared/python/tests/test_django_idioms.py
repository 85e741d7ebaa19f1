"""Items 5 and 6 of issue 36: Django's way of testing (DummyBackend, override_settings) and
Django's contract (task_enqueued, TaskResult fields, refresh() asking Relay, options per task and
per call, priority refused by name, typed relay_task, a stale timestamp named as such, the
waiting reason on the row)."""

from __future__ import annotations

import copy
import json
import pickle
import typing
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from django.db import DataError, transaction
from django.test import override_settings
from standardwebhooks import Webhook

from relay_client.django import correlation, reconcile, relay_task
from relay_client.django._compat import DummyBackend, InvalidTask, TaskResultStatus, task_backends, task_enqueued
from relay_client.django.backend import RelayTask
from relay_client.django.models import RelayJob
from shop.tasks import email_send, noop

from .conftest import jobs_on_relay, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DUMMY = f"{DummyBackend.__module__}.{DummyBackend.__name__}"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}, "relay": {"BACKEND": DUMMY}}


def test_with_the_dummy_backend_tasks_are_declared_and_enqueues_recorded(relay_settings):
    with override_settings(TASKS=TASKS):
        declared_here = relay_task("email.send", max_attempts=2)  # importing a tasks.py under the test settings
        result = email_send.enqueue(**{"from": "shop@example.com"}, to=["a@example.com"], text="t")
        declared_here.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(to=["b@example.com"])
        backend = task_backends["relay"]
        assert isinstance(backend, DummyBackend)
        assert [r.kwargs["to"] for r in backend.results] == [["a@example.com"], ["b@example.com"]]
        assert backend.results[0].id == result.id and result.task.name == "email.send"
        backend.clear()
    assert not RelayJob.objects.exists(), "nothing reached the outbox"
    again = pickle.loads(pickle.dumps(email_send))
    assert again == email_send and copy.deepcopy(email_send) == email_send


def test_task_enqueued_is_sent_with_the_result(relay, relay_settings):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        with transaction.atomic():
            result = noop.enqueue(echo="hi")
    finally:
        task_enqueued.disconnect(receiver)
    [(sender, sent)] = seen
    assert sender.__name__ == "RelayBackend" and sent.id == result.id and sent.kwargs == {"echo": "hi"}


def test_an_ordering_key_queues_jobs_behind_each_other_on_relay(relay, relay_settings):
    corr = f"ordering-{uuid.uuid4()}"
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    with transaction.atomic(), correlation(corr):
        first = noop.using(ordering_key="member-7", run_after=later).enqueue(echo="upsert")
        noop.using(ordering_key="member-7", ordering_on_failure="cancel").enqueue(echo="remove")
    jobs = {j.raw["params"]["echo"]: j for j in jobs_on_relay(relay, corr)}
    ahead = RelayJob.objects.get(pk=first.id).relay_id
    assert jobs["remove"].raw["waiting_reason"] == "ordered_behind"
    assert jobs["remove"].raw["ordered_behind"] == str(ahead)
    with pytest.raises(InvalidTask, match="ordering_key must be"):
        noop.using(ordering_key="a\x01b")
    with pytest.raises(InvalidTask, match="'hold' or 'cancel'"):
        noop.using(ordering_key="k", ordering_on_failure="skip")
    with pytest.raises(InvalidTask, match="goes with an ordering_key"):
        noop.using(ordering_on_failure="hold")


def test_refresh_asks_relay_and_fills_attempts_and_started_at(relay, signing, live_server):
    signing["SIGNING_SECRETS"] = ["whsec_" + "E" * 43 + "="]  # callbacks refused: only refresh() can learn
    with transaction.atomic():
        result = noop.enqueue(echo="done")
    row = RelayJob.objects.get(pk=result.id)
    with relay.client() as client:
        wait_for("Relay to finish", lambda: client.get(str(row.relay_id)).status == "succeeded")
    assert result.status == TaskResultStatus.READY and result.attempts == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"echo": "done"}
    assert result.attempts == 1 and result.started_at is not None and result.finished_at >= result.started_at


def test_options_per_task_and_per_call_reach_the_job(relay, relay_settings):
    corr = f"options-{uuid.uuid4()}"
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    limited = relay_task("noop", max_attempts=2, timeout_seconds=30)
    with transaction.atomic(), correlation(corr):
        limited.using(concurrency_key="acct-7", concurrency_limit=1, run_after=later).enqueue()
        limited.using(max_attempts=7).enqueue()
    jobs = sorted(jobs_on_relay(relay, corr), key=lambda j: j.raw["max_attempts"])
    assert [(j.raw["max_attempts"], j.raw["timeout_seconds"]) for j in jobs] == [(2, 30), (7, 30)]
    assert (jobs[0].raw["concurrency_key"], jobs[0].raw["concurrency_limit"]) == ("acct-7", 1)
    assert datetime.fromisoformat(jobs[0].raw["run_at"].replace("Z", "+00:00")) == later
    with pytest.raises(InvalidTask, match="whole number"):
        noop.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="whole number"):
        noop.using(timeout_seconds=86_401)
    with pytest.raises(InvalidTask, match="go together"):
        noop.using(concurrency_limit=2)
    with pytest.raises(InvalidTask, match="go together"):
        noop.using(concurrency_key="acct-7")
    with pytest.raises(InvalidTask, match="concurrency_key must be"):
        noop.using(concurrency_key="a\x00b", concurrency_limit=1)
    with pytest.raises(InvalidTask, match="idempotency_key must be"):
        noop.using(idempotency_key="clé ünïcode")
    for bad in ("x" * 201, "tab\there"):
        with pytest.raises(InvalidTask, match="correlation id"), correlation(bad):
            noop.enqueue()
    with pytest.raises(DataError), transaction.atomic():  # Postgres refuses a NUL in JSON: at enqueue
        noop.enqueue(echo="a\x00b")
    noop_result = noop.enqueue(echo="ünïcode ☃ " + "\U0001f600")
    assert RelayJob.objects.get(pk=noop_result.id).params == {"echo": "ünïcode ☃ \U0001f600"}


def test_priority_is_refused_by_name_and_relay_task_is_typed(relay_settings):
    with pytest.raises(InvalidTask, match="no priorities.*run_after"):
        noop.using(priority=5)
    assert typing.get_type_hints(relay_task)["return"] is RelayTask
    assert typing.get_type_hints(RelayTask.using)["return"] is RelayTask


def signed(body: dict, secret: str, at: datetime) -> tuple[str, dict]:
    data = json.dumps(body)
    msg_id = f"cb_{uuid.uuid4()}"
    return data, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, data),
        "content-type": "application/json",
    }


def test_a_stale_timestamp_is_named_as_such(relay, signing, live_server):
    secret = signing["SIGNING_SECRETS"][0]
    body = {"type": "job.succeeded", "data": {}}
    data, headers = signed(body, secret, datetime.now(UTC) - timedelta(minutes=10))
    res = httpx.post(f"{live_server.url}/relay/callbacks", content=data, headers=headers)
    assert res.status_code == 400 and res.json()["error"]["code"] == "stale_timestamp", res.text
    data, headers = signed(body, "whsec_" + "F" * 43 + "=", datetime.now(UTC) - timedelta(minutes=10))
    res = httpx.post(f"{live_server.url}/relay/callbacks", content=data, headers=headers)
    assert res.status_code == 400 and res.json()["error"]["code"] == "bad_signature", "another secret's is forged"


def test_a_receiver_without_a_secret_says_which_setting_is_empty(relay, signing, live_server, caplog):
    """Step 5 of the GUIDE done halfway (the PUT, no restart with the secret): the log names the setting."""
    data, headers = signed({"type": "job.succeeded", "data": {}}, signing["SIGNING_SECRETS"][0], datetime.now(UTC))
    signing["SIGNING_SECRETS"] = []
    with caplog.at_level("WARNING", logger="relay_client"):
        res = httpx.post(f"{live_server.url}/relay/callbacks", content=data, headers=headers)
    assert res.status_code == 400 and res.json()["error"]["code"] == "bad_signature", res.text
    assert "holds no signing secret" in res.json()["error"]["message"]
    assert "RELAY['SIGNING_SECRETS'] is empty" in caplog.text, caplog.text


def test_a_deferred_jobs_waiting_reason_reaches_the_row(relay, relay_settings):
    with transaction.atomic():
        result = noop.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue()
    assert RelayJob.objects.get(pk=result.id).waiting_reason is None, "the submit's answer does not say"
    reconcile(older_than=timedelta(0))
    assert RelayJob.objects.get(pk=result.id).waiting_reason == "not_due"


def test_the_guide_says_how_to_let_http_request_out():
    guide = (Path(__file__).parents[1] / "GUIDE.md").read_text()
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "relay modes set write:http on" in guide and "write:http" in readme
