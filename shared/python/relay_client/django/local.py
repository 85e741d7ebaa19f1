"""Local ``django.tasks`` work with attempts and backoff, on django-tasks-db.

``TASKS = {"default": {"BACKEND": "relay_client.django.local.LocalBackend"}}`` (django-tasks-db's
``DatabaseBackend`` with the package's task class) and ``manage.py relay_tasks_worker`` (its
``db_worker`` with retries, heartbeats and recovery) in place of ``db_worker``. Then:

- per task: ``@local_task(max_attempts=3, backoff=60)`` (or Django's ``@task(max_attempts=3,
  backoff=60)``, which passes them on, untyped);
- per call: ``my_task.using(max_attempts=5, backoff=10).enqueue(...)``;
- per project: ``RELAY["TASK_ATTEMPTS"]`` (default 1: no retry) and ``RELAY["TASK_BACKOFF"]``
  (seconds, default 60).

``max_attempts`` counts every attempt, the first included; a failed attempt with attempts left
waits ``backoff × 2^(n-1)`` seconds (at most ``MAX_BACKOFF``) and runs again; the last failure
is the task's: the result is ``FAILED`` with its error, its ``LocalRun`` keeps each attempt's
error, and :data:`local_task_failed` is sent. :func:`rerun` enqueues a failed task again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import router, transaction
from django.dispatch import Signal
from django.utils import timezone
from django.utils.module_loading import import_string
from django_tasks_db.backend import DatabaseBackend

from . import conf
from ._compat import Task, TaskResult, task
from .records import LocalRun

log = logging.getLogger("relay_client")

#: The longest wait between two attempts, whatever the backoff doubles to.
MAX_BACKOFF = timedelta(hours=6)
#: The task a schedule naming a plain function enqueues (the function's path is its first argument).
CALL_PATH = "relay_client.django.local.call_function"

#: A local task failed for good (its attempts spent, or its worker lost on the last one): sent
#: with ``sender=LocalRun`` and ``run`` (the ``LocalRun``: ``name``, ``last_error``, ``errors``)
#: and ``result_id``. Connect a receiver to alert.
local_task_failed = Signal()


class NotFailed(Exception):
    """:func:`rerun` was asked to run again a result that did not fail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalTask(Task):  # type: ignore[type-arg]
    """A ``django.tasks`` task with its attempts policy (``None``: the project's default)."""

    max_attempts: int | None = None
    #: Seconds before the first retry; each later retry waits twice the one before.
    backoff: float | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        backoff: float | None = None,
    ) -> LocalTask:
        """A copy with other defaults: Django's own, plus the attempts policy for this call."""
        t: Any = Task.using(self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend)
        changes: dict[str, Any] = {
            k: v for k, v in {"max_attempts": max_attempts, "backoff": backoff}.items() if v is not None
        }
        return cast(LocalTask, replace(t, **changes))


@dataclass(frozen=True)
class Policy:
    max_attempts: int
    backoff: float

    def retry_at(self, now: datetime, attempt: int) -> datetime | None:
        """When attempt ``attempt + 1`` runs after attempt ``attempt`` failed; None when it was the last."""
        if attempt >= self.max_attempts:
            return None
        wait = timedelta(seconds=self.backoff * 2 ** max(attempt - 1, 0))
        return now + min(wait, MAX_BACKOFF)


def policy(t: Any) -> Policy:
    """The task's attempts policy: its own (per call or per task), else the project's."""
    attempts = getattr(t, "max_attempts", None) or conf.get("TASK_ATTEMPTS", 1)
    backoff = getattr(t, "backoff", None)
    return Policy(int(attempts), float(conf.get("TASK_BACKOFF", 60.0) if backoff is None else backoff))


def display_name(task_path: str, args_kwargs: dict[str, Any] | None) -> str:
    """The name a person reads: the task's path, or the function a plain-function task calls."""
    if task_path == CALL_PATH and args_kwargs:
        args = list(args_kwargs.get("args") or [])
        fn = args[0] if args else (args_kwargs.get("kwargs") or {}).get("function")
        if isinstance(fn, str):
            return fn
    return task_path


def error_line(exc: BaseException) -> str:
    """``ValueError: the message``, at most 300 characters."""
    message = str(exc).strip()
    return (f"{type(exc).__name__}: {message}" if message else type(exc).__name__)[:300]


class LocalBackend(DatabaseBackend):
    """django-tasks-db's backend; each enqueue also writes the result's ``LocalRun`` (its name
    and attempts policy) in the same transaction."""

    task_class = LocalTask

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> Any:  # type: ignore[type-arg]
        return self._enqueue(task, args, kwargs, rerun_of="")

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> Any:  # type: ignore[type-arg]
        return await sync_to_async(self.enqueue)(task, args, kwargs)

    def _enqueue(self, task: Task, args: Any, kwargs: Any, *, rerun_of: str) -> Any:  # type: ignore[type-arg]
        from django_tasks_db.models import DBTaskResult

        p = policy(task)
        with transaction.atomic(using=router.db_for_write(DBTaskResult)):
            result: Any = super().enqueue(task, args, kwargs)
            LocalRun.objects.using(router.db_for_write(DBTaskResult)).create(
                result_id=str(result.id),
                name=display_name(task.module_path, {"args": list(args), "kwargs": dict(kwargs)}),
                max_attempts=p.max_attempts,
                backoff_seconds=p.backoff,
                rerun_of=rerun_of,
            )
        return result


