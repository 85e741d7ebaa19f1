"""For a project's own tests: record what was enqueued on Relay instead of writing or posting it.

    from relay_client.testing import relay_enqueues

    def test_an_order_sends_its_confirmation(client):
        with relay_enqueues() as relay:
            client.post("/orders", {"email": "a@example.com"}, content_type="application/json")
        relay.assert_enqueued("email.send", to=["a@example.com"])

Inside the block ``TASKS["relay"]`` (or ``alias``) is ``RecordingBackend``, Django's
``DummyBackend`` with result ids shaped as ``RelayBackend``'s (UUIDs: a model field that keeps
``result.id`` takes them): each ``.enqueue()`` is kept as a ``TaskResult`` (status ``READY``),
nothing reaches the outbox or Relay, and nothing needs a Relay to run. Django's
``ImmediateBackend`` cannot stand in for Relay: it would run the task's function here, and a
Relay task's work is Relay's (``.enqueue()`` refuses it by name).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.test import override_settings

from .django._compat import DummyBackend, InvalidTask, Task, TaskResult, task_backends


class RecordingBackend(DummyBackend):
    """``DummyBackend`` whose result ids are UUIDs, as ``RelayBackend``'s are, and which refuses
    positional arguments, as ``RelayBackend`` does (a job's parameters are named)."""

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        if args:
            raise InvalidTask("Relay tasks take their parameters as keyword arguments")
        result: TaskResult = super().enqueue(task, args, kwargs)  # type: ignore[type-arg]
        new_id = str(uuid.uuid4())
        object.__setattr__(self.results[-1], "id", new_id)
        object.__setattr__(result, "id", new_id)
        return result


RECORDING = f"{RecordingBackend.__module__}.{RecordingBackend.__name__}"


@dataclass
class Enqueued:
    """What the block enqueued on Relay, in order (readable after the block too)."""

    backend: RecordingBackend

    @property
    def results(self) -> list[TaskResult]:  # type: ignore[type-arg]
        return list(self.backend.results)

    def of(self, task_type: str) -> list[TaskResult]:  # type: ignore[type-arg]
        """The enqueues of one task type (``"email.send"``)."""
        return [r for r in self.results if r.task.name == task_type]

    def assert_enqueued(self, task_type: str, **params: Any) -> TaskResult:  # type: ignore[type-arg]
        """The one enqueue of ``task_type`` whose parameters include ``params`` (each equal);
        AssertionError, listing what was enqueued, when there is none or more than one."""
        found = [r for r in self.of(task_type) if all(k in r.kwargs and r.kwargs[k] == v for k, v in params.items())]
        if len(found) != 1:
            seen = [(r.task.name, r.kwargs) for r in self.results]
            raise AssertionError(f"{len(found)} enqueues of {task_type} with {params!r}; enqueued: {seen!r}")
        return found[0]

    def assert_nothing_enqueued(self) -> None:
        if self.results:
            raise AssertionError(f"enqueued: {[(r.task.name, r.kwargs) for r in self.results]!r}")


@contextmanager
def relay_enqueues(alias: str = "relay") -> Iterator[Enqueued]:
    """Record every enqueue on the ``alias`` backend inside the block (see the module)."""
    tasks = {**getattr(settings, "TASKS", {}), alias: {"BACKEND": RECORDING}}
    with override_settings(TASKS=tasks):
        backend = task_backends[alias]
        assert isinstance(backend, RecordingBackend)
        backend.clear()
        yield Enqueued(backend)
