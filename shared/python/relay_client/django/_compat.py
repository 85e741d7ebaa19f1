"""The ``django.tasks`` API on either Django: built in from Django 6.0, or the ``django-tasks``
backport on Django 5.2 LTS (``pip install "relay-client[django52]"``). Everything else in the
package imports these names from here."""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("django.tasks") is not None:
    from django.tasks import TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.dummy import DummyBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json
else:  # Django 5.2 with the backport
    from django_tasks import TaskResult, TaskResultStatus, task, task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.backends.dummy import DummyBackend  # type: ignore[no-redef]
    from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued  # type: ignore[no-redef]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "BaseTaskBackend",
    "DummyBackend",
    "InvalidTask",
    "Task",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
]
