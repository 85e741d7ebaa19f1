"""Schedules declared in settings with a row each: a switch that survives restarts and deploys,
missed slots fired only when the entry says ``catch_up`` (on a clock the test sets), plain
functions as schedule targets, and one broken entry that does not stop the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from django_tasks_db.models import DBTaskResult

from relay_client.django import schedules
from relay_client.django.local import CALL_PATH
from relay_client.django.records import LocalRun, ScheduleState
from relay_client.django.status import document

from .test_local_attempts import work

pytestmark = pytest.mark.django_db(transaction=True)

DAILY = {"name": "stripe-reconcile-daily", "cron": "30 4 * * *", "task": "shop.tasks.tally_orders"}
DAILY_CATCH_UP = {**DAILY, "name": "tally-daily-catch-up", "catch_up": True}
PLAIN = {"name": "count-a", "cron": "*/5 * * * *", "task": "shop.tasks.count_orders", "kwargs": {"prefix": "a"}}
AT = datetime(2026, 3, 2, 5, 30, tzinfo=UTC)  # an hour after the daily slot


@pytest.fixture
def declared(settings):
    settings.RELAY = {**settings.RELAY, "SCHEDULES": [DAILY, DAILY_CATCH_UP, PLAIN]}
    return settings


def names(fired: list[str]) -> list[str]:
    return sorted(f.split("@")[0] for f in fired)


def test_a_first_start_fires_no_missed_slot_unless_the_entry_says_catch_up(declared):
    # ASL's first relay_worker start fired daily jobs up to an hour old; now only the one that asks.
    fired = schedules.fire_due(AT)
    assert names(fired) == ["count-a", "tally-daily-catch-up"], fired
    assert "count-a@2026-03-02T05:30:00+00:00" in fired  # its slot is now: not a missed one
    assert schedules.fire_due(AT + timedelta(seconds=20)) == []
    # The next slots come on time and fire.
    assert names(schedules.fire_due(datetime(2026, 3, 3, 4, 30, 5, tzinfo=UTC))) == [
        "count-a",
        "stripe-reconcile-daily",
        "tally-daily-catch-up",
    ]
    # A worker down from 04:00 to 04:45: the 04:30 slot is missed; only catch_up fires it late.
    assert names(schedules.fire_due(datetime(2026, 3, 4, 4, 0, tzinfo=UTC))) == ["count-a"]
    assert names(schedules.fire_due(datetime(2026, 3, 4, 4, 45, tzinfo=UTC))) == ["count-a", "tally-daily-catch-up"]
    # A slot seen late fires within the grace (2 minutes, or the schedule's interval when shorter).
    assert names(schedules.fire_due(datetime(2026, 3, 4, 4, 51, 50, tzinfo=UTC))) == ["count-a"]  # 04:50
    assert schedules.fire_due(datetime(2026, 3, 4, 4, 58, tzinfo=UTC)) == []  # 04:55, 3 minutes late: passed over
    assert ScheduleState.objects.get(name="count-a").last_slot == datetime(2026, 3, 4, 4, 55, tzinfo=UTC)


def test_a_schedule_switched_off_stays_off_across_a_restart_and_a_deploy_and_fires_once_on(declared, settings):
    assert names(schedules.fire_due(AT)) == ["count-a", "tally-daily-catch-up"]
    schedules.switch("stripe-reconcile-daily", False, by="ops")
    day2 = datetime(2026, 3, 3, 4, 30, 5, tzinfo=UTC)
    assert "stripe-reconcile-daily" not in names(schedules.fire_due(day2))
    # A deploy: the settings reloaded, the entry saying enabled; a restarted worker syncs.
    settings.RELAY = {**settings.RELAY, "SCHEDULES": [{**DAILY, "enabled": True}, DAILY_CATCH_UP, PLAIN]}
    schedules.sync()
    assert ScheduleState.objects.get(name="stripe-reconcile-daily").enabled is False
    assert "stripe-reconcile-daily" not in names(schedules.fire_due(datetime(2026, 3, 4, 4, 30, 5, tzinfo=UTC)))
    doc = {s["name"]: s for s in document(datetime(2026, 3, 4, 4, 31, tzinfo=UTC))["schedules"]}
    assert doc["stripe-reconcile-daily"]["next_run_at"] is None and doc["count-a"]["next_run_at"]
    schedules.switch("stripe-reconcile-daily", True, by="ops")
    # Switched on after its slot: the slot it was off for does not fire late; the next one does.
    assert "stripe-reconcile-daily" not in names(schedules.fire_due(datetime(2026, 3, 4, 4, 40, tzinfo=UTC)))
    assert "stripe-reconcile-daily" in names(schedules.fire_due(datetime(2026, 3, 5, 4, 30, 5, tzinfo=UTC)))
    # An entry may start switched off; its row then starts off (and is the admin's from there).
    settings.RELAY = {**settings.RELAY, "SCHEDULES": [{**PLAIN, "name": "new-off", "enabled": False}]}
    assert schedules.fire_due(datetime(2026, 3, 5, 4, 35, tzinfo=UTC)) == []
    with pytest.raises(KeyError):
        schedules.switch("no-such-schedule", False)


def test_the_admin_switches_a_schedule_off_and_on(declared):
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/relay/schedulestate/")
    assert page.status_code == 200 and "stripe-reconcile-daily" in page.content.decode()  # listed before it fired
    row = ScheduleState.objects.get(name="stripe-reconcile-daily")
    res = client.post(
        "/admin/relay/schedulestate/", {"action": "switch_off", "_selected_action": [row.pk]}, follow=True
    )
    said = [str(m) for m in res.context["messages"]] if res.context else []
    assert "switched off: stripe-reconcile-daily" in said, (said, res.redirect_chain)
    row.refresh_from_db()
    assert (row.enabled, row.changed_by) == (False, "ops")
    client.post("/admin/relay/schedulestate/", {"action": "switch_on", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.enabled is True


def test_a_schedule_may_name_a_plain_function_shown_by_its_own_name(declared):
    from shop.models import Order

    Order.objects.create(email="a@example.com", total_cents=1)
    Order.objects.create(email="b@example.com", total_cents=1)
    [fired] = [f for f in schedules.fire_due(AT) if f.startswith("count-a")]
    [result] = DBTaskResult.objects.filter(task_path=CALL_PATH)
    assert LocalRun.objects.get(pk=str(result.id)).name == "shop.tasks.count_orders"
    work(2)  # the plain function's run and the catch-up's tally
    result.refresh_from_db()
    assert (result.status, result.return_value) == ("SUCCESSFUL", 1)
    doc = document()
    assert any(r["task_type"] == "shop.tasks.count_orders" for r in doc["recent_runs"]), doc["recent_runs"]
    assert all(r["task_type"] != CALL_PATH for r in doc["recent_runs"])
    assert {s["name"]: s for s in doc["schedules"]}["count-a"]["last_outcome"] == "succeeded"


def test_one_entry_that_cannot_fire_does_not_stop_the_others(settings, caplog):
    gone = {"name": "gone", "cron": "* * * * *", "task": "shop.tasks.tally_orders"}
    settings.RELAY = {**settings.RELAY, "SCHEDULES": [gone, PLAIN]}
    # The module is deleted after the deploy's check passed (a bad merge): the first entry fails.
    settings.RELAY["SCHEDULES"][0] = {**gone, "task": "shop.tasks.no_such_task"}
    assert names(schedules.fire_due(AT)) == ["count-a"]
    assert "schedule gone could not fire" in caplog.text


def test_the_check_accepts_a_plain_function_and_refuses_what_cannot_run(settings):
    assert schedules.problems(PLAIN) == []
    assert schedules.problems({**PLAIN, "task": "shop.tasks.no_such_task"})[0].startswith("task 'shop.tasks.no_such")
    assert schedules.problems({**PLAIN, "task": "shop.models.Order"}) == []  # a class is callable: it may run
    assert schedules.problems({**PLAIN, "task": "example.settings.DEBUG"}) == [
        "task 'example.settings.DEBUG' is neither a django.tasks task nor a function"
    ]
    assert schedules.problems({**PLAIN, "kwargs": {"at": datetime.now(UTC)}})[0].startswith("kwargs must be JSON")
    assert schedules.problems({**PLAIN, "catch_up": "yes"}) == [
        "catch_up must be True, False or a number of seconds, not 'yes'"
    ]
    settings.RELAY = {**settings.RELAY, "API_KEY": "rk_test", "SCHEDULES": [PLAIN, {**PLAIN, "kwargs": [1]}]}
    with pytest.raises(SystemCheckError, match=r"RELAY\['SCHEDULES'\]\[1\] kwargs must be a dict"):
        call_command("check")


def test_the_check_refuses_attempts_heartbeats_and_worker_kinds_that_cannot_work(settings):
    from relay_client.django.checks import check_settings

    settings.RELAY = {
        **settings.RELAY,
        "API_KEY": "rk_test",
        "TASK_ATTEMPTS": 0,
        "HEARTBEAT_SECONDS": 30,
        "WORKER_STALE_SECONDS": 60,
        "WORKERS": ["relay_worker", "db_worker"],
    }
    found = {(e.id, e.msg.split(" ")[0]) for e in check_settings()}
    assert found == {
        ("relay.E008", "RELAY['TASK_ATTEMPTS']"),
        ("relay.E008", "RELAY['WORKER_STALE_SECONDS']"),
        ("relay.E009", "RELAY['WORKERS']"),
    }, found
    settings.RELAY = {**settings.RELAY, "TASK_ATTEMPTS": 3, "HEARTBEAT_SECONDS": 10, "WORKERS": ["relay_worker"]}
    assert check_settings() == []
