"""Local tasks with attempts and backoff on django-tasks-db (``LocalBackend``, ``relay_tasks_worker``):
a task that fails twice succeeds on its third attempt after its backoff; one that always fails
ends FAILED with its error and attempts, and says so in the status document and the signal; a
worker killed mid-task leaves its task to be recovered and run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django_tasks_db.models import DBTaskResult

from relay_client.django.local import Policy, local_task_failed
from relay_client.django.records import LocalRun, WorkerHeartbeat
from relay_client.django.status import document
from relay_client.django.tasks_worker import TasksWorker
from shop.tasks import count_orders, flaky, slow_first

from .conftest import EXAMPLE, child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def work(max_tasks: int, *, within: float = 60.0) -> TasksWorker:
    """Run a worker in this process until it ran ``max_tasks`` tasks (stopped after ``within`` s)."""
    w = TasksWorker(
        queue_names=["default"],
        interval=0.05,
        batch=False,
        backend_name="default",
        startup_delay=False,
        max_tasks=max_tasks,
        worker_id="test-worker",
        excluded_queue_names=[],
    )
    guard = threading.Timer(within, lambda: setattr(w, "running", False))
    guard.start()
    try:
        w.run()
    finally:
        guard.cancel()
    return w


def test_the_backoff_doubles_and_the_last_attempt_is_the_last():
    now = datetime(2026, 1, 1)
    p = Policy(max_attempts=4, backoff=60)
    assert [p.retry_at(now, n) for n in (1, 2, 3, 4)] == [
        now + timedelta(seconds=60),
        now + timedelta(seconds=120),
        now + timedelta(seconds=240),
        None,
    ]
    assert Policy(1, 60).retry_at(now, 1) is None
    assert Policy(30, 3600).retry_at(now, 20) == now + timedelta(hours=6)  # capped


def test_a_local_task_declared_on_another_backend_is_a_local_task_all_the_same():
    """A project's tests may put ``default`` on Django's DummyBackend: the decorator still works."""
    from django.test import override_settings

    from relay_client.django._compat import DummyBackend
    from relay_client.django.local import LocalTask, local_task

    dummy = {"default": {"BACKEND": f"{DummyBackend.__module__}.{DummyBackend.__qualname__}"}}
    with override_settings(TASKS=dummy):
        nightly = local_task(max_attempts=2, backoff=5)(count_orders)
        assert isinstance(nightly, LocalTask) and (nightly.max_attempts, nightly.backoff) == (2, 5)
        assert isinstance(nightly.get_backend(), DummyBackend)
        assert nightly.using(max_attempts=4, priority=3).max_attempts == 4


def test_a_task_that_fails_twice_succeeds_on_its_third_attempt_after_its_backoff():
    result = flaky.enqueue(failures=2)
    run = LocalRun.objects.get(pk=result.id)
    assert (run.name, run.max_attempts, run.backoff_seconds) == ("shop.tasks.flaky", 3, 1.0)
    work(3)
    row = DBTaskResult.objects.get(id=result.id)
    assert row.status == "SUCCESSFUL", (row.status, row.traceback)
    assert row.return_value == {"attempt": 3} and len(row.worker_ids) == 3
    errors = LocalRun.objects.get(pk=result.id).errors
    assert [e["attempt"] for e in errors] == [1, 2]
    assert errors[0]["error"] == "RuntimeError: attempt 1 of flaky fails"
    waits = [
        (datetime.fromisoformat(e["retry_at"]) - datetime.fromisoformat(e["failed_at"])).total_seconds() for e in errors
    ]
    assert waits == [1.0, 2.0], waits
    # Each retry started no sooner than its backoff allowed.
    assert datetime.fromisoformat(errors[1]["started_at"]) >= datetime.fromisoformat(errors[0]["retry_at"])
    assert row.started_at and row.started_at >= datetime.fromisoformat(errors[1]["retry_at"])
    assert flaky.get_result(result.id).status == "SUCCESSFUL"


def test_a_task_that_always_fails_fails_for_good_after_its_attempts_with_its_cause():
    told = []

    def receiver(sender, run, result_id, **kwargs):
        told.append((result_id, run.last_error))

    local_task_failed.connect(receiver)
    try:
        result = flaky.using(max_attempts=2, backoff=0).enqueue(failures=10)
        work(2)
    finally:
        local_task_failed.disconnect(receiver)
    row = DBTaskResult.objects.get(id=result.id)
    assert row.status == "FAILED" and len(row.worker_ids) == 2
    assert row.exception_class_path == "builtins.RuntimeError"
    run = LocalRun.objects.get(pk=result.id)
    assert run.failed_at is not None and run.last_error == "RuntimeError: attempt 2 of flaky fails"
    assert told == [(str(result.id), "RuntimeError: attempt 2 of flaky fails")]
    doc = document()
    [shown] = [r for r in doc["recent_runs"] if r["id"] == str(result.id)]
    assert (shown["task_type"], shown["status"], shown["attempt"], shown["max_attempts"]) == (
        "shop.tasks.flaky",
        "failed",
        2,
        2,
    )
    assert shown["last_error"] == "RuntimeError: attempt 2 of flaky fails"
    assert doc["failures"]["last_hour"] >= 1
    [exc] = [e for e in doc["exceptions"] if e["job_id"] == str(result.id)]
    assert (exc["kind"], exc["cause"]) == ("attempts_exhausted", "RuntimeError: attempt 2 of flaky fails")


def test_a_task_whose_worker_is_killed_mid_run_is_recovered_and_run_again():
    db = connection.settings_dict["NAME"]
    env = {
        **child_env(db),
        "RELAY_API_KEY": "rk_test",
        "RELAY_HEARTBEAT_SECONDS": "0.5",
        "RELAY_WORKER_STALE_SECONDS": "2",
    }
    result = slow_first.enqueue(seconds=120)

    def worker(*extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "manage.py", "relay_tasks_worker", "--no-startup-delay", "--interval", "0.1", *extra],
            cwd=EXAMPLE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = worker("--worker-id", "doomed")
    try:
        wait_for(
            "the first attempt to run",
            lambda: DBTaskResult.objects.get(id=result.id).status == "RUNNING" or first.poll() is not None,
        )
        assert first.poll() is None, first.communicate()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert WorkerHeartbeat.objects.get(instance_id="doomed").stopped_at is None  # it had no chance to say
    killed_at = datetime.now().astimezone()
    second = worker("--worker-id", "rescuer", "--max-tasks", "1")
    try:
        out, err = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, err
    row = DBTaskResult.objects.get(id=result.id)
    assert row.status == "SUCCESSFUL" and row.return_value == {"attempt": 2}, (row.status, row.traceback)
    assert row.worker_ids == ["doomed", "rescuer"]
    run = LocalRun.objects.get(pk=result.id)
    assert run.recovered == 1 and run.errors[0]["error"].startswith("WorkerLost: worker doomed stopped being seen")
    # Recovered within the stated bound: the rescuer's start, then stale after 2 s, looked at every 0.5 s
    # once its own beats went unbroken for 2 s (room left for a slow start on a loaded machine).
    recovered_at = datetime.fromisoformat(run.errors[0]["failed_at"])
    assert recovered_at - killed_at < timedelta(seconds=30), (killed_at, recovered_at)
    print(f"recovered {(recovered_at - killed_at).total_seconds():.1f} s after kill -9 (stale 2 s, beats 0.5 s)")
    assert WorkerHeartbeat.objects.get(instance_id="rescuer").stopped_at is not None
