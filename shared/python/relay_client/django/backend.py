"""The ``django.tasks`` backend for Relay's task types.

``TASKS = {"relay": {"BACKEND": "relay_client.django.backend.RelayBackend"}}`` next to the
project's local backend; then ``email_send = relay_task("email.send")`` and
``email_send.enqueue(to=[...], subject=...)`` like any task. Parameters are keyword arguments
(they become the job's ``params``) and are checked against the task's published schema before
the row is written. ``.using(run_after=..., max_attempts=..., timeout_seconds=...,
concurrency_key=..., concurrency_limit=..., ordering_key=..., ordering_on_failure=...,
idempotency_key=..., after=[...])`` sets the job's options for one call; ``relay_task(...)`` takes
the same options (but ``after`` and ``ordering_key``) for every call. Jobs with one
``ordering_key`` start on Relay in the order their rows were written, one at a time.
``after`` names the jobs this one runs after: results of other Relay tasks (``result.id``: the
row is posted once theirs has a Relay job) or Relay job ids.

A ``relay_task`` is a plain ``Task``: with ``TASKS["relay"]`` set to Django's ``DummyBackend``
(tests), enqueues are recorded there and nothing reaches the outbox or Relay.
"""

from __future__ import annotations

import time
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction

from ..errors import IdempotencyKeyReused
from . import catalogue, conf
from ._compat import (
    DEFAULT_TASK_PRIORITY,
    BaseTaskBackend,
    DummyBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .context import current_correlation
from .models import RelayJob

#: The job options a task or a call may set (``JobRequest``'s fields of the same names).
OPTIONS = (
    "max_attempts",
    "timeout_seconds",
    "concurrency_key",
    "concurrency_limit",
    "after",
    "ordering_key",
    "ordering_on_failure",
)
#: What a job's failure does to the jobs behind it on its ordering key.
ON_FAILURE = ("hold", "cancel")
#: Most jobs one job runs after (Relay's bound).
MAX_AFTER = 100


def runs_on_relay(**params: Any) -> None:
    """The function every Relay task stands for: the work itself runs on Relay, never here."""
    raise RuntimeError("a Relay task runs on Relay: enqueue it, do not call it")


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayTask(Task):  # type: ignore[type-arg]
    """A task named by its Relay task type, with the job options it is enqueued with."""

    task_type: str = ""
    max_attempts: int | None = None
    timeout_seconds: int | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: The caller's own idempotency key (per call: ``.using(idempotency_key=...)``).
    idempotency_key: str | None = None
    #: The jobs this one runs after (per call): ``TaskResult`` ids of Relay tasks or Relay job ids.
    after: tuple[str, ...] | None = None
    #: FIFO per key (per call): Relay starts this tenant's jobs with one key in submission order.
    ordering_key: str | None = None
    #: ``"hold"`` (Relay's default) or ``"cancel"``: what this job's failure does to those behind it.
    ordering_on_failure: str | None = None

    @property
    def name(self) -> str:
        return self.task_type

    @property
    def module_path(self) -> str:
        return f"relay:{self.task_type}"

    def __post_init__(self) -> None:
        self.check_backend()
        Task.__post_init__(self)

    def check_backend(self) -> None:
        """A Relay task runs on Relay: refuse, by name, a backend that would run it here or store
        it for a local worker (``ImmediateBackend``, django-tasks-db...). ``DummyBackend`` (tests)
        records it."""
        backend = self.get_backend()
        if not isinstance(backend, (RelayBackend, DummyBackend)):
            raise InvalidTask(
                f"relay_task({self.task_type!r}) runs on Relay, but TASKS[{self.backend!r}] is "
                f"{type(backend).__module__}.{type(backend).__name__}: give relay_task the alias of a RelayBackend "
                '(backend="relay", the default), or, in tests, use relay_client.testing.relay_enqueues()'
            )

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        self.check_backend()  # settings may have changed since the declaration (override_settings)
        return Task.enqueue(self, *args, **kwargs)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        self.check_backend()
        return await Task.aenqueue(self, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Django pickles (and DummyBackend deep-copies) a task by its importable path; a Relay task
        # has none, but its fields say all of it.
        kwargs = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "func"}
        return (_rebuild, (kwargs,))

    def options(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in OPTIONS if getattr(self, k) is not None}
        if "after" in out:
            out["after"] = [str(a) for a in out["after"]]
        return out

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        timeout_seconds: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        idempotency_key: str | None = None,
        after: Sequence[str | uuid.UUID] | None = None,
        ordering_key: str | None = None,
        ordering_on_failure: str | None = None,
    ) -> RelayTask:
        """A copy with other defaults: Django's own, plus the job options and an idempotency key."""
        changes: dict[str, Any] = {
            k: v
            for k, v in {
                "priority": priority,
                "queue_name": queue_name,
                "run_after": run_after,
                "backend": backend,
                "max_attempts": max_attempts,
                "timeout_seconds": timeout_seconds,
                "concurrency_key": concurrency_key,
                "concurrency_limit": concurrency_limit,
                "idempotency_key": idempotency_key,
                "after": None if after is None else _after(after),
                "ordering_key": ordering_key,
                "ordering_on_failure": ordering_on_failure,
            }.items()
            if v is not None
        }
        return replace(self, **changes)

    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        result = self.get_backend().get_result(result_id)
        if not isinstance(result.task, RelayTask) or result.task.task_type != self.task_type:
            raise TaskResultMismatch(f"result {result_id} is a {result.task.name!r}, not a {self.task_type!r}")
        return result


