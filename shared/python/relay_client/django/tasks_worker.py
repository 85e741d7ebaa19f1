"""``relay_tasks_worker``'s worker: django-tasks-db's ``db_worker`` with attempts, a heartbeat and
the recovery of tasks whose worker died.

- A failed attempt with attempts left (``relay_client.django.local``'s policy) goes back to
  ``READY`` with ``run_after`` its backoff later; the last failure marks the result ``FAILED``.
- Every write after the run is fenced by the result's ``worker_ids``: a worker whose task was
  recovered from it meanwhile changes nothing.
- Each beat (once this worker's own beats have gone unbroken for the stale bound) also looks at
  the ``RUNNING`` results: one whose worker (the last of its ``worker_ids``) stopped beating
  ``stale_after()`` ago, or stopped, was left by a worker that died mid-task (``kill -9``, the
  container's memory limit, a lost host). It counts as a failed attempt (``WorkerLost``): run
  again from its start when attempts are left, else failed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import router, transaction
from django.utils import timezone
from django_tasks_db.compat import TaskContext, task_finished, task_started
from django_tasks_db.management.commands.db_worker import Worker as DbWorker
from django_tasks_db.models import DBTaskResult

from . import heartbeats
from .local import Policy, error_line, failed_for_good, run_of
from .records import LocalRun, WorkerHeartbeat

log = logging.getLogger("relay_client")
#: Results looked at per recovery pass.
RECOVER_BATCH = 500


class WorkerLost(Exception):
    """The worker running a task stopped being seen before the task ended."""


class TasksWorker(DbWorker):
    def run(self) -> None:
        beat = heartbeats.Heartbeat(heartbeats.TASKS_WORKER, self.worker_id, also=recover)
        beat.start()
        try:
            super().run()
        finally:
            beat.stop()

    def run_task(self, db_result: DBTaskResult[Any, Any]) -> None:
        claimed = list(db_result.worker_ids)
        try:
            self.running_task = True
            task = db_result.task
            task_result = db_result.task_result
            sender = type(task.get_backend())
            task_started.send(sender=sender, task_result=task_result)
            if task.takes_context:
                value = task.call(TaskContext(task_result=task_result), *task_result.args, **task_result.kwargs)
            else:
                value = task.call(*task_result.args, **task_result.kwargs)
            if _fenced(db_result, claimed).update(
                status="SUCCESSFUL",
                finished_at=timezone.now(),
                return_value=value,
                exception_class_path="",
                traceback="",
            ):
                db_result.refresh_from_db()
                task_finished.send(sender=sender, task_result=db_result.task_result)
            else:
                log.warning("local task %s: recovered from this worker meanwhile, its outcome not kept", db_result.id)
        except BaseException as e:
            failed(db_result, claimed, e)
        finally:
            self.running_task = False
            self._run_tasks += 1


def _fenced(db_result: DBTaskResult[Any, Any], claimed: list[str]) -> Any:
    return DBTaskResult.objects.filter(id=db_result.id, status="RUNNING", worker_ids=claimed)


def failed(db_result: DBTaskResult[Any, Any], claimed: list[str], exc: BaseException) -> None:
    """One attempt failed: back to ``READY`` after its backoff, or ``FAILED`` for good."""
    import traceback as tb

    run = run_of(db_result)
    now = timezone.now()
    attempt = len(claimed)
    retry_at = Policy(run.max_attempts, run.backoff_seconds).retry_at(now, attempt)
    error = error_line(exc)
    fields: dict[str, Any] = {
        "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": "".join(tb.format_exception(exc)),
        "return_value": None,
    }
    if retry_at is None:
        fields.update(status="FAILED", finished_at=now)
    else:
        fields.update(status="READY", run_after=retry_at)
    db = router.db_for_write(DBTaskResult)
    with transaction.atomic(using=db):
        if not _fenced(db_result, claimed).update(**fields):
            log.warning("local task %s: recovered from this worker meanwhile, its failure not kept", db_result.id)
            return
        _note(run, attempt, error, now, retry_at, db_result.started_at)
    if retry_at is None:
        failed_for_good(db_result, run, error)
    else:
        log.warning(
            "local task %s (%s) attempt %d failed, retried at %s: %s", run.name, run.pk, attempt, retry_at, error
        )
    try:
        db_result.refresh_from_db()
        task_finished.send(sender=type(db_result.task.get_backend()), task_result=db_result.task_result)
    except Exception:  # the task no longer imports: the failure is recorded all the same
        log.exception("local task %s: task_finished not sent", db_result.id)


def _note(run: LocalRun, attempt: int, error: str, now: Any, retry_at: Any, started_at: Any) -> None:
    entry = {
        "attempt": attempt,
        "error": error,
        "started_at": started_at.isoformat() if started_at else None,
        "failed_at": now.isoformat(),
        "retry_at": retry_at.isoformat() if retry_at else None,
    }
    run.errors = [*run.errors, entry]
    run.last_error = error
    run.save(update_fields=["errors", "last_error"])


def recover() -> None:
    """Each heartbeat's upkeep: :func:`recover_lost`."""
    recover_lost()


def recover_lost() -> int:
    """Recover the ``RUNNING`` results of workers that stopped being seen; returns how many."""
    now = timezone.now()
    running = list(DBTaskResult.objects.filter(status="RUNNING").only("id", "worker_ids")[:RECOVER_BATCH])
    last = {str(r.id): r.worker_ids[-1] for r in running if r.worker_ids}
    if not last:
        return 0
    gone = set(
        WorkerHeartbeat.objects.filter(instance_id__in=set(last.values()))
        .exclude(stopped_at__isnull=True, last_seen_at__gte=now - heartbeats.stale_after())
        .values_list("instance_id", flat=True)
    )
    n = 0
    for result_id, worker in last.items():
        if worker in gone:
            n += _recover_one(result_id, worker)
    return n


def _recover_one(result_id: str, worker: str) -> int:
    db = router.db_for_write(DBTaskResult)
    with transaction.atomic(using=db):
        row = DBTaskResult.objects.select_for_update(skip_locked=True).filter(id=result_id, status="RUNNING").first()
        if row is None or not row.worker_ids or row.worker_ids[-1] != worker:
            return 0
        exc = WorkerLost(f"worker {worker} stopped being seen while running attempt {len(row.worker_ids)}")
        run = run_of(row)
        LocalRun.objects.filter(pk=run.pk).update(recovered=run.recovered + 1)
        run.recovered += 1
    failed(row, list(row.worker_ids), exc)
    log.warning("local task %s (%s): recovered from worker %s, which stopped being seen", run.name, result_id, worker)
    return 1
