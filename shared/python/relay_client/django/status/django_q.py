"""The django-q2 source: work a project still runs on django-q2, read from its tables.

- Workers: the clusters' heartbeats (``django_q.status.Stat``), which django-q2 keeps in the
  cache named by ``Q_CLUSTER["cache"]`` for 3 seconds. The web process sees them only when that
  cache is shared between processes (the database cache, Redis); with the default per-process
  local-memory cache no worker shows.
- Queues: one per cluster name (``OrmQ.key``) on the ORM broker (``Q_CLUSTER["orm"]``). A row
  whose claim (``lock``) lies ahead is ``running`` (a cluster holds it), or ``scheduled`` when
  it is a failed attempt's waiting for its retry; the others are due, and their age counts from
  the enqueue time in their signed package. ``Schedule.ONCE`` rows are deferred work:
  ``scheduled`` until their time, then due (counted in depth and age) until a cluster's
  scheduler turns them into a queued task. Other brokers keep their queue elsewhere: then only
  the schedules' deferred rows show.
- Schedules: the recurring ``Schedule`` rows, with their next run (none once ``repeats`` is 0)
  and the outcome of the task they last fired.
- Runs and failures: ``Task`` rows (``Success``/``Failure``) and the queued rows; the activity
  series from the ``Task`` rows stopped in the last hour. django-q2
  stamps ``Task.started`` at enqueue, so it is the run's ``created_at``; it keeps no start time.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min, Q

from . import shape

TRANSPORT = "django-q2"
#: How many of the oldest due rows are decoded for their enqueue time, and of the newest for runs.
DECODED = 50
#: How many claimed rows are decoded to tell a retry's wait from a run.
CLAIMED = 500
log = logging.getLogger("relay_client")


def collect(now: datetime) -> shape.Part:
    from django_q.models import Failure

    queued = _queued(now)
    runs = {r["id"]: r for r in _finished()}
    for r in queued:  # still queued (a failed attempt waiting for its retry): the queue's state wins
        finished = runs.get(r["id"])
        if finished:
            r.update(attempt=finished["attempt"], last_error=finished["last_error"])
        runs[r["id"]] = r
    failed = Failure.objects.all()
    return shape.Part(
        workers=_workers(),
        queues=_queues(now),
        schedules=_schedules(now),
        runs=[shape.run(now=now, **r) for r in runs.values()],
        failed_last_hour=failed.filter(stopped__gte=now - timedelta(hours=1)).count(),
        failed_last_24h=failed.filter(stopped__gte=now - timedelta(hours=24)).count(),
        activity=_activity(now),
    )


def _activity(now: datetime) -> shape.Activity:
    """``Task`` rows stopped in the chart's hour, per 5 minutes (failures: those not successful)."""
    from django_q.models import Task

    since = now - timedelta(seconds=shape.ACTIVITY_BUCKETS * shape.ACTIVITY_BUCKET_S)
    finished = list(
        Task.objects.filter(stopped__gte=since)
        .order_by("-stopped")
        .values_list("stopped", "success")[: shape.ACTIVITY_CAP]
    )
    return shape.activity(now, [(at, not ok) for at, ok in finished], truncated=len(finished) >= shape.ACTIVITY_CAP)


def _conf() -> Any:
    from django_q.conf import Conf

    return Conf


def _workers() -> list[tuple[datetime, dict[str, Any]]]:
    from django_q.status import Stat

    try:
        stats = Stat.get_all()
    except Exception:  # the cache cannot be reached: the rest of the document still holds
        log.warning("django-q2's cluster heartbeats could not be read from its cache", exc_info=True)
        return []
    return [
        shape.worker(
            "qcluster",
            str(s.cluster_id),
            s.timestamp,
            host=getattr(s, "host", None),
            pid=getattr(s, "pid", None),
            started_at=getattr(s, "tob", None),
        )
        for s in stats
    ]


def _orm() -> Any:
    """The ORM broker's queue rows, or None when the project uses another broker."""
    from django_q.models import OrmQ

    alias = _conf().ORM
    return OrmQ.objects.using(alias) if alias else None


def _package(row: Any) -> dict[str, Any]:
    """The signed task package of a queued row (``{}`` when it does not verify)."""
    task = row.task  # django-q2 verifies it with SECRET_KEY; a bad one reads as {"id": "*Error"}
    return task if isinstance(task, dict) and not str(task.get("id", "")).startswith("*") else {}


def _deferred() -> Any:
    from django_q.models import Schedule

    return Schedule.objects.filter(schedule_type=Schedule.ONCE).exclude(repeats=0)