def _after(after: Sequence[str | uuid.UUID]) -> tuple[str, ...]:
    if isinstance(after, (str, uuid.UUID)):
        raise InvalidTask("after is a list of job ids, not one id")
    return tuple(str(a) for a in after)


def _rebuild(kwargs: dict[str, Any]) -> RelayTask:
    return RelayTask(func=runs_on_relay, **kwargs)


def relay_task(
    task_type: str,
    *,
    backend: str = "relay",
    queue_name: str = "default",
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
) -> RelayTask:
    """Declare a platform task by its type: ``email_send = relay_task("email.send", max_attempts=3)``."""
    if not isinstance(task_type, str) or not task_type.strip():
        raise InvalidTask('relay_task needs a task type, e.g. relay_task("email.send")')
    return RelayTask(
        priority=DEFAULT_TASK_PRIORITY,
        func=runs_on_relay,
        backend=backend,
        queue_name=queue_name,
        run_after=None,
        takes_context=False,
        task_type=task_type,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
    )


_STATUS = {
    "unsent": TaskResultStatus.READY,
    "blocked": TaskResultStatus.READY,
    "pending": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
    "refused": TaskResultStatus.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayTaskResult(TaskResult):  # type: ignore[type-arg,misc]
    """A ``TaskResult`` whose ``refresh()`` asks Relay, not only the local row."""

    def refresh(self) -> None:
        from .outbox import refresh

        row = RelayJob.objects.using(conf.database()).filter(pk=self.id).first()
        if row is not None:
            refresh(row)
        TaskResult.refresh(self)


#: Relay's bounds on a job's terms (``shared/core/src/job/terms.rs``); a deployment may cap
#: ``timeout_seconds`` lower, which only Relay knows.
BOUNDS = {"max_attempts": 100, "timeout_seconds": 86_400, "concurrency_limit": 10_000}


def printable(value: object) -> bool:
    """1 to 200 characters, none a control character (Relay's rule for correlation ids)."""
    return isinstance(value, str) and 0 < len(value) <= 200 and not any(unicodedata.category(c) == "Cc" for c in value)


def _check_options(task: RelayTask) -> None:
    for name, most in BOUNDS.items():
        value = getattr(task, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most):
            raise InvalidTask(f"{name} must be a whole number from 1 to {most}, not {value!r}")
    if (task.concurrency_key is None) != (task.concurrency_limit is None):
        raise InvalidTask(
            "concurrency_key and concurrency_limit go together: the key names the work, the limit "
            "how many of it run at once"
        )
    if task.concurrency_key is not None and not printable(task.concurrency_key):
        raise InvalidTask(
            f"concurrency_key must be 1 to 200 characters without control characters, not {task.concurrency_key!r}"
        )
    if task.ordering_key is not None and not printable(task.ordering_key):
        raise InvalidTask(
            f"ordering_key must be 1 to 200 characters without control characters, not {task.ordering_key!r}"
        )
    if task.ordering_on_failure is not None and task.ordering_on_failure not in ON_FAILURE:
        raise InvalidTask(f"ordering_on_failure is 'hold' or 'cancel', not {task.ordering_on_failure!r}")
    if task.ordering_on_failure is not None and task.ordering_key is None:
        raise InvalidTask("ordering_on_failure goes with an ordering_key")
    if task.after is not None:
        if len(task.after) > MAX_AFTER:
            raise InvalidTask(f"a job runs after at most {MAX_AFTER} jobs, not {len(task.after)}")
        for a in task.after:
            try:
                uuid.UUID(a)
            except ValueError:
                raise InvalidTask(f"after names jobs by id (a UUID), not {a!r}") from None
    key = task.idempotency_key
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= 200 and all("!" <= c <= "~" for c in key)):
        raise InvalidTask(f"idempotency_key must be 1 to 200 visible ASCII characters, not {key!r}")
    if key is not None:
        try:
            uuid.UUID(key)
        except ValueError:
            return
        raise InvalidTask(
            "a UUID idempotency key is reserved for the outbox's own rows: give the key a "
            'prefix of your own, e.g. "order-confirmation:<id>"'
        )


