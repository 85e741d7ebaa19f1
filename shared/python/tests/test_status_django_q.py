"""The status collector on a django-q2 project (issue 35, item 5): real django-q2 rows (the ORM
broker's queue, a cluster's run of them, a failure, schedules fired by django-q2's scheduler)
make a document that validates against the status contract, with the figures checked; and a
project in the middle of its move shows both sources."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import OrmQ, Schedule, Task
from django_q.scheduler import scheduler
from django_q.tasks import async_task, schedule

from relay_client.django.checks import check_settings
from relay_client.django.status import document, sources
from shop.tasks import tally_orders

from .conftest import EXAMPLE, wait_for
from .test_status import validate

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "q2-status-key"


@pytest.fixture
def relay_setting() -> Iterator[dict]:
    """The RELAY setting with a status key, restored afterwards (no Relay needed: nothing posts)."""
    before = dict(settings.RELAY)
    settings.RELAY["STATUS_KEYS"] = [KEY]
    yield settings.RELAY
    settings.RELAY.clear()
    settings.RELAY.update(before)


def status(live_server) -> dict:
    res = httpx.get(f"{live_server.url}/relay/status", headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    assert res.status_code == 200, res.text
    doc = res.json()
    validate(doc)
    return doc


def qcluster() -> subprocess.Popen:
    """django-q2's own cluster (``manage.py qcluster``) on the test database."""
    env = {
        **os.environ,
        "DJANGO_DB_NAME": connection.settings_dict["NAME"],
        "RELAY_API_KEY": "rk_unused",  # the system checks want one; the cluster never posts to Relay
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(EXAMPLE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=EXAMPLE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode(errors="replace")


def test_a_django_q2_projects_status_document_validates_and_reports_its_work(relay_setting, live_server):
    relay_setting["STATUS_SOURCES"] = ["django_q"]
    now = timezone.now()
    schedule(
        "shop.legacy.tally_orders",
        name="q-hourly-tally",
        schedule_type=Schedule.MINUTES,
        minutes=60,
        next_run=now - timedelta(seconds=5),
    )
    schedule("shop.legacy.tally_orders", name="q-nightly-tally", schedule_type=Schedule.CRON, cron="0 3 * * *")
    schedule("shop.legacy.tally_orders", name="q-batch-later", next_run=now + timedelta(hours=1))  # deferred, ONCE
    ok = async_task("shop.legacy.tally_orders")
    bad = async_task("shop.legacy.broken")
    scheduler(broker=get_broker())  # django-q2's scheduler queues the hourly schedule's due run

    before = status(live_server)
    assert before["project"] == "shop"
    assert {q["name"] for q in before["queues"]} == {"relay-outbox", "shop"}, "django-q2's queue only"
    shop = {q["name"]: q for q in before["queues"]}["shop"]
    assert (shop["transport"], shop["depth"], shop["running"], shop["scheduled"]) == ("django-q2", 3, 0, 1), shop
    waited = (timezone.now() - now).total_seconds()
    assert 0 < shop["oldest_pending_age_s"] <= waited + 1, (shop, waited)
    pending = {r["id"]: r for r in before["recent_runs"]}
    assert pending[ok]["status"] == pending[bad]["status"] == "pending"
    assert pending[bad]["task_type"] == "shop.legacy.broken"
    assert before["failures"] == {"last_hour": 0, "last_24h": 0, "open_exceptions": 0}
    assert before["workers"] == []

    cluster = qcluster()
    try:
        ran = wait_for("the cluster's three runs", lambda: Task.objects.count() == 3 or cluster.poll() is not None, 60)
        during = wait_for("the cluster's heartbeat", lambda: status(live_server)["workers"] or cluster.poll(), 20)
    finally:
        out = stop(cluster)
    assert ran and Task.objects.count() == 3, out
    [retry] = OrmQ.objects.all()
    assert retry.task["id"] == bad and retry.lock > timezone.now(), "the failed attempt waits for its retry"
    [worker] = during
    assert (worker["kind"], worker["host"], worker["pid"]) == ("qcluster", socket.gethostname(), cluster.pid)

    claimed = async_task("shop.legacy.tally_orders")
    assert len(get_broker().dequeue() or []) == 1, "a cluster's claim on the one queued row"
    waiting = async_task("shop.legacy.tally_orders")

    after = status(live_server)
    shop = {q["name"]: q for q in after["queues"]}["shop"]
    assert (shop["depth"], shop["running"], shop["scheduled"]) == (1, 1, 2), "the retry is scheduled, not running"
    runs = {r["id"]: r for r in after["recent_runs"]}
    assert (runs[ok]["status"], runs[ok]["attempt"], runs[ok]["last_error"]) == ("succeeded", 1, None)
    assert runs[ok]["finished_at"] is not None
    assert (runs[bad]["status"], runs[bad]["attempt"]) == ("pending", 1), runs[bad]
    assert runs[bad]["run_at"] == retry.lock.isoformat().replace("+00:00", "Z")
    assert runs[bad]["last_error"] == "this legacy task always fails", runs[bad]
    assert (runs[claimed]["status"], runs[waiting]["status"]) == ("running", "pending")
    assert after["failures"] == {"last_hour": 1, "last_24h": 1, "open_exceptions": 0}
    scheds = {s["name"]: s for s in after["schedules"]}
    assert "q-batch-later" not in scheds, "a ONCE row is deferred work (the queue's scheduled), not a schedule"
    hourly = scheds["q-hourly-tally"]
    assert (hourly["cron"], hourly["last_outcome"]) == (None, "succeeded"), hourly
    assert hourly["next_run_at"] == Schedule.objects.get(name="q-hourly-tally").next_run.isoformat().replace(
        "+00:00", "Z"
    )
    nightly = scheds["q-nightly-tally"]
    assert (nightly["cron"], nightly["last_outcome"], nightly["last_run_at"]) == ("0 3 * * *", None, None)
    assert nightly["next_run_at"].endswith("T03:00:00Z"), nightly

    # The failed attempt's claim lapses: due again; a cluster claims it: its next attempt runs.
    OrmQ.objects.filter(pk=retry.pk).update(lock=timezone.now() - timedelta(seconds=1))
    lapsed = status(live_server)
    shop = {q["name"]: q for q in lapsed["queues"]}["shop"]
    assert (shop["depth"], shop["running"], shop["scheduled"]) == (2, 1, 1), shop
    assert {r["id"]: r for r in lapsed["recent_runs"]}[bad]["run_at"] is None
    broker = get_broker()  # claims one row a call (Q_CLUSTER["bulk"] is 1)
    assert len((broker.dequeue() or []) + (broker.dequeue() or [])) == 2, "the retry and the waiting row"
    again = status(live_server)
    shop = {q["name"]: q for q in again["queues"]}["shop"]
    assert (shop["depth"], shop["running"], shop["scheduled"]) == (0, 3, 1), shop
    assert ({r["id"]: r for r in again["recent_runs"]}[bad]["status"], runs[bad]["attempt"]) == ("running", 1)

    Schedule.objects.filter(name="q-nightly-tally").update(repeats=0)
    assert {s["name"]: s for s in document()["schedules"]}["q-nightly-tally"]["next_run_at"] is None, "ended"


def test_a_late_deferred_row_counts_as_due_until_a_scheduler_queues_it(relay_setting):
    relay_setting["STATUS_SOURCES"] = "django_q"
    now = timezone.now()
    schedule("shop.legacy.tally_orders", name="q-batch-late", next_run=now - timedelta(minutes=10))
    shop = {q["name"]: q for q in document(now)["queues"]}["shop"]
    assert (shop["depth"], shop["scheduled"], shop["running"]) == (1, 0, 0), shop
    assert 599 <= shop["oldest_pending_age_s"] <= 601, "late since its time, not since it was written"


def test_a_project_mid_move_shows_both_sources(relay_setting, live_server):
    assert "STATUS_SOURCES" not in relay_setting
    assert sources() == ["django_tasks_db", "django_q"], "each installed source, by default"
    tally_orders.enqueue()
    moved = async_task("shop.legacy.tally_orders")
    doc = status(live_server)
    queues = {q["name"]: (q["transport"], q["depth"]) for q in doc["queues"]}
    assert queues == {"relay-outbox": ("outbox", 0), "default": ("django-tasks-db", 1), "shop": ("django-q2", 1)}
    kinds = {r["task_type"] for r in doc["recent_runs"]}
    assert {"shop.tasks.tally_orders", "shop.legacy.tally_orders"} <= kinds, kinds
    assert moved in {r["id"] for r in doc["recent_runs"]}

    relay_setting["STATUS_SOURCES"] = ["django_tasks_db"]
    assert {q["name"] for q in document()["queues"]} == {"relay-outbox", "default"}


def test_a_status_source_that_is_not_one_fails_the_checks(relay_setting):
    relay_setting["STATUS_SOURCES"] = ["django_q", "celery"]
    [error] = [e for e in check_settings() if e.id == "relay.E007"]
    assert "'celery'" in error.msg
    relay_setting["STATUS_SOURCES"] = "django_q"
    assert [e for e in check_settings() if e.id == "relay.E007"] == []