def _queues(now: datetime) -> list[dict[str, Any]]:
    """One queue per cluster name: the ORM broker's rows and the schedules' deferred rows."""
    conf = _conf()
    rows = _orm()
    deferred = _deferred()
    names = {conf.CLUSTER_NAME}
    names |= {c or conf.PREFIX for c in deferred.values_list("cluster", flat=True).distinct()}
    if rows is not None:
        names |= set(rows.values_list("key", flat=True).distinct())
    out = []
    for name in sorted(names):
        # The scheduler of the cluster named like the prefix also takes schedules with no cluster.
        mine = deferred.filter(Q(cluster=name) | Q(cluster__isnull=True) if name == conf.PREFIX else Q(cluster=name))
        late = mine.filter(next_run__lte=now)
        depth, running, retrying, oldest = late.count(), None, 0, late.aggregate(at=Min("next_run"))["at"]
        if rows is not None:
            q = rows.filter(key=name)
            due = q.filter(Q(lock__lte=now) | Q(lock__isnull=True))
            claimed = q.filter(lock__gt=now)
            retrying = _retrying(claimed)
            depth += due.count()
            running = claimed.count() - retrying
            oldest = min((t for t in (oldest, _oldest(due)) if t), default=None)
        out.append(
            shape.queue(
                name,
                TRANSPORT,
                now,
                depth=depth,
                oldest_due=oldest,
                scheduled=mine.filter(next_run__gt=now).count() + retrying,
                running=running,
            )
        )
    return out


def _retrying(claimed: Any) -> int:
    """How many claimed rows wait for a retry rather than run."""
    return len(_waiting([(row, _package(row)) for row in claimed.order_by("id")[:CLAIMED]]))


def _waiting(rows: list[tuple[Any, dict[str, Any]]]) -> set[str]:
    """The task ids of claimed rows that wait for a retry. django-q2 keeps a failed task's row
    (until ``Q_CLUSTER["max_attempts"]``) under the claim of the attempt that failed, which lapses
    ``retry`` seconds after it was made; a claim made after the failure is the next attempt."""
    from django_q.models import Failure

    claimed = {str(t["id"]): row for row, t in rows if t.get("id") and row.lock is not None}
    stopped = dict(Failure.objects.filter(id__in=list(claimed)).values_list("id", "stopped"))
    retry = timedelta(seconds=float(_conf().RETRY))
    return {i for i, row in claimed.items() if i in stopped and row.lock - retry <= stopped[i]}


def _oldest(due: Any) -> datetime | None:
    """When the oldest due row was enqueued: its package's stamp, else its lock (set at enqueue,
    moved ahead by each claim)."""
    times = [t for t in [due.aggregate(at=Min("lock"))["at"]] if t]
    for row in due.order_by("id")[:DECODED]:
        started = _package(row).get("started")
        if isinstance(started, datetime):
            times.append(started)
    return min(times, default=None)


def _queued(now: datetime) -> list[dict[str, Any]]:
    """The newest queued rows as runs: running while a cluster's claim holds, else pending (a
    failed attempt's row until its claim lapses: ``run_at``)."""
    from django_q.utils import get_func_repr

    rows = _orm()
    if rows is None:
        return []
    queued = [(row, _package(row)) for row in rows.order_by("-id")[:DECODED]]
    waiting = _waiting([(row, t) for row, t in queued if row.lock is not None and row.lock > now])
    out = []
    for row, task in queued:
        if not task:
            continue
        claimed = row.lock is not None and row.lock > now
        retry = str(task.get("id")) in waiting
        out.append(
            {
                "id": str(task.get("id")),
                "task_type": str(get_func_repr(task.get("func"))),
                "status": "running" if claimed and not retry else "pending",
                "created_at": task.get("started"),
                "run_at": row.lock if retry else None,
                "attempt": None,
                "last_error": None,
            }
        )
    return out


def _finished() -> list[dict[str, Any]]:
    """The newest ``Task`` rows as runs (a failure's result, its error, read for those alone)."""
    from django_q.models import Task

    newest = list(Task.objects.defer("args", "kwargs", "result").order_by("-started")[: shape.RECENT_RUNS])
    failed = [t.id for t in newest if not t.success]
    errors = dict(Task.objects.filter(id__in=failed).values_list("id", "result"))
    out = []
    for t in newest:
        out.append(
            {
                "id": t.id,
                "task_type": t.func,
                "status": "succeeded" if t.success else "failed",
                "created_at": t.started,
                "finished_at": t.stopped,
                "attempt": t.attempt_count,
                "last_error": None if t.success else _error(errors.get(t.id)),
            }
        )
    return out


def _error(result: Any) -> str:
    """A failed task's result is ``"<message> : <traceback>"``: its message, cut short."""
    return str(result).split(" : Traceback", 1)[0].strip()[:300] or "failed"


def _schedules(now: datetime) -> list[dict[str, Any]]:
    from django_q.models import Schedule, Task

    recurring = list(Schedule.objects.exclude(schedule_type=Schedule.ONCE).order_by("name", "id")[:500])
    last = {t.id: t for t in Task.objects.filter(id__in=[s.task for s in recurring if s.task])}
    queued = {}
    rows = _orm()
    if rows is not None and any(s.task and s.task not in last for s in recurring):
        for row in rows.order_by("-id")[:DECODED]:
            task = _package(row)
            if task.get("id"):
                queued[task["id"]] = ("running" if row.lock and row.lock > now else "pending", task.get("started"))
    out = []
    for s in recurring:
        at: datetime | None = None
        outcome: str | None = None
        if s.task in last:
            at, outcome = last[s.task].started, "succeeded" if last[s.task].success else "failed"
        elif s.task in queued:
            outcome, at = queued[s.task]
        out.append(
            shape.schedule(
                s.name or s.func,
                s.cron if s.schedule_type == Schedule.CRON else None,
                last_run_at=at,
                last_outcome=outcome,
                next_run_at=s.next_run if s.repeats != 0 else None,
            )
        )
    return out
