"""The local periodic work a project declares in ``RELAY["SCHEDULES"]``, fired by ``relay_worker``.

Each entry is ``{"name", "cron", "task", "kwargs"?, "catch_up"?, "enabled"?}``: a cron expression
read in the project's time zone, and the module path of a ``django.tasks`` task (enqueued on its
own backend) or of a plain function (the package's ``call_function`` task runs it, shown under the
function's name). The settings are the declaration; each entry also has a ``ScheduleState`` row:

- its switch: :func:`switch` (and the admin's actions) turns a schedule off and on. A deploy
  never turns a switched-off schedule back on (django-q2's ``preserve_disabled``); ``"enabled":
  False`` in an entry is only the state its row starts in.
- the latest slot it handled. A slot fires once however many workers run (the row is locked
  while its slot fires, and the ``ScheduleSlot`` row is written in the same transaction as the
  enqueue). A slot fires when a worker sees it within ``GRACE`` (and within the schedule's own
  interval); a slot missed for longer (no worker ran, the schedule was off, a first start after
  it) is passed over, unless the entry says ``"catch_up": True`` (the latest missed slot fires
  once) or ``"catch_up": <seconds>`` (it fires if no older than that).

One entry that cannot fire (its task gone, its database refusing) is logged and the others fire.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import conf
from ._compat import Task
from .models import ScheduleSlot
from .records import ScheduleState

log = logging.getLogger("relay_client")

#: The longest a slot may be late (a worker's look every 15 s, a slow start) and still fire
#: without ``catch_up``; a schedule whose slots come more often uses its own interval instead.
GRACE = timedelta(minutes=2)


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    task: str
    kwargs: dict[str, Any]
    #: False: no missed slot fires; True: the latest does, however old; a number: if that recent.
    catch_up: bool | float = False
    enabled: bool = True

    def latest(self, now: datetime) -> datetime:
        """The last slot at or before ``now``."""
        start = timezone.localtime(now).replace(microsecond=0) + timedelta(seconds=1)
        return next(iter(CronSim(self.cron, start, reverse=True)))

    def before(self, slot: datetime) -> datetime:
        """The slot before ``slot``."""
        return next(iter(CronSim(self.cron, timezone.localtime(slot), reverse=True)))

    def next(self, now: datetime) -> datetime:
        return next(iter(CronSim(self.cron, timezone.localtime(now).replace(microsecond=0))))

    def may_fire(self, slot: datetime, now: datetime) -> bool:
        """Whether ``slot``, seen at ``now`` and not handled yet, fires."""
        late = now - slot
        if late <= min(GRACE, slot - self.before(slot)):
            return True
        if self.catch_up is True:
            return True
        if self.catch_up is False:
            return False
        return late <= timedelta(seconds=float(self.catch_up))


def declared() -> list[Schedule]:
    """``RELAY["SCHEDULES"]``, read; the system checks report entries this cannot read."""
    out = []
    for entry in conf.get("SCHEDULES") or []:
        out.append(
            Schedule(
                str(entry["name"]),
                str(entry["cron"]),
                str(entry["task"]),
                dict(entry.get("kwargs") or {}),
                catch_up=entry.get("catch_up", False),
                enabled=bool(entry.get("enabled", True)),
            )
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
            target = import_string(str(entry["task"]))
        except ImportError as e:
            out.append(f"task {entry['task']!r} cannot be imported: {e}")
        else:
            if not isinstance(target, Task) and not callable(target):
                out.append(f"task {entry['task']!r} is neither a django.tasks task nor a function")
    if "kwargs" in entry:
        if not isinstance(entry["kwargs"], dict):
            out.append("kwargs must be a dict")
        else:
            try:
                json.dumps(entry["kwargs"])
            except (TypeError, ValueError) as e:
                out.append(f"kwargs must be JSON (the task's arguments are stored as JSON): {e}")
    catch_up = entry.get("catch_up", False)
    if not isinstance(catch_up, bool) and (not isinstance(catch_up, int | float) or catch_up < 0):
        out.append(f"catch_up must be True, False or a number of seconds, not {catch_up!r}")
    if "enabled" in entry and not isinstance(entry["enabled"], bool):
        out.append("enabled must be True or False")
    return out


def state(s: Schedule) -> ScheduleState:
    """The schedule's row, made (in the entry's ``enabled`` state) the first time it is seen."""
    db = conf.database()
    try:
        with transaction.atomic(using=db):
            row, _ = ScheduleState.objects.using(db).get_or_create(name=s.name, defaults={"enabled": s.enabled})
    except IntegrityError:  # another worker made it at the same moment
        row = ScheduleState.objects.using(db).get(name=s.name)
    return row


def sync() -> list[ScheduleState]:
    """A row for each declared schedule (made in the entry's ``enabled`` state when missing)."""
    return [state(s) for s in declared()]


def switch(name: str, enabled: bool, *, by: str = "") -> ScheduleState:
    """Turn the declared schedule ``name`` off or on (for an admin action or a view); it stays so
    across restarts and deploys. Raises ``KeyError`` for a name ``RELAY["SCHEDULES"]`` lacks."""
    s = next((s for s in declared() if s.name == name), None)
    if s is None:
        raise KeyError(f"no RELAY['SCHEDULES'] entry is named {name!r}")
    row = state(s)
    row.enabled, row.changed_at, row.changed_by = enabled, timezone.now(), by
    row.save(using=conf.database(), update_fields=["enabled", "changed_at", "changed_by"])
    log.info("schedule %s switched %s%s", name, "on" if enabled else "off", f" by {by}" if by else "")
    return row


def task_of(s: Schedule) -> Task:  # type: ignore[type-arg]
    """The task a schedule enqueues: its own, or the package's that calls its plain function."""
    target = import_string(s.task)
    if isinstance(target, Task):
        return target
    if callable(target):
        from .local import call_function

        return call_function
    raise TypeError(f"schedule {s.name}: {s.task!r} is neither a django.tasks task nor a function")


def enqueue(s: Schedule) -> Any:
    t = task_of(s)
    return t.enqueue(**s.kwargs) if t.module_path == s.task else t.enqueue(s.task, s.kwargs)


def fire_due(now: datetime | None = None) -> list[str]:
    """Enqueue each switched-on schedule whose latest slot is due; returns ``name@slot`` of each fired."""
    now = now or timezone.now()
    fired = []
    entries = declared()
    rows = {r.name: r for r in ScheduleState.objects.using(conf.database()).filter(name__in=[s.name for s in entries])}
    for s in entries:
        try:
            slot = _fire(s, now, rows.get(s.name))
        except Exception:
            log.exception("schedule %s could not fire; the others still do", s.name)
            continue
        if slot is not None:
            fired.append(f"{s.name}@{slot.isoformat()}")
    return fired


def _fire(s: Schedule, now: datetime, row: ScheduleState | None) -> datetime | None:
    db = conf.database()
    slot = s.latest(now)
    row = row or state(s)
    if row.last_slot is not None and row.last_slot >= slot:
        return None
    with transaction.atomic(using=db):
        row = ScheduleState.objects.using(db).select_for_update().get(pk=row.pk)
        if row.last_slot is not None and row.last_slot >= slot:
            return None  # another worker handled it
        fire = (
            row.enabled
            and s.may_fire(slot, now)
            and not ScheduleSlot.objects.using(db).filter(name=s.name, slot=slot).exists()
        )
        row.last_slot = slot
        row.save(using=db, update_fields=["last_slot"])
        if not fire:
            if row.enabled:
                log.info("schedule %s passed over its slot %s (missed; no catch_up)", s.name, slot.isoformat())
            return None
        slot_row = ScheduleSlot.objects.using(db).create(name=s.name, slot=slot)
        result = enqueue(s)
        slot_row.task_result_id = str(result.id)
        slot_row.save(using=db, update_fields=["task_result_id"])
    log.info("schedule %s fired for %s (%s)", s.name, slot.isoformat(), s.task)
    return slot
