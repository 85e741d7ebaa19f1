"""The status collector: ``relay.status/v1`` for the project's local work.

Sources, chosen by ``RELAY["STATUS_SOURCES"]`` (a list of names) or, when that is not set, every
one whose Django app is installed: ``"django_tasks_db"`` (``django.tasks`` on django-tasks-db)
and ``"django_q"`` (django-q2's tables). A project in the middle of a move from django-q2 to
``django.tasks`` has both apps installed and shows both sources' queues, runs and failures.

Beside them, always: the outbox as a queue of its own (``relay-outbox``), where rows a crash left
behind show as depth and age until a drain posts them; rows Relay refused count as failures,
and rows stuck until the tenant acts (401/403/409) as open exceptions; and the schedules
declared in ``RELAY["SCHEDULES"]`` with their next run and the run their latest fired slot
enqueued (a run of the same task enqueued by other code is not the schedule's); and the workers
that beat (``relay_worker``, ``relay_tasks_worker``), a stopped one forgotten after
``heartbeats.FORGET_AFTER``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Min
from django.utils import timezone

from .. import conf, heartbeats
from .._compat import TaskResultDoesNotExist, TaskResultMismatch
from ..models import RelayJob, ScheduleSlot, ScheduleState
from ..schedules import Schedule, declared, task_of
from . import django_q, shape, tasks_db
from .shape import CONTRACT, RECENT_RUNS, VERSION

__all__ = ["CONTRACT", "RECENT_RUNS", "SOURCES", "VERSION", "document", "sources"]

#: Each source by its name in ``STATUS_SOURCES``, which is also its Django app's label.
SOURCES: dict[str, Callable[[datetime], shape.Part]] = {
    "django_tasks_db": tasks_db.collect,
    "django_q": django_q.collect,
}


def sources() -> list[str]:
    """The sources this project reports: ``RELAY["STATUS_SOURCES"]``, else each installed one."""
    chosen = conf.get("STATUS_SOURCES")
    if chosen is None:
        return [name for name in SOURCES if apps.is_installed(name)]
    names = [chosen] if isinstance(chosen, str) else list(chosen)
    for name in names:
        if name not in SOURCES:
            raise ImproperlyConfigured(f"RELAY['STATUS_SOURCES']: unknown source {name!r} (known: {sorted(SOURCES)})")
    return names


def document(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    names = sources()
    parts = [_outbox(now)] + [SOURCES[name](now) for name in names]
    parts.append(shape.Part(schedules=_declared(now), workers=_heartbeats(now)))
    return shape.merge(str(conf.get("PROJECT") or "django"), now, parts)


def _heartbeats(now: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    """The workers that beat (``relay_worker``, ``relay_tasks_worker``): running, or silent for
    less than ``FORGET_AFTER`` (the console shows those dead)."""
    return [
        shape.worker(w.kind, w.instance_id, w.last_seen_at, host=w.host, pid=w.pid, started_at=w.started_at)
        for w in heartbeats.reported(now)
    ]


def _outbox(now: datetime) -> shape.Part:
    from ..outbox import stuck

    rows = RelayJob.objects.using(conf.database())
    unsent = rows.filter(posted_at__isnull=True).aggregate(n=Count("id"), oldest=Min("created_at"))
    refused = rows.filter(status="refused")
    return shape.Part(
        queues=[shape.queue("relay-outbox", "outbox", now, depth=unsent["n"], oldest_due=unsent["oldest"])],
        failed_last_hour=refused.filter(posted_at__gte=now - timedelta(hours=1)).count(),
        failed_last_24h=refused.filter(posted_at__gte=now - timedelta(hours=24)).count(),
        open_exceptions=stuck().count(),
    )


def _declared(now: datetime) -> list[dict[str, Any]]:
    """Each declared schedule; one switched off has no next run."""
    off = set(ScheduleState.objects.using(conf.database()).filter(enabled=False).values_list("name", flat=True))
    out = []
    for s in declared():
        at, outcome = _last_fired(s)
        following = None if s.name in off else s.next(now)
        out.append(shape.schedule(s.name, s.cron, last_run_at=at, last_outcome=outcome, next_run_at=following))
    return out


def _last_fired(s: Schedule) -> tuple[datetime | None, str | None]:
    """When the schedule's latest fired slot ran (or fired, until it runs), and how that run stands."""
    slot = ScheduleSlot.objects.using(conf.database()).filter(name=s.name).order_by("-slot").first()
    if slot is None:
        return None, None
    try:
        result = task_of(s).get_result(slot.task_result_id)
    except (
        ImportError,
        TypeError,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    ):  # pruned, or the entry now names another task
        return slot.fired_at, None
    return result.started_at or slot.fired_at, shape.OUTCOMES.get(str(result.status), str(result.status).lower())
