"""Workers that say they are alive: each ``relay_worker`` and ``relay_tasks_worker`` process
writes a ``WorkerHeartbeat`` row every ``RELAY["HEARTBEAT_SECONDS"]`` (default 10) from a thread
of its own, so a long task or step does not silence it, and marks it stopped when it exits.

A worker is live while its last beat is younger than ``stale_after()`` (``RELAY["WORKER_STALE_SECONDS"]``,
default 60); a stopped or silent one leaves the status document after ``FORGET_AFTER``. The
deploy gate (``manage.py relay_await_workers``) waits for a fresh beat of each declared kind.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from . import conf
from .records import WorkerHeartbeat

log = logging.getLogger("relay_client")

RELAY_WORKER = "relay_worker"
TASKS_WORKER = "relay_tasks_worker"
#: A worker neither stopped cleanly nor seen for this long is left out of the status document
#: (the console shows it dead 90 s after its last beat, then forgets it).
FORGET_AFTER = timedelta(minutes=15)


def every() -> float:
    return float(conf.get("HEARTBEAT_SECONDS", 10.0))


def stale_after() -> timedelta:
    return timedelta(seconds=float(conf.get("WORKER_STALE_SECONDS", 60.0)))


def declared_kinds() -> list[str]:
    """``RELAY["WORKERS"]``: the kinds a deploy must see alive (default: ``relay_worker``)."""
    kinds = conf.get("WORKERS")
    if kinds is None:
        return [RELAY_WORKER]
    return [kinds] if isinstance(kinds, str) else list(kinds)


def beat(kind: str, instance_id: str, started_at: datetime) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.using(conf.database()).update_or_create(
        instance_id=instance_id,
        defaults={
            "kind": kind,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": started_at,
            "last_seen_at": now,
            "stopped_at": None,
        },
    )


def fresh(kinds: Iterable[str], now: datetime | None = None, *, started_after: datetime | None = None) -> set[str]:
    """The kinds among ``kinds`` with a live, not stopped worker (started after ``started_after``)."""
    now = now or timezone.now()
    rows = WorkerHeartbeat.objects.using(conf.database()).filter(
        kind__in=list(kinds), stopped_at__isnull=True, last_seen_at__gte=now - stale_after()
    )
    if started_after is not None:
        rows = rows.filter(started_at__gte=started_after)
    return set(rows.values_list("kind", flat=True))


def reported(now: datetime) -> list[WorkerHeartbeat]:
    """The workers the status document lists: running, or silent for less than ``FORGET_AFTER``."""
    rows = WorkerHeartbeat.objects.using(conf.database()).filter(
        stopped_at__isnull=True, last_seen_at__gte=now - FORGET_AFTER
    )
    return list(rows.order_by("-last_seen_at")[:200])


class Heartbeat:
    """Beats for one worker on a daemon thread; ``also`` runs after each beat once the beats have
    gone unbroken for ``stale_after()`` (a worker's upkeep: recovering the tasks of workers that
    stopped being seen)."""

    def __init__(self, kind: str, instance_id: str, *, also: Callable[[], None] | None = None) -> None:
        self.kind, self.instance_id, self.also = kind, instance_id, also
        self.started_at = timezone.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{kind}-heartbeat", daemon=True)

    def start(self) -> None:
        """The first beat now (a deploy gate sees the worker at once), then one every ``every()``."""
        beat(self.kind, self.instance_id, self.started_at)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and mark the worker stopped (it then leaves the status document)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=every() + 5)
        try:
            WorkerHeartbeat.objects.using(conf.database()).filter(instance_id=self.instance_id).update(
                stopped_at=timezone.now()
            )
        except Exception:
            log.warning("%s %s: could not mark itself stopped", self.kind, self.instance_id, exc_info=True)

    def _loop(self) -> None:
        interval = every()
        # ``also`` runs only once this worker has beaten without a break for the stale bound: after
        # its start or a database outage, the other workers have had that long to beat again, so
        # none of them is taken for dead because the database was away.
        steady_after = stale_after().total_seconds()
        unbroken_since = time.monotonic()
        try:
            while not self._stop.wait(interval):
                started = time.monotonic()
                try:
                    beat(self.kind, self.instance_id, self.started_at)
                    if self.also is not None and started - unbroken_since >= steady_after:
                        self.also()
                except Exception:  # the database restarting: the next beat tries again
                    log.warning("%s %s: heartbeat failed", self.kind, self.instance_id, exc_info=True)
                    connections.close_all()
                    unbroken_since = time.monotonic()
                if time.monotonic() - started > interval:
                    log.warning("%s %s: a heartbeat took longer than its interval", self.kind, self.instance_id)
        finally:
            connections.close_all()


def prune(older_than: timedelta = timedelta(days=7)) -> int:
    """Delete the rows of workers gone longer than ``older_than``."""
    n, _ = WorkerHeartbeat.objects.using(conf.database()).filter(last_seen_at__lt=timezone.now() - older_than).delete()
    return n
