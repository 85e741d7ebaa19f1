"""``relay_worker``'s loop: the drain, the reconciliation and the declared schedules, each on its
own interval, in one process that stops cleanly when told to (``stop``; SIGTERM in the command),
and beats its heartbeat (``heartbeats``) on a thread of its own throughout.

A failure of one step (Relay unreachable, the database restarting) is logged and the step runs
again at its next interval: the worker outlives what it reports.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import close_old_connections

from . import heartbeats, outbox, schedules

log = logging.getLogger("relay_client")


@dataclass
class Worker:
    drain_every: float = 30.0
    #: Rows younger than this are their commit's to post.
    drain_min_age: float = 10.0
    reconcile_every: float = 300.0
    reconcile_older_than: float = 600.0
    schedules_every: float = 15.0
    prune_after_days: float | None = None
    say: Callable[[str], None] = log.info
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: This process's id in its heartbeat (the status document's ``instance_id``).
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}")

    def stop(self) -> None:
        self.stop_event.set()

    def steps(self) -> list[tuple[str, float, Callable[[], str]]]:
        out = [
            ("drain", self.drain_every, self.drain),
            ("reconcile", self.reconcile_every, self.reconcile),
            ("schedules", self.schedules_every, self.schedules),
        ]
        if self.prune_after_days is not None:
            out.append(("prune", 3600.0, self.prune))
            out.append(("prune local", 3600.0, self.prune_local))
        return out

    def run_once(self) -> None:
        for name, _, step in self.steps():
            self._run(name, step)

    def run(self) -> None:
        """Until ``stop()``: each step at start, then at its interval; a heartbeat throughout."""
        beat = heartbeats.Heartbeat(heartbeats.RELAY_WORKER, self.instance_id)
        beat.start()
        try:
            self._loop()
        finally:
            beat.stop()
        self.say("relay worker stopped")

    def _loop(self) -> None:
        due = {name: 0.0 for name, _, _ in self.steps()}
        self.say(f"relay worker started ({self.instance_id})")
        while not self.stop_event.is_set():
            for name, every, step in self.steps():
                if self.stop_event.is_set():
                    break
                if time.monotonic() >= due[name]:
                    self._run(name, step)
                    due[name] = time.monotonic() + every
            self.stop_event.wait(max(min(due.values()) - time.monotonic(), 0.05))

    def _run(self, name: str, step: Callable[[], str]) -> None:
        close_old_connections()
        try:
            said = step()
        except Exception:
            log.exception("relay worker: %s failed, next try at its next interval", name)
            return
        if said:
            self.say(f"{name}: {said}")

    def drain(self) -> str:
        r = outbox.drain(min_age=timedelta(seconds=self.drain_min_age))
        if r.stuck:
            log.error("relay outbox: %d rows stuck until the tenant acts (401/403/409, see post_error)", r.stuck)
        if not (r.posted or r.refused or r.blocked or r.left or r.stuck):
            return ""
        return f"posted {r.posted}, refused {r.refused}, blocked {r.blocked}, left {r.left}, stuck {r.stuck}" + (
            f" ({r.error})" if r.error else ""
        )

    def reconcile(self) -> str:
        n = outbox.reconcile(older_than=timedelta(seconds=self.reconcile_older_than))
        return f"repaired {n}" if n else ""

    def schedules(self) -> str:
        fired = schedules.fire_due()
        return f"fired {', '.join(fired)}" if fired else ""

    def prune(self) -> str:
        assert self.prune_after_days is not None
        n = outbox.prune(older_than=timedelta(days=self.prune_after_days))
        return f"pruned {n}" if n else ""

    def prune_local(self) -> str:
        """Heartbeats of workers gone a week; run records of results django-tasks-db pruned."""
        from django.apps import apps

        said = []
        if n := heartbeats.prune():
            said.append(f"forgot {n} workers gone a week")
        if apps.is_installed("django_tasks_db"):
            from .local import prune_orphans

            if n := prune_orphans():
                said.append(f"deleted {n} local run records whose result was pruned")
        return ", ".join(said)
