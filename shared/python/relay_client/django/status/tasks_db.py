"""The django-tasks-db source: local ``django.tasks`` work on the database backend.

That backend keeps no worker heartbeat, so a worker is "seen" when it claimed a task in the
last 24 hours.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min

from . import shape

TRANSPORT = "django-tasks-db"


def collect(now: datetime) -> shape.Part:
    from django_tasks_db.models import DBTaskResult

    results = DBTaskResult.objects.all()
    failed = results.filter(status="FAILED")
    return shape.Part(
        workers=_workers(results, now),
        queues=_queues(results, now),
        runs=[_run(r, now) for r in results.order_by("-enqueued_at")[: shape.RECENT_RUNS]],
        failed_last_hour=failed.filter(finished_at__gte=now - timedelta(hours=1)).count(),
        failed_last_24h=failed.filter(finished_at__gte=now - timedelta(hours=24)).count(),
    )


def _workers(results: Any, now: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    seen: dict[str, datetime] = {}
    recent = results.filter(started_at__gte=now - timedelta(hours=24)).values_list(
        "worker_ids", "started_at", "finished_at"
    )
    for worker_ids, started, finished in recent[:5000]:
        at = max(t for t in (started, finished) if t)
        for w in worker_ids or []:
            if w not in seen or seen[w] < at:
                seen[w] = at
    return [shape.worker("db_worker", w, at) for w, at in seen.items()]


def _queues(results: Any, now: datetime) -> list[dict[str, Any]]:
    from django_tasks_db.models import get_date_max

    out = []
    never = get_date_max()
    names = results.filter(status__in=["READY", "RUNNING"]).values_list("backend_name", "queue_name").distinct()
    for backend, queue in sorted(set(names)):
        q = results.filter(backend_name=backend, queue_name=queue)
        due = q.filter(status="READY").exclude(run_after__gt=now, run_after__lt=never)
        out.append(
            shape.queue(
                queue if backend == "default" else f"{backend}/{queue}",
                TRANSPORT,
                now,
                depth=due.count(),
                oldest_due=due.aggregate(at=Min("enqueued_at"))["at"],
                scheduled=q.filter(status="READY", run_after__gt=now, run_after__lt=never).count(),
                running=q.filter(status="RUNNING").count(),
            )
        )
    return out


def _run(r: Any, now: datetime) -> tuple[datetime, dict[str, Any]]:
    return shape.run(
        str(r.id),
        r.task_path,
        shape.OUTCOMES.get(r.status, r.status.lower()),
        now,
        created_at=r.enqueued_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        attempt=len(r.worker_ids or []),
        last_error=r.exception_class_path,
    )
