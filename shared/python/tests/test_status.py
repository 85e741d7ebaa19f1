"""The status collector for local django.tasks work: it validates against Relay's status
contract, and the real console shows the project next to Relay (headless Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import jsonschema
import pytest
from django.db import connection, transaction

from relay_client.django import schedules
from relay_client.django.models import RelayJob
from relay_client.django.status import document
from shop.tasks import broken, noop, tally_orders

from .conftest import HERE, Relay, free_port, run_manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = json.loads((HERE.parents[1] / "schemas" / "status-v1.json").read_text())
STATUS_KEY = "local-status-key"


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(doc)


def local_work(relay_settings: dict) -> None:
    """Two runs on the local backend (one fails), one deferred, and one outbox row left unsent."""
    tally_orders.enqueue()
    broken.enqueue()
    tally_orders.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue()
    out = run_manage(
        "db_worker",
        "--batch",
        "--no-startup-delay",
        "--worker-id",
        "shop-worker-1",
        db_name=connection.settings_dict["NAME"],
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    url = relay_settings["URL"]
    relay_settings["URL"] = "http://127.0.0.1:1"  # Relay unreachable: the row stays in the outbox
    try:
        with transaction.atomic():
            noop.enqueue()
    finally:
        relay_settings["URL"] = url
    assert RelayJob.objects.filter(posted_at__isnull=True).count() == 1


def test_the_local_status_document_validates_and_reports_the_local_work(relay_settings, live_server):
    local_work(relay_settings)
    url = f"{live_server.url}/relay/status"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
    res = httpx.get(url, headers={"authorization": f"Bearer {STATUS_KEY}"})
    assert res.status_code == 200, res.text
    doc = res.json()
    validate(doc)
    assert (doc["contract"], doc["project"]) == ("relay.status/v1", "shop")
    runs = {(r["task_type"], r["status"]) for r in doc["recent_runs"]}
    assert {
        ("shop.tasks.tally_orders", "succeeded"),
        ("shop.tasks.broken", "failed"),
        ("shop.tasks.tally_orders", "pending"),
    } <= runs, runs
    assert doc["failures"]["last_hour"] == 1 and doc["failures"]["last_24h"] == 1
    [failed] = [r for r in doc["recent_runs"] if r["status"] == "failed"]
    assert (failed["last_error"], failed["attempt"], failed["max_attempts"]) == (
        "ValueError: this local task always fails",
        1,
        1,
    )
    # Failed for good: an open exception with its cause, as Relay's own document lists them.
    [exc] = doc["exceptions"]
    assert (exc["task_type"], exc["kind"], exc["cause"]) == (
        "shop.tasks.broken",
        "attempts_exhausted",
        "ValueError: this local task always fails",
    )
    assert doc["failures"]["open_exceptions"] == 1
    # The chart's series: the last hour in 5-minute buckets, both finished runs in the newest.
    activity = doc["activity"]
    assert (activity["bucket_s"], len(activity["runs"]), len(activity["failures"])) == (300, 12, 12)
    assert (sum(activity["runs"]), sum(activity["failures"])) == (2, 1) and activity["runs"][-1] >= 1, activity
    assert [w["instance_id"] for w in doc["workers"]] == ["shop-worker-1"]
    queues = {q["name"]: q for q in doc["queues"]}
    assert queues["relay-outbox"]["depth"] == 1 and queues["relay-outbox"]["oldest_pending_age_s"] >= 0
    assert (queues["default"]["depth"], queues["default"]["scheduled"]) == (0, 1)
    declared = {s["name"]: s for s in doc["schedules"]}
    assert set(declared) == {"nightly-tally", "minutely-tally"}
    # Runs of their task that other code enqueued are neither schedule's: neither has fired.
    assert {(s["last_run_at"], s["last_outcome"]) for s in declared.values()} == {(None, None)}, declared
    assert declared["nightly-tally"]["next_run_at"].endswith("02:00:00Z")
    # A document that breaks the contract is caught by the same check.
    with pytest.raises(jsonschema.ValidationError):
        validate({**doc, "failures": {"last_hour": -1}})


def test_a_schedule_reports_the_run_its_own_latest_slot_enqueued(relay_settings):
    tally_orders.enqueue()  # the schedules' task, enqueued by other code
    noon = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    fired = schedules.fire_due(noon)  # nightly-tally's 02:00 slot is past the catch-up hour
    assert [f.split("@")[0] for f in fired] == ["minutely-tally"], fired
    out = run_manage("db_worker", "--batch", "--no-startup-delay", db_name=connection.settings_dict["NAME"], timeout=60)
    assert out.returncode == 0, out.stderr
    doc = document()
    validate(doc)
    declared = {s["name"]: s for s in doc["schedules"]}
    assert (declared["nightly-tally"]["last_run_at"], declared["nightly-tally"]["last_outcome"]) == (None, None)
    assert declared["minutely-tally"]["last_outcome"] == "succeeded", declared
    assert declared["minutely-tally"]["last_run_at"] is not None


def chromium() -> str | None:
    for c in (os.environ.get("RELAY_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if c and Path(c).exists():
            return c
    return shutil.which("chromium")


def test_the_console_shows_the_local_project_next_to_relay(relay: Relay, relay_settings, live_server, tmp_path):
    local_work(relay_settings)
    projects = tmp_path / "projects.json"
    projects.write_text(
        json.dumps(
            {
                "projects": [
                    {"name": "relay", "status_url": f"{relay.url}/v1/status", "token": relay.status_key},
                    {"name": "shop", "status_url": f"{live_server.url}/relay/status", "token": STATUS_KEY},
                ],
                "timeout_seconds": 5,
            }
        )
    )
    port = free_port()
    log = (tmp_path / "console.log").open("w")
    console = subprocess.Popen(
        [relay.bin, "console", "--addr", f"127.0.0.1:{port}", "--projects", str(projects)], stdout=log, stderr=log
    )
    site = f"http://127.0.0.1:{port}/"
    try:
        html = wait_for("the console page", lambda: _page(site), timeout=30)
        assert 'data-project="relay" data-state="ok"' in html, html
        assert 'data-project="shop" data-state="ok"' in html, html
        assert "relay-outbox" in html and "shop.tasks.broken" in html, "the local project's queues and runs"
        assert "this project reports no activity series" not in html, "both projects chart their runs"
        assert "2 runs (blue), 1 failed (red)" in html, html
        assert '<td class="cause">ValueError: this local task always fails</td>' in html, "the failure's cause"
        browser = chromium()
        if browser is None:
            pytest.skip(
                "chromium is not installed (apt-get install -y chromium, or set RELAY_CHROMIUM): "
                "the console's HTML was checked without a browser"
            )
        profile = tmp_path / "chromium"
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
        ]
        out = subprocess.run([browser, *flags, "--dump-dom", site], capture_output=True, text=True, timeout=90)
        dom = out.stdout
        assert out.returncode == 0 and "Relay console" in dom, out.stderr + dom
        assert 'data-project="shop" data-state="ok"' in dom, dom
        assert 'data-project="relay" data-state="ok"' in dom, dom
        assert "shop.tasks.broken" in dom
    finally:
        console.terminate()
        console.wait(10)
        log.close()


def _page(url: str) -> str | None:
    try:
        res = httpx.get(url, timeout=10)
    except httpx.HTTPError:
        return None
    return res.text if res.status_code == 200 else None
