"""The local periodic work a project declares in ``RELAY["SCHEDULES"]``, fired by ``relay_worker``.

Each entry is ``{"name", "cron", "task", "kwargs"?}``: a cron expression read in the project's
time zone, and the module path of a ``django.tasks`` task enqueued on its own backend. A slot
fires once however many workers run: its ``ScheduleSlot`` row (unique name and slot) is written
in the same transaction as the enqueue. A slot missed while no worker ran fires once when one
starts again within ``catch_up`` of it; older slots are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import conf
from .models import ScheduleSlot

log = logging.getLogger("relay_client")


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    task: str
    kwargs: dict[str, Any]

    def latest(self, now: datetime) -> datetime:
        """The last slot at or before ``now``."""
        start = timezone.localtime(now).replace(microsecond=0) + timedelta(seconds=1)
        return next(iter(CronSim(self.cron, start, reverse=True)))

    def next(self, now: datetime) -> datetime:
        return next(iter(CronSim(self.cron, timezone.localtime(now).replace(microsecond=0))))


def declared() -> list[Schedule]:
    """``RELAY["SCHEDULES"]``, read; the system checks report entries this cannot read."""
    out = []
    for entry in conf.get("SCHEDULES") or []:
        out.append(
            Schedule(str(entry["name"]), str(entry["cron"]), str(entry["task"]), dict(entry.get("kwargs") or {}))
        )
    return out


def problems(entry: Any) -> list[str]:
    """What is wrong with one ``SCHEDULES`` entry (empty when nothing is)."""
    if not isinstance(entry, dict):
        return ["must be a dict with name, cron and task"]
    out = [f"has no {k!r}" for k in ("name", "cron", "task") if not entry.get(k)]
    if entry.get("cron"):
        try:
            CronSim(str(entry["cron"]), timezone.now())
        except CronSimError as e:
            out.append(f"cron {entry['cron']!r} does not parse: {e}")
    if entry.get("task"):
        try:
            import_string(str(entry["task"]))
        except ImportError as e:
            out.append(f"task {entry['task']!r} cannot be imported: {e}")
    if "kwargs" in entry and not isinstance(entry["kwargs"], dict):
        out.append("kwargs must be a dict")
    return out


def fire_due(now: datetime | None = None, *, catch_up: timedelta = timedelta(hours=1)) -> list[str]:
    """Enqueue every schedule whose latest slot has not fired; returns ``name@slot`` of each fired."""
    now = now or timezone.now()
    db = conf.database()
    fired = []
    for s in declared():
        slot = s.latest(now)
        if now - slot > catch_up:
            continue
        try:
            with transaction.atomic(using=db):
                row = ScheduleSlot.objects.using(db).create(name=s.name, slot=slot)
                result = import_string(s.task).enqueue(**s.kwargs)
                row.task_result_id = str(result.id)
                row.save(using=db, update_fields=["task_result_id"])
        except IntegrityError:  # another worker fired this slot
            continue
        log.info("schedule %s fired for %s (%s)", s.name, slot.isoformat(), s.task)
        fired.append(f"{s.name}@{slot.isoformat()}")
    return fired
