"""Item 8 of issue 36: the admin for the rows, pruning, and ``relay_worker`` (drain, reconcile and
the declared schedules, each slot once across workers, a clean stop on SIGTERM)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from relay_client.django import correlation, relay_task
from relay_client.django.models import RANK, RelayJob, ScheduleSlot
from shop.tasks import noop

from .conftest import EXAMPLE, child_env, jobs_on_relay, run_manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


def test_the_admin_filters_by_status_and_posts_a_blocked_row_now(relay, relay_conf):
    name = f"dest{uuid.uuid4().hex[:8]}"
    corr = f"admin-{uuid.uuid4()}"
    with transaction.atomic(), correlation(corr):
        blocked = relay_task("http.request").enqueue(destination=name, method="POST", path="/x")
        fine = noop.enqueue()
    client = admin_client()
    page = client.get("/admin/relay/relayjob/", {"status__exact": "blocked"})
    assert page.status_code == 200
    assert blocked.id in page.content.decode() and fine.id not in page.content.decode()
    assert relay.api("PUT", f"/v1/destinations/{name}", json={"base_url": "http://127.0.0.1:9/"}).status_code < 300
    res = client.post("/admin/relay/relayjob/", {"action": "post_now", "_selected_action": [blocked.id]}, follow=True)
    assert res.status_code == 200 and "1 of 1 unsent rows posted" in res.content.decode()
    assert RelayJob.objects.get(pk=blocked.id).relay_id is not None
    assert len(jobs_on_relay(relay, corr)) == 2
    res = client.post(
        "/admin/relay/relayjob/", {"action": "refresh_from_relay", "_selected_action": [fine.id]}, follow=True
    )
    assert "1 rows refreshed from Relay" in res.content.decode()
    assert RelayJob.objects.get(pk=fine.id).synced_at is not None


def test_relay_prune_deletes_only_old_finished_rows(relay_settings):
    old = timezone.now() - timedelta(days=40)

    def row(status: str, **kw) -> RelayJob:
        r = RelayJob.objects.create(
            task_type="noop", correlation_id="prune", status=status, status_rank=RANK[status], **kw
        )
        RelayJob.objects.filter(pk=r.pk).update(created_at=old)
        return r

    gone = [row("succeeded", finished_at=old, posted_at=old), row("refused", posted_at=old)]
    kept = [
        row("unsent"),
        row("blocked"),
        row("pending", posted_at=old),
        row("failed", finished_at=timezone.now() - timedelta(days=1), posted_at=old),
    ]
    db = connection.settings_dict["NAME"]
    assert "would delete 2" in run_manage("relay_prune", "--days", "30", "--dry-run", db_name=db).stdout
    assert RelayJob.objects.count() == 6
    assert "deleted 2" in run_manage("relay_prune", "--days", "30", db_name=db).stdout
    assert set(RelayJob.objects.values_list("pk", flat=True)) == {r.pk for r in kept}
    assert not RelayJob.objects.filter(pk__in=[r.pk for r in gone]).exists()


def leave_unsent(relay_conf: dict, corr: str) -> str:
    url = relay_conf["URL"]
    relay_conf["URL"] = "http://127.0.0.1:1"
    with transaction.atomic(), correlation(corr):
        result = noop.enqueue()
    relay_conf["URL"] = url
    return result.id


def test_workers_at_once_fire_each_schedule_slot_once(relay, relay_conf):
    from django_tasks_db.models import DBTaskResult

    db = connection.settings_dict["NAME"]
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "relay_worker", "--once", "--min-age", "0"],
            cwd=EXAMPLE,
            env=child_env(db),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    minutely = ScheduleSlot.objects.filter(name="minutely-tally").count()
    assert 1 <= minutely <= 2, "one slot (two if the workers straddled a minute)"
    # Between 02:00 and 03:00 UTC nightly-tally's slot is in its catch-up hour and fires too; a
    # pass says "fired a@slot, b@slot".
    slots = list(ScheduleSlot.objects.filter(name__in=["minutely-tally", "nightly-tally"]))
    fired = sum(out.count("-tally@") for out, _ in outs)
    assert fired == len(slots), outs
    runs = DBTaskResult.objects.filter(task_path="shop.tasks.tally_orders")
    assert runs.count() == len(slots) and {s.task_result_id for s in slots} == {str(r.id) for r in runs}
    assert not ScheduleSlot.objects.filter(name="nightly-tally", slot__lt=datetime.now(UTC) - timedelta(hours=1))


def test_relay_worker_drains_reconciles_and_stops_cleanly_on_sigterm(relay, relay_conf):
    corr = f"worker-{uuid.uuid4()}"
    row_id = leave_unsent(relay_conf, corr)
    with transaction.atomic():
        deferred = noop.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue()
    db = connection.settings_dict["NAME"]
    worker = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "relay_worker",
            "--drain-every",
            "0.5",
            "--min-age",
            "0",
            "--reconcile-every",
            "0.5",
            "--older-than",
            "0",
            "--schedules-every",
            "0.5",
        ],
        cwd=EXAMPLE,
        env=child_env(db),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("the worker's drain", lambda: RelayJob.objects.get(pk=row_id).relay_id, timeout=30)
        wait_for(
            "the worker's reconcile",
            lambda: RelayJob.objects.get(pk=deferred.id).waiting_reason == "not_due",
            timeout=30,
        )
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=15)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err
    assert "relay worker started" in out and "drain: posted 1" in out and out.rstrip().endswith("relay worker stopped")
    assert len(jobs_on_relay(relay, corr)) == 1