def _json_params(task_type: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The parameters as JSON; a value that is not raises ``TypeError`` naming its parameter."""
    params: dict[str, Any] = {}
    for name, value in kwargs.items():
        try:
            params[name] = normalize_json(value)
        except TypeError as e:
            raise TypeError(
                f"{task_type}: parameter {name!r} is not JSON ({e}): pass str, int, float, bool, None, "
                "lists and dicts (a datetime as .isoformat(), a model instance by its pk)"
            ) from e
    return params


class RelayBackend(BaseTaskBackend):
    task_class = RelayTask
    supports_defer = True
    supports_get_result = True
    supports_priority = False

    def validate_task(self, task: Task) -> None:  # type: ignore[type-arg]
        if task.priority != DEFAULT_TASK_PRIORITY:
            raise InvalidTask(
                "Relay has no priorities (a job runs when due, in run_at order): leave priority "
                "at 0; defer with run_after, or cap a kind of work with concurrency_key"
            )
        super().validate_task(task)
        if not isinstance(task, RelayTask) or not task.task_type:
            raise InvalidTask('the Relay backend runs Relay task types: declare them with relay_task("type")')
        _check_options(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        """Check the parameters, write the outbox row in the current transaction, post it once that commits."""
        self.validate_task(task)
        assert isinstance(task, RelayTask)
        if args:
            raise InvalidTask("Relay tasks take their parameters as keyword arguments")
        params = _json_params(task.task_type, kwargs)
        started = time.monotonic()
        if conf.get("VALIDATE"):
            catalogue.check(task.task_type, params)
        waited = time.monotonic() - started
        db = conf.database()
        row = RelayJob(
            task_type=task.task_type,
            params=params,
            run_at=task.run_after,
            options=task.options(),
            idempotency_key=task.idempotency_key,
        )
        row.correlation_id = current_correlation() or str(row.id)
        if not printable(row.correlation_id):
            raise InvalidTask(
                f"a correlation id is 1 to 200 characters without control characters, not {row.correlation_id!r}"
            )
        from .commit import enqueued
        from .outbox import request_size

        limit = int(conf.get("MAX_BODY_BYTES"))
        if (size := request_size(row)) > limit:
            raise catalogue.InvalidParams(
                task.task_type, {NON_FIELD_ERRORS: [f"the job request is {size} bytes: Relay takes at most {limit}"]}
            )
        if task.idempotency_key is None:
            row.save(using=db, force_insert=True)
        else:
            existing = self._insert_keyed(row, db)
            if existing is not None:  # the same request enqueued again: the same row
                return self._result(existing, task)
        enqueued(row.id, db, waited=waited)
        result = self._result(row, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _insert_keyed(self, row: RelayJob, db: str) -> RelayJob | None:
        """Insert a row with the caller's key, or return the row that already holds the key for the
        same request; another request with the same key raises ``IdempotencyKeyReused``."""
        try:
            with transaction.atomic(using=db):
                row.save(using=db, force_insert=True)
            return None
        except IntegrityError:
            existing = RelayJob.objects.using(db).get(idempotency_key=row.idempotency_key)
        same = (existing.task_type, existing.params, existing.options, existing.run_at) == (
            row.task_type,
            row.params,
            row.options,
            row.run_at,
        )
        if not same and existing.status == "refused":
            # Relay refused that request, so it made no job under the key: the corrected request
            # takes the key over; the refused row stays, keyed by its own id, with its reason.
            RelayJob.objects.using(db).filter(pk=existing.pk, status="refused").update(
                idempotency_key=None,
                post_error=f"{existing.post_error} (key {row.idempotency_key!r} later given to row {row.pk})",
            )
            with transaction.atomic(using=db):
                row.save(using=db, force_insert=True)
            return None
        if not same:
            raise IdempotencyKeyReused(
                422,
                "idempotency_key_reused",
                f"idempotency key {row.idempotency_key!r} was already used by outbox row "
                f"{existing.pk} for a different request",
                {"job_id": str(existing.pk)},
            )
        return existing

    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        """The job's state as the projection holds it (``result.refresh()`` asks Relay first)."""
        try:
            row = RelayJob.objects.using(conf.database()).get(pk=result_id)
        except (RelayJob.DoesNotExist, ValidationError, ValueError) as e:  # unknown or not a UUID
            raise TaskResultDoesNotExist(result_id) from e
        opts = row.options or {}
        task = RelayTask(
            priority=DEFAULT_TASK_PRIORITY,
            func=runs_on_relay,
            backend=self.alias,
            queue_name="default",
            run_after=row.run_at,
            task_type=row.task_type,
            idempotency_key=row.idempotency_key,
            **{k: opts[k] for k in OPTIONS if k in opts},
        )
        return self._result(row, task)

    def _result(self, row: RelayJob, task: RelayTask) -> TaskResult:  # type: ignore[type-arg]
        errors = []
        if row.status in ("failed", "cancelled", "refused", "blocked") or row.post_code in (
            "unauthorized",
            "forbidden",
        ):
            errors.append(
                TaskError(
                    exception_class_path="relay_client.errors.RelayError",
                    traceback=row.last_error or row.post_error or row.status,
                )
            )
        result = RelayTaskResult(
            task=task,
            id=str(row.id),
            status=_STATUS.get(row.status, TaskResultStatus.READY),
            enqueued_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            last_attempted_at=row.started_at,
            args=[],
            kwargs=row.params,
            backend=self.alias,
            errors=errors,
            # Relay's attempts, one entry each (the workers' own ids are Relay's to know).
            worker_ids=["relay"] * row.attempt,
        )
        object.__setattr__(result, "_return_value", row.result)
        return result
