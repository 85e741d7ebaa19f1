"""Item 1 of issue 48: a commit costs the same whatever it enqueued and however Relay answers.

A view enqueues 300 jobs in one transaction: the commit is measured beside django-tasks-db's for
the same 300 enqueues in the same run, with Relay up and with a Relay that accepts connections
and never answers. Every job reaches Relay exactly once (the commit's one batch post, or the drain
after it)."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from relay_client.django import drain
from relay_client.django.models import RelayJob

from .conftest import jobs_on_relay, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

N = 300
BOUND = 0.2


def enqueue_many(live_server, backend: str, corr: str) -> dict:
    res = httpx.post(
        f"{live_server.url}/enqueue-many", json={"n": N, "backend": backend, "correlation_id": corr}, timeout=120
    )
    assert res.status_code == 201, res.text
    return res.json()


def test_300_enqueues_in_one_transaction_commit_within_the_bound_with_relay_up_or_silent(
    relay, relay_conf, live_server, silent_relay
):
    from relay_client.django import catalogue

    relay_conf["POST_IN_BACKGROUND"] = True  # the default (the suite's settings wait)
    catalogue.prefetch().wait(5)  # as at start-up (AppConfig.ready)
    local = enqueue_many(live_server, "tasks_db", f"tasks-db-{uuid.uuid4()}")

    relay_conf["TIMEOUT"] = 30.0  # each network wait of the post after the commit

    up = f"up-{uuid.uuid4()}"
    started = time.monotonic()
    on_relay = enqueue_many(live_server, "relay", up)
    # Relay up: the one post after the commit brought every job, once.
    rows = RelayJob.objects.filter(correlation_id=up)
    wait_for("the commit's post", lambda: not rows.filter(posted_at__isnull=True).exists(), timeout=60)
    posted_after = time.monotonic() - started
    jobs = jobs_on_relay(relay, up)
    assert len(jobs) == N and len({j.idempotency_key for j in jobs}) == N
    assert set(rows.values_list("relay_id", flat=True)) == {uuid.UUID(j.id) for j in jobs}

    relay_conf.update(URL=silent_relay, TIMEOUT=2.0)
    down = f"silent-{uuid.uuid4()}"
    silent = enqueue_many(live_server, "relay", down)
    print(
        f"\n300 enqueues in one transaction, commit (enqueues) in seconds: django-tasks-db "
        f"{local['commit_s']:.4f} ({local['enqueue_s']:.3f}); Relay up {on_relay['commit_s']:.4f} "
        f"({on_relay['enqueue_s']:.3f}); Relay silent {silent['commit_s']:.4f} ({silent['enqueue_s']:.3f}); "
        f"all 300 posted {posted_after:.2f} s after the view began"
    )
    assert on_relay["commit_s"] <= BOUND, on_relay
    assert silent["commit_s"] <= BOUND, silent

    # Relay silent: the post gave up after POST_TIMEOUT; every row waits for the drain.
    silent_rows = RelayJob.objects.filter(correlation_id=down)
    wait_for(
        "the hung post to give up",
        lambda: silent_rows.filter(post_code="transport").count() == N,
        timeout=30,
    )
    assert not silent_rows.filter(posted_at__isnull=False).exists()
    relay_conf.update(URL=relay.url, TIMEOUT=30.0)
    assert drain().posted == N
    jobs = jobs_on_relay(relay, down)
    assert len(jobs) == N and len({j.idempotency_key for j in jobs}) == N
    assert drain().posted == 0
    assert len(jobs_on_relay(relay, up)) == N, "the drain sent nothing twice"


def test_a_commit_that_waits_for_its_post_waits_one_bound_for_all_its_rows(
    relay, relay_conf, live_server, silent_relay
):
    from relay_client.django import catalogue

    catalogue.prefetch().wait(5)
    relay_conf.update(POST_IN_BACKGROUND=False, POST_TIMEOUT=0.5)
    up = f"wait-up-{uuid.uuid4()}"
    on_relay = enqueue_many(live_server, "relay", up)
    posted = RelayJob.objects.filter(correlation_id=up, posted_at__isnull=False).count()
    wait_for("the post", lambda: not RelayJob.objects.filter(correlation_id=up, posted_at__isnull=True).exists())
    relay_conf.update(URL=silent_relay, TIMEOUT=2.0)
    down = f"wait-silent-{uuid.uuid4()}"
    silent = enqueue_many(live_server, "relay", down)
    print(
        f"\n300 enqueues, the commit waiting for its post (POST_TIMEOUT 0.5 s): Relay up {on_relay['commit_s']:.3f} s "
        f"({posted} posted by then), Relay silent {silent['commit_s']:.3f} s"
    )
    assert silent["commit_s"] < 0.5 + 0.15, silent
    assert on_relay["commit_s"] < 0.5 + 0.15, on_relay
    wait_for("the silent post to give up", lambda: RelayJob.objects.filter(post_code="transport").count() == N)
    relay_conf.update(URL=relay.url, TIMEOUT=30.0)
    assert drain().posted == N
    assert len(jobs_on_relay(relay, up)) == N and len(jobs_on_relay(relay, down)) == N
