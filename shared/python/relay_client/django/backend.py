"""The ``django.tasks`` backend for Relay's task types.

``TASKS = {"relay": {"BACKEND": "relay_client.django.backend.RelayBackend"}}`` next to the
project's local backend; then ``email_send = relay_task("email.send")`` and
``email_send.enqueue(to=..., template=...)`` like any task. Parameters are keyword arguments
(they become the job's ``params``); ``.using(run_after=...)`` defers the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.tasks import TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.utils.json import normalize_json

from . import conf
from .context import current_correlation
from .models import RelayJob


def runs_on_relay(**params: Any) -> None:
    """The function every Relay task stands for: the work itself runs on Relay, never here."""
    raise RuntimeError("a Relay task runs on Relay: enqueue it, do not call it")


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayTask(Task):
    """A task named by its Relay task type."""

    task_type: str = ""

    @property
    def name(self) -> str:
        return self.task_type

    @property
    def module_path(self) -> str:
        return f"relay:{self.task_type}"

    def get_result(self, result_id: str) -> TaskResult:
        result = self.get_backend().get_result(result_id)
        if not isinstance(result.task, RelayTask) or result.task.task_type != self.task_type:
            raise TaskResultMismatch(f"result {result_id} is a {result.task.name!r}, not a {self.task_type!r}")
        return result


def relay_task(task_type: str, *, backend: str = "relay", queue_name: str = "default") -> RelayTask:
    """Declare a platform task by its type: ``email_send = relay_task("email.send")``."""
    cls = task_backends[backend].task_class
    if not issubclass(cls, RelayTask):
        raise InvalidTask(f"task backend {backend!r} is not a RelayBackend")
    return cls(priority=DEFAULT_TASK_PRIORITY, func=runs_on_relay, backend=backend, queue_name=queue_name,
               run_after=None, takes_context=False, task_type=task_type)


_STATUS = {
    "unsent": TaskResultStatus.READY, "pending": TaskResultStatus.READY, "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING, "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED, "cancelled": TaskResultStatus.FAILED, "refused": TaskResultStatus.FAILED,
}


class RelayBackend(BaseTaskBackend):
    task_class = RelayTask
    supports_defer = True
    supports_get_result = True

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not isinstance(task, RelayTask) or not task.task_type:
            raise InvalidTask("the Relay backend runs Relay task types: declare them with relay_task(\"type\")")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the outbox row in the current transaction; post it once that commits."""
        self.validate_task(task)
        assert isinstance(task, RelayTask)
        if args:
            raise InvalidTask("Relay tasks take their parameters as keyword arguments")
        db = conf.database()
        row = RelayJob(task_type=task.task_type, params=normalize_json(dict(kwargs)), run_at=task.run_after)
        row.correlation_id = current_correlation() or str(row.id)
        row.save(using=db, force_insert=True)
        from .outbox import post
        transaction.on_commit(partial(post, row.id), using=db, robust=True)
        return self._result(row, task)

    def get_result(self, result_id: str) -> TaskResult:
        """The job's state as the projection holds it (``refresh`` asks Relay first)."""
        try:
            row = RelayJob.objects.using(conf.database()).get(pk=result_id)
        except (RelayJob.DoesNotExist, ValidationError, ValueError) as e:  # unknown or not a UUID
            raise TaskResultDoesNotExist(result_id) from e
        task = self.task_class(priority=DEFAULT_TASK_PRIORITY, func=runs_on_relay, backend=self.alias,
                               queue_name="default", run_after=row.run_at, task_type=row.task_type)
        return self._result(row, task)

    def _result(self, row: RelayJob, task: Task) -> TaskResult:
        errors = []
        if row.status in ("failed", "cancelled", "refused"):
            errors.append(TaskError(exception_class_path="relay_client.errors.RelayError",
                                    traceback=row.last_error or row.post_error or row.status))
        result: TaskResult = TaskResult(
            task=task, id=str(row.id), status=_STATUS.get(row.status, TaskResultStatus.READY),
            enqueued_at=row.created_at, started_at=None, finished_at=row.finished_at,
            last_attempted_at=None, args=[], kwargs=row.params, backend=self.alias,
            errors=errors, worker_ids=[],
        )
        object.__setattr__(result, "_return_value", row.result)
        return result
