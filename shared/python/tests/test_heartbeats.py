"""Workers that say they are alive: relay_worker's heartbeat in the status document, the deploy
gate's exit code with and without a worker, and a stopped worker forgotten."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from relay_client.django import heartbeats
from relay_client.django.records import WorkerHeartbeat
from relay_client.django.status import document

from .conftest import EXAMPLE, child_env, run_manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def env(db: str) -> dict:
    return {**child_env(db), "RELAY_API_KEY": "rk_test", "RELAY_HEARTBEAT_SECONDS": "0.5"}


def gate(db: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = run_manage("relay_await_workers", "--every", "0.2", *args, db_name=db, check=False, env_overrides=env(db))
    return out, time.monotonic() - started


def test_the_gate_fails_within_its_bound_with_no_worker_and_passes_with_one():
    db = connection.settings_dict["NAME"]
    out, took = gate(db, "--timeout", "3", "--kinds", "relay_worker")
    assert out.returncode != 0 and "no live relay_worker after 3 s" in out.stderr, out
    assert 3 <= took < 30, took  # its bound, plus a Django start on a loaded machine
    begun = timezone.now()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "relay_worker", "--drain-every", "60", "--reconcile-every", "600"],
        cwd=EXAMPLE,
        env=env(db),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = gate(db, "--timeout", "60", "--kinds", "relay_worker", "--started-after", begun.isoformat())
        assert out.returncode == 0 and "live: relay_worker" in out.stdout, out
        # The declared kinds (the example declares relay_tasks_worker too): one missing fails.
        out, _ = gate(db, "--timeout", "1")
        assert out.returncode != 0 and "no live relay_tasks_worker" in out.stderr, out
        [w] = [w for w in document()["workers"] if w["kind"] == "relay_worker"]
        assert w["pid"] == worker.pid and w["started_at"] is not None
        seen = wait_for("a second beat", lambda: WorkerHeartbeat.objects.get(pid=worker.pid).last_seen_at > begun)
        assert seen
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0
    # Stopped cleanly: it says so, and leaves the document at once; the gate no longer passes.
    assert WorkerHeartbeat.objects.get(pid=worker.pid).stopped_at is not None
    assert not [w for w in document()["workers"] if w["kind"] == "relay_worker"]
    out, _ = gate(db, "--timeout", "1", "--kinds", "relay_worker")
    assert out.returncode != 0


def test_a_silent_worker_is_dead_then_forgotten_after_the_stated_time():
    now = timezone.now()
    for name, silent in (
        ("fresh", timedelta(seconds=5)),
        ("silent", timedelta(minutes=5)),
        ("gone", timedelta(hours=1)),
    ):
        WorkerHeartbeat.objects.create(
            kind="relay_tasks_worker", instance_id=name, started_at=now - silent, last_seen_at=now - silent
        )
    assert heartbeats.fresh(["relay_tasks_worker"], now) == {"relay_tasks_worker"}
    shown = {w["instance_id"]: w for w in document(now)["workers"]}
    # "silent" is listed (the console shows it dead: last seen over 90 s ago); "gone" is forgotten.
    assert {"fresh", "silent"} <= set(shown) and "gone" not in shown
    assert heartbeats.FORGET_AFTER == timedelta(minutes=15)
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/relay/workerheartbeat/")
    assert page.status_code == 200 and all(n in page.content.decode() for n in ("fresh", "silent", "gone"))
    WorkerHeartbeat.objects.filter(instance_id="fresh").update(last_seen_at=now - timedelta(minutes=2))
    assert heartbeats.fresh(["relay_tasks_worker"], now) == set()


def test_a_worker_recovers_others_only_after_its_own_beats_went_unbroken_for_the_stale_bound(settings, monkeypatch):
    """After its start or a database outage every worker's beat is old: none may be taken for dead
    until each has had the stale bound to beat again."""
    settings.RELAY = {**settings.RELAY, "HEARTBEAT_SECONDS": 0.05, "WORKER_STALE_SECONDS": 0.5}
    failures: list[float] = []
    upkeep: list[float] = []
    real = heartbeats.beat

    def beat(*args):
        if upkeep and len(failures) < 3:  # once upkeep has run: the database away for three beats
            failures.append(time.monotonic())
            raise ConnectionError("database restarting")
        real(*args)

    monkeypatch.setattr(heartbeats, "beat", beat)
    hb = heartbeats.Heartbeat("relay_tasks_worker", "steady", also=lambda: upkeep.append(time.monotonic()))
    started = time.monotonic()
    hb.start()
    try:
        wait_for(
            "upkeep after the outage",
            lambda: len(failures) == 3 and any(t > failures[-1] for t in upkeep),
            timeout=30,
            every=0.05,
        )
    finally:
        hb.stop()
    assert len(failures) == 3
    before, after = [t for t in upkeep if t < failures[0]], [t for t in upkeep if t > failures[-1]]
    assert before and after, upkeep
    assert before[0] - started >= 0.5, "no upkeep before the stale bound after the start"
    assert after[0] - failures[-1] >= 0.5, "none before the stale bound after the outage"
    assert not [t for t in upkeep if failures[0] <= t <= failures[-1]]
    assert WorkerHeartbeat.objects.get(instance_id="steady").stopped_at is not None
