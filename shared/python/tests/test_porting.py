"""Item 7 of issue 36, found porting a real client: Django 5.2 LTS (through the django-tasks
backport) as well as 6.x, refresh() never posting before the commit, and the caller's own
idempotency keys."""

from __future__ import annotations

import os
import uuid

import django
import pytest
from django.db import transaction

from relay_client import IdempotencyKeyReused
from relay_client.django import correlation, drain, refresh
from relay_client.django._compat import InvalidTask
from relay_client.django.models import RelayJob
from shop.tasks import noop

from .conftest import jobs_on_relay

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_suite_runs_on_the_django_it_was_asked_for():
    """``tests/python.rs`` runs this suite once per supported Django and says which."""
    expected = os.environ.get("RELAY_EXPECT_DJANGO")
    if expected is None:
        pytest.skip("RELAY_EXPECT_DJANGO not set (cargo test sets it)")
    assert f"{django.VERSION[0]}.{django.VERSION[1]}" == expected
    import relay_client.django._compat as compat

    assert compat.Task.__module__.startswith("django.tasks" if django.VERSION >= (6,) else "django_tasks")


def test_refresh_inside_the_transaction_never_posts_before_the_commit(relay, relay_settings):
    corr = f"refresh-rollback-{uuid.uuid4()}"
    with pytest.raises(RuntimeError), transaction.atomic(), correlation(corr):
        result = noop.enqueue()
        row = refresh(RelayJob.objects.get(pk=result.id))
        assert row.posted_at is None
        raise RuntimeError("the change fails after the refresh")
    assert jobs_on_relay(relay, corr) == [], "Relay never heard of the rolled-back row"

    corr = f"refresh-commit-{uuid.uuid4()}"
    with transaction.atomic(), correlation(corr):
        result = noop.enqueue()
        refresh(RelayJob.objects.get(pk=result.id))
    assert len(jobs_on_relay(relay, corr)) == 1, "the commit posts it, once"


def test_the_callers_own_idempotency_key_is_sent_and_scoped_to_one_row(relay, relay_conf):
    key = f"recipient-list.member-upsert:{uuid.uuid4().hex[:8]}"
    corr = f"own-key-{uuid.uuid4()}"
    with transaction.atomic(), correlation(corr):
        first = noop.using(idempotency_key=key).enqueue(echo=1)
        again = noop.using(idempotency_key=key).enqueue(echo=1)
    assert again.id == first.id and RelayJob.objects.filter(idempotency_key=key).count() == 1
    [job] = jobs_on_relay(relay, corr)
    assert job.idempotency_key == key
    with pytest.raises(IdempotencyKeyReused) as reused, transaction.atomic():
        noop.using(idempotency_key=key).enqueue(echo=2)
    assert reused.value.job_id == first.id
    with pytest.raises(InvalidTask, match="reserved"):
        noop.using(idempotency_key=str(first.id))
    # Left unsent (Relay down at the commit), the row is posted by the drain with the same key.
    relay_conf["URL"] = "http://127.0.0.1:1"
    other = f"member-upsert:{uuid.uuid4().hex[:8]}"
    with transaction.atomic(), correlation(corr):
        noop.using(idempotency_key=other).enqueue()
    relay_conf["URL"] = relay.url
    assert drain().posted == 1
    assert sorted(j.idempotency_key for j in jobs_on_relay(relay, corr)) == sorted([key, other])
