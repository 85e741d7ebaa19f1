"""The django-tasks-db source: local ``django.tasks`` work on the database backend.

- Runs carry the name a person reads (a schedule's plain function, not the package's wrapper),
  their attempt and ``max_attempts``, and the error of their latest failed attempt (a failed
  run that was run again names its re-run there); a failed attempt waiting for its retry is
  ``pending`` with its ``run_at``.
- A task failed for good in the last 24 hours and not run again is an open exception, with
  its error as the cause.
- Workers: ``relay_tasks_worker`` beats (``heartbeats``, reported by the collector itself);
  a plain ``db_worker`` keeps no heartbeat, so one is "seen" when it claimed a task in the last
  ``FORGET_AFTER`` (15 minutes).
- The activity series: results finished in the last hour, per 5 minutes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min

from ..heartbeats import FORGET_AFTER
from ..records import LocalRun, WorkerHeartbeat
from . import shape

TRANSPORT = "django-tasks-db"


def collect(now: datetime) -> shape.Part:
    from django_tasks_db.models import DBTaskResult

    results = DBTaskResult.objects.all()
    failed = results.filter(status="FAILED")
    recent = list(results.defer("return_value", "traceback").order_by("-enqueued_at")[: shape.RECENT_RUNS])
    runs = {r.result_id: r for r in LocalRun.objects.filter(result_id__in=[str(r.id) for r in recent])}
    causes = _causes(results, [r.id for r in recent if r.status == "FAILED" and not _known(runs.get(str(r.id)))])
    open_exceptions, exceptions = _exceptions(failed, now)
    return shape.Part(
        workers=_workers(results, now),
        queues=_queues(results, now),
        runs=[_run(r, runs.get(str(r.id)), causes.get(str(r.id), ""), now) for r in recent],
        failed_last_hour=failed.filter(finished_at__gte=now - timedelta(hours=1)).count(),
        failed_last_24h=failed.filter(finished_at__gte=now - timedelta(hours=24)).count(),
        open_exceptions=open_exceptions,
        exceptions=exceptions,
        activity=_activity(results, now),
    )


def _workers(results: Any, now: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    """``db_worker`` processes by the tasks they claimed (those that beat are reported apart)."""
    seen: dict[str, datetime] = {}
    recent = results.filter(started_at__gte=now - FORGET_AFTER).values_list("worker_ids", "started_at", "finished_at")
    for worker_ids, started, finished in recent[:5000]:
        at = max(t for t in (started, finished) if t)
        for w in worker_ids or []:
            if w not in seen or seen[w] < at:
                seen[w] = at
    beating = set(WorkerHeartbeat.objects.filter(instance_id__in=list(seen)).values_list("instance_id", flat=True))
    return [shape.worker("db_worker", w, at) for w, at in seen.items() if w not in beating]


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


def last_line(traceback: str) -> str:
    """A traceback's last line: ``ValueError: the message``."""
    lines = [line for line in (traceback or "").strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _known(run: LocalRun | None) -> bool:
    return run is not None and bool(run.last_error)


def _causes(results: Any, ids: list[Any]) -> dict[str, str]:
    """The last line of each result's traceback (read for the failures no ``LocalRun`` explains)."""
    if not ids:
        return {}
    return {str(i): last_line(t) for i, t in results.filter(id__in=ids).values_list("id", "traceback")}


def _run(r: Any, run: LocalRun | None, cause: str, now: datetime) -> tuple[datetime, dict[str, Any]]:
    from django_tasks_db.models import get_date_max

    from ..local import display_name

    error = (run.last_error if run else "") or (cause if r.status == "FAILED" else "")
    if run is not None and run.rerun_as:  # the console shows the error: it names the re-run
        error = f"{error} (run again as {run.rerun_as})".strip()
    deferred = r.status == "READY" and r.run_after and r.run_after != get_date_max() and r.run_after > now
    return shape.run(
        str(r.id),
        run.name if run else display_name(r.task_path, r.args_kwargs),
        shape.OUTCOMES.get(r.status, r.status.lower()),
        now,
        created_at=r.enqueued_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        run_at=r.run_after if deferred else None,
        attempt=len(r.worker_ids or []),
        max_attempts=run.max_attempts if run else None,
        last_error=error or (r.exception_class_path if r.status == "FAILED" else None),
    )


def _exceptions(failed: Any, now: datetime) -> tuple[int, list[tuple[datetime, dict[str, Any]]]]:
    """How many tasks failed for good in the last 24 hours and nobody ran again, and the newest
    ``shape.EXCEPTIONS`` of them (their causes read for those alone)."""
    from ..local import display_name

    rows = list(
        failed.filter(finished_at__gte=now - timedelta(hours=24))
        .order_by("-finished_at")
        .only("id", "task_path", "args_kwargs", "finished_at", "exception_class_path")[:500]
    )
    runs = {r.result_id: r for r in LocalRun.objects.filter(result_id__in=[str(r.id) for r in rows])}
    open_ = [r for r in rows if not (runs.get(str(r.id)) and runs[str(r.id)].rerun_as)]
    shown = open_[: shape.EXCEPTIONS]
    causes = _causes(failed, [r.id for r in shown if not _known(runs.get(str(r.id)))])
    out = []
    for r in shown:
        run = runs.get(str(r.id))
        name = run.name if run else display_name(r.task_path, r.args_kwargs)
        cause = (run.last_error if run else "") or causes.get(str(r.id)) or r.exception_class_path or "failed"
        out.append(shape.exception(f"local:{r.id}", str(r.id), name, "attempts_exhausted", cause, r.finished_at))
    return len(open_), out


def _activity(results: Any, now: datetime) -> shape.Activity:
    since = now - timedelta(seconds=shape.ACTIVITY_BUCKETS * shape.ACTIVITY_BUCKET_S)
    finished = list(
        results.filter(finished_at__gte=since, status__in=["SUCCESSFUL", "FAILED"])
        .order_by("-finished_at")
        .values_list("finished_at", "status")[: shape.ACTIVITY_CAP]
    )
    return shape.activity(
        now, [(at, status == "FAILED") for at, status in finished], truncated=len(finished) >= shape.ACTIVITY_CAP
    )