# Declared after LocalBackend: declaring it may import this module's LocalBackend (the default backend).
@task
def call_function(function: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Run the plain function at ``function`` (a module path): a schedule may name one."""
    return import_string(function)(**(kwargs or {}))


def local_task(
    *,
    max_attempts: int | None = None,
    backoff: float | None = None,
    priority: int | None = None,
    queue_name: str | None = None,
    backend: str | None = None,
    takes_context: bool = False,
) -> Callable[[Callable[..., Any]], LocalTask]:
    """``@task`` with the attempts policy, typed: ``@local_task(max_attempts=3, backoff=60)``.
    Django's own ``@task(max_attempts=..., backoff=...)`` does the same on a :class:`LocalBackend`
    (type checkers do not know the two options). On another backend (a test's ``DummyBackend``)
    the task is made all the same; only ``relay_tasks_worker`` acts on the policy."""

    def wrap(f: Callable[..., Any]) -> LocalTask:
        options: dict[str, Any] = {"takes_context": takes_context}
        options.update({k: v for k, v in {"priority": priority, "queue_name": queue_name}.items() if v is not None})
        if backend is not None:
            options["backend"] = backend
        t = task(**options)(f)
        own = {fld.name: getattr(t, fld.name) for fld in fields(t) if fld.name not in ("max_attempts", "backoff")}
        return LocalTask(**own, max_attempts=max_attempts, backoff=backoff)

    return wrap


def run_of(db_result: Any) -> LocalRun:
    """The result's ``LocalRun``, made from its task's policy when the enqueue wrote none."""
    db = router.db_for_write(LocalRun)
    run = LocalRun.objects.using(db).filter(result_id=str(db_result.id)).first()
    if run is not None:
        return run
    try:
        p = policy(db_result.task)
    except Exception:  # the task no longer imports: the project's default
        p = policy(None)
    run, _ = LocalRun.objects.using(db).get_or_create(
        result_id=str(db_result.id),
        defaults={
            "name": display_name(db_result.task_path, db_result.args_kwargs),
            "max_attempts": p.max_attempts,
            "backoff_seconds": p.backoff,
        },
    )
    return run


def rerun(result_id: str, *, by: str = "") -> TaskResult:  # type: ignore[type-arg]
    """Enqueue a failed local task again with its arguments; the new result's ``LocalRun`` names
    the old one (``rerun_of``) and the old one's the new (``rerun_as``). Asked twice, it enqueues
    once and returns the first re-run's result. Raises :class:`NotFailed` for a result that did
    not fail."""
    from django_tasks_db.models import DBTaskResult

    db = router.db_for_write(DBTaskResult)
    with transaction.atomic(using=db):
        old = DBTaskResult.objects.using(db).select_for_update().get(id=result_id)
        if old.status != "FAILED":
            raise NotFailed(f"result {result_id} is {old.status}, not FAILED")
        run = run_of(old)
        run = LocalRun.objects.using(db).select_for_update().get(pk=run.pk)
        if run.rerun_as:
            return old.task.get_backend().get_result(run.rerun_as)
        t = old.task
        if isinstance(t, LocalTask):
            t = t.using(max_attempts=run.max_attempts, backoff=run.backoff_seconds)
        backend = t.get_backend()
        args, kwargs = old.args_kwargs["args"], old.args_kwargs["kwargs"]
        if isinstance(backend, LocalBackend):
            new = backend._enqueue(t, args, kwargs, rerun_of=str(old.id))
        else:
            new = t.enqueue(*args, **kwargs)
            LocalRun.objects.using(db).update_or_create(
                result_id=str(new.id), defaults={"name": run.name, "rerun_of": str(old.id)}
            )
        run.rerun_as = str(new.id)
        run.save(using=db, update_fields=["rerun_as"])
    log.info("local task %s (%s) run again as %s%s", run.name, result_id, new.id, f" by {by}" if by else "")
    return cast("TaskResult[Any, Any]", new)


def failed_for_good(db_result: Any, run: LocalRun, error: str) -> None:
    """Record the task's failure for good and tell the receivers of :data:`local_task_failed`."""
    db = router.db_for_write(LocalRun)
    LocalRun.objects.using(db).filter(pk=run.pk).update(failed_at=timezone.now(), last_error=error)
    run.refresh_from_db(using=db)
    log.error("local task %s (%s) failed for good after %d attempts: %s", run.name, run.pk, attempts(db_result), error)
    local_task_failed.send(sender=LocalRun, run=run, result_id=str(db_result.id))


def attempts(db_result: Any) -> int:
    """The attempts a result has started: each claim adds its worker's id."""
    return len(db_result.worker_ids or [])


def prune_orphans() -> int:
    """Delete the ``LocalRun`` rows whose result is gone (django-tasks-db's
    ``prune_db_task_results`` deletes results and knows nothing of them)."""
    from django.db.models import CharField
    from django.db.models.functions import Cast
    from django_tasks_db.models import DBTaskResult

    db = router.db_for_write(LocalRun)
    ids = DBTaskResult.objects.using(db).annotate(sid=Cast("id", CharField())).values("sid")
    n, _ = LocalRun.objects.using(db).exclude(result_id__in=ids).delete()
    return n
