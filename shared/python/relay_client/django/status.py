"""The status collector: ``relay.status/v1`` for the project's local ``django.tasks`` work.

It reads django-tasks-db's results table (the database backend for Django 6's tasks). That
backend keeps no worker heartbeat, so a worker is "seen" when it claimed a task in the last 24
hours. The outbox appears as a queue of its own (``relay-outbox``): rows a crash left behind
show as depth and age there until a drain posts them. Rows Relay refused count as failures, and
rows stuck until the tenant acts (401/403/409) as open exceptions.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone

from . import conf
from .models import RelayJob

CONTRACT = "relay.status/v1"
VERSION = "1.0"
RECENT_RUNS = 50
_STATUS = {"READY": "pending", "RUNNING": "running", "SUCCESSFUL": "succeeded", "FAILED": "failed"}


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


def document(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    doc: dict[str, Any] = {
        "contract": CONTRACT,
        "version": VERSION,
        "project": str(conf.get("PROJECT") or "django"),
        "generated_at": _iso(now),
        "workers": [],
        "queues": [_outbox_queue(now)],
        "schedules": [],
        "recent_runs": [],
        "failures": _outbox_failures(now),
    }
    try:
        from django_tasks_db.models import DBTaskResult
    except ImportError:  # no local database backend: only the outbox to report
        return doc
    results = DBTaskResult.objects.all()
    doc["workers"] = _workers(results, now)
    doc["queues"] += _queues(results, now)
    doc["schedules"] = _schedules(results)
    doc["recent_runs"] = [_run(r, now) for r in results.order_by("-enqueued_at")[:RECENT_RUNS]]
    failed = results.filter(status="FAILED")
    doc["failures"]["last_hour"] += failed.filter(finished_at__gte=now - timedelta(hours=1)).count()
    doc["failures"]["last_24h"] += failed.filter(finished_at__gte=now - timedelta(hours=24)).count()
    return doc


def _outbox_failures(now: datetime) -> dict[str, int]:
    from .outbox import stuck

    refused = RelayJob.objects.using(conf.database()).filter(status="refused")
    return {
        "last_hour": refused.filter(posted_at__gte=now - timedelta(hours=1)).count(),
        "last_24h": refused.filter(posted_at__gte=now - timedelta(hours=24)).count(),
        "open_exceptions": stuck().count(),
    }


def _outbox_queue(now: datetime) -> dict[str, Any]:
    unsent = RelayJob.objects.using(conf.database()).filter(posted_at__isnull=True)
    agg = unsent.aggregate(n=Count("id"), oldest=Min("created_at"))
    age = (now - agg["oldest"]).total_seconds() if agg["oldest"] else 0.0
    return {"name": "relay-outbox", "transport": "outbox", "depth": agg["n"], "oldest_pending_age_s": max(age, 0.0)}


def _workers(results: Any, now: datetime) -> list[dict[str, Any]]:
    seen: dict[str, datetime] = {}
    recent = results.filter(started_at__gte=now - timedelta(hours=24)).values_list(
        "worker_ids", "started_at", "finished_at"
    )
    for worker_ids, started, finished in recent[:5000]:
        at = max(t for t in (started, finished) if t)
        for w in worker_ids or []:
            if w not in seen or seen[w] < at:
                seen[w] = at
    ordered = sorted(seen.items(), key=lambda kv: kv[1], reverse=True)
    return [{"kind": "db_worker", "instance_id": w, "last_seen_at": _iso(at)} for w, at in ordered]


def _queues(results: Any, now: datetime) -> list[dict[str, Any]]:
    from django_tasks_db.models import get_date_max

    out = []
    never = get_date_max()
    names = results.filter(status__in=["READY", "RUNNING"]).values_list("backend_name", "queue_name").distinct()
    for backend, queue in sorted(set(names)):
        q = results.filter(backend_name=backend, queue_name=queue)
        due = q.filter(status="READY").exclude(run_after__gt=now, run_after__lt=never)
        oldest = due.aggregate(at=Min("enqueued_at"))["at"]
        out.append(
            {
                "name": queue if backend == "default" else f"{backend}/{queue}",
                "transport": "django-tasks-db",
                "depth": due.count(),
                "oldest_pending_age_s": max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
                "scheduled": q.filter(status="READY", run_after__gt=now, run_after__lt=never).count(),
                "running": q.filter(status="RUNNING").count(),
            }
        )
    return out


def _schedules(results: Any) -> list[dict[str, Any]]:
    from . import schedules

    out = []
    now = timezone.now()
    for s in schedules.declared():
        last = results.filter(task_path=s.task).order_by("-enqueued_at").first()
        out.append(
            {
                "name": s.name,
                "cron": s.cron,
                "last_run_at": _iso(last.started_at or last.enqueued_at) if last else None,
                "last_outcome": _STATUS.get(last.status, last.status) if last else None,
                "next_run_at": _iso(s.next(now)),
            }
        )
    return out


def _run(r: Any, now: datetime) -> dict[str, Any]:
    status = _STATUS.get(r.status, r.status.lower())
    run = {
        "id": str(r.id),
        "task_type": r.task_path,
        "status": status,
        "tenant": None,
        "attempt": len(r.worker_ids or []),
        "started_at": _iso(r.started_at),
        "created_at": _iso(r.enqueued_at),
        "updated_at": _iso(r.finished_at or r.started_at or r.enqueued_at),
        "finished_at": _iso(r.finished_at),
        "last_error": r.exception_class_path or None,
        "progress": None,
    }
    if status == "running" and r.started_at:
        run["progress"] = {"kind": "elapsed", "elapsed_s": max((now - r.started_at).total_seconds(), 0.0)}
    return run
