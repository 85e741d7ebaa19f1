"""``after``: a job that runs after others, through the client against a real ``relay dev``."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction

from relay_client import Conflict, JobRequest
from relay_client.django import outbox
from relay_client.django._compat import InvalidTask
from relay_client.django.models import RelayJob
from shop.tasks import noop

from .conftest import Relay, wait_for


def req(task_type: str = "noop", **kw) -> JobRequest:
    return JobRequest(task_type=task_type, idempotency_key=str(uuid.uuid4()), correlation_id="deps", **kw)


def test_the_client_sends_after_and_the_job_waits_for_its_dependency(relay: Relay):
    assert "after" not in req().body(), "no after, no field: the request hash of old requests holds"
    with pytest.raises(ValueError):
        req(after="not-a-list")
    with relay.client() as client:
        first = client.submit(req(delay_seconds=2))
        then = client.submit(req(after=[first.id]))
        waiting = client.get(then.id)
        assert (waiting.status, waiting.raw["waiting_reason"]) == ("pending", "waiting_for_dependency")
        done = wait_for("the dependent to finish", lambda: (j := client.get(then.id)).terminal and j)
        assert done.status == "succeeded"
        first_end = client.get(first.id).finished_at
        assert done.started_at is not None and first_end is not None and done.started_at >= first_end
        with pytest.raises(Conflict) as unknown:
            client.submit(req(after=[str(uuid.uuid4())]))
        assert (unknown.value.code, unknown.value.field) == ("unknown_dependency", "after[0]")


@pytest.mark.django_db(transaction=True)
def test_a_relay_task_runs_after_another_enqueued_in_the_same_transaction(relay: Relay, relay_settings: dict):
    with pytest.raises(InvalidTask):
        noop.using(after=["not-a-uuid"]).enqueue()
    with pytest.raises(InvalidTask):
        noop.using(after=[str(uuid.uuid4())] * 101).enqueue()
    with transaction.atomic():
        first = noop.enqueue()
        then = noop.using(after=[first.id]).enqueue()
        assert RelayJob.objects.get(pk=then.id).options["after"] == [first.id]
    # Both posted by the commit's one post, the dependent in a second round once the first has its
    # job; what that post did not place is the drain's (as the worker would run it).
    posted = RelayJob.objects.filter(pk__in=[first.id, then.id], relay_id__isnull=False)
    try:
        wait_for("both posted", lambda: posted.count() == 2, timeout=15)
    except AssertionError:
        left = list(RelayJob.objects.filter(relay_id__isnull=True).values("pk", "status", "post_code", "post_error"))
        print(f"the commit's post left {left}; the drain posts them")  # seen in full runs under load
        outbox.drain()
    first_row, then_row = RelayJob.objects.get(pk=first.id), RelayJob.objects.get(pk=then.id)
    assert first_row.relay_id is not None and then_row.relay_id is not None, "both posted, in order"
    # The outbox row's id became the Relay job's id in the request.
    assert outbox.request_for(then_row).after == [str(first_row.relay_id)]
    with relay.client() as client:
        done = wait_for(
            "the dependent to finish", lambda: (j := client.get(str(then_row.relay_id))).terminal and j, timeout=90
        )
        first_end = client.get(str(first_row.relay_id)).finished_at
    assert done.status == "succeeded"
    assert done.started_at is not None and first_end is not None and done.started_at >= first_end
