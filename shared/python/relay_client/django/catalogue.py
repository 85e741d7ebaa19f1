"""Relay's catalogue (``GET /v1/tasks``), so ``.enqueue()`` refuses what Relay would refuse.

Each task's published schema carries the rules Relay's own checks apply at intake (addresses,
lengths, template names, enum values: written by the task beside its check, ``Task::schema_rules``
in Relay) and, for email, the tenant's sending identities on ``from``; formats are asserted.

The document is fetched ahead of time, on a thread (``prefetch``: at start-up and by
``relay_worker``), and refreshed on a thread once older than ``CATALOGUE_TTL`` seconds, so a
request does not wait for it; its ``version`` is the SHA-256 of the document, logged when it
changes. When Relay refuses a row the cache let
through (``unknown_task_type``, ``invalid_params``), the cache is dropped: the catalogue changed.
The fetch is bounded (``CATALOGUE_TIMEOUT``, default 1 s, one attempt); an enqueue waits for it
only when the process has no copy at all. When Relay cannot be asked the enqueue goes ahead
unchecked (Relay checks at the post) and the fetch is not tried again for a minute, so an
unreachable Relay costs a request nothing more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from . import conf
from ._compat import InvalidTask

log = logging.getLogger("relay_client")

#: After a failed fetch, how long enqueues go unchecked before the next try.
RETRY_AFTER = 60.0


class InvalidParams(ValidationError):
    """Parameters the task's published schema refuses, by field (``error.message_dict``)."""

    def __init__(self, task_type: str, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.task_type = task_type

    def __str__(self) -> str:
        fields = "; ".join(f"{k}: {', '.join(v)}" for k, v in self.message_dict.items())
        return f"{self.task_type}: {fields}"


@dataclass
class Catalogue:
    version: str
    fetched_at: float
    schemas: dict[str, dict[str, Any]]
    _validators: dict[str, Validator] = field(default_factory=dict)

    def validator(self, task_type: str) -> Validator:
        if task_type not in self._validators:
            schema = self.schemas[task_type]
            cls = validator_for(schema, default=Draft202012Validator)
            # Formats are rules too (`format: email`: an address has an "@").
            self._validators[task_type] = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return self._validators[task_type]


_lock = threading.Lock()
_cached: Catalogue | None = None
_failed_until = 0.0
#: Set when the fetch under way ends; None while none is.
_fetching: threading.Event | None = None
#: Bumped by ``invalidate``: a fetch started before it does not store its answer.
_generation = 0


def _forget_in_flight() -> None:
    """In a forked child (a pre-forking server), the parent's fetch thread does not exist."""
    global _lock, _fetching
    _lock = threading.Lock()
    _fetching = None


os.register_at_fork(after_in_child=_forget_in_flight)


def invalidate() -> None:
    """Forget the cached document: the next enqueue fetches it again."""
    global _cached, _failed_until, _fetching, _generation
    with _lock:
        _cached, _failed_until, _fetching = None, 0.0, None
        _generation += 1


def prefetch() -> threading.Event:
    """Fetch the catalogue on a thread now, so that no request waits for it: called at start-up
    (``AppConfig.ready``, when ``URL`` and ``API_KEY`` are set) and by ``relay_worker``. Returns
    an event set when the fetch ends."""
    with _lock:
        return _start()


def _start() -> threading.Event:
    """The fetch under way, or a new one on a thread (call with ``_lock`` held)."""
    global _fetching
    if _fetching is None:
        _fetching = threading.Event()
        threading.Thread(target=_fetch, args=(_fetching, _generation), name="relay-catalogue", daemon=True).start()
    return _fetching


def _fetch(done: threading.Event, generation: int) -> None:
    global _cached, _failed_until, _fetching
    try:
        with conf.client(timeout=float(conf.get("CATALOGUE_TIMEOUT")), attempts=1) as client:
            tasks = client.tasks()
    except Exception as e:  # unreachable, refused, or not configured: enqueues go unchecked a while
        log.warning("relay catalogue unavailable, enqueues go unchecked for %.0fs: %s", RETRY_AFTER, e)
        with _lock:
            if generation == _generation:
                _failed_until = time.monotonic() + RETRY_AFTER
    else:
        version = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
        with _lock:
            if generation == _generation:
                if _cached is None or _cached.version != version:
                    names = ", ".join(sorted(t["name"] for t in tasks))
                    log.info("relay catalogue version %s: %s", version[:12], names)
                schemas = {t["name"]: t.get("params_schema") or {} for t in tasks}
                _cached = Catalogue(version, time.monotonic(), schemas)
    finally:
        with _lock:
            if _fetching is done:
                _fetching = None
        done.set()


def current(*, max_age: float | None = None, wait: bool = False) -> Catalogue | None:
    """The catalogue; None when Relay could not be asked.

    A copy older than ``max_age`` (default ``CATALOGUE_TTL``) is refreshed on a thread and used
    meanwhile (``wait``: the refreshed one, waited for). With no copy at all (no prefetch, or it
    failed over a minute ago) the fetch is waited for at most ``CATALOGUE_TIMEOUT``: once per
    process, the enqueue's cost counted against its commit's bound.
    """
    ttl = float(conf.get("CATALOGUE_TTL")) if max_age is None else max_age
    with _lock:
        cached = _cached
        if cached is not None and time.monotonic() - cached.fetched_at < ttl:
            return cached
        if time.monotonic() < _failed_until:
            return cached
        done = _start()
        if cached is not None and not wait:
            return cached
    done.wait(float(conf.get("CATALOGUE_TIMEOUT")) + 0.1)
    return _cached


def check(task_type: str, params: dict[str, Any]) -> None:
    """Raise ``InvalidTask`` for a type Relay does not offer, ``InvalidParams`` for parameters its
    schema refuses; pass when the catalogue cannot be had."""
    cat = current()
    if cat is not None and task_type not in cat.schemas:
        cat = current(max_age=5.0, wait=True)  # perhaps added since the last fetch
    if cat is None:
        return
    if task_type not in cat.schemas:
        raise InvalidTask(f"Relay has no task type {task_type!r}; it offers {', '.join(sorted(cat.schemas))}")
    errors: dict[str, list[str]] = {}
    for e in cat.validator(task_type).iter_errors(params):
        for name, message in _fields(e):
            errors.setdefault(name, []).append(message)
    if errors:
        raise InvalidParams(task_type, errors)


def _fields(e: SchemaError) -> list[tuple[str, str]]:
    """(field, message) for one schema error, named the way Relay names them (``to[0]``)."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path).lstrip(".")
    instance = e.instance if isinstance(e.instance, dict) else {}
    prefix = f"{path}." if path else ""
    if e.validator == "required" and isinstance(e.validator_value, list):
        return [(f"{prefix}{r}", "this field is required") for r in e.validator_value if r not in instance]
    if e.validator == "additionalProperties" and isinstance(e.schema, dict):
        known = set(e.schema.get("properties", {}))
        return [(f"{prefix}{k}", "this task takes no such parameter") for k in instance if k not in known]
    if e.validator == "format" and e.validator_value == "email":
        return [(path or NON_FIELD_ERRORS, f"{e.instance!r} is not an email address")]
    if e.validator in ("maxItems", "minItems") and isinstance(e.instance, list):
        # jsonschema's own message repeats the whole list (51 addresses for one number).
        bound = "at most" if e.validator == "maxItems" else "at least"
        return [(path or NON_FIELD_ERRORS, f"{len(e.instance)} items: {bound} {e.validator_value}")]
    described = e.schema.get("description") if isinstance(e.schema, dict) else None
    if e.validator == "pattern" and isinstance(described, str) and "sending identities:" in described:
        identities = described.rsplit("sending identities:", 1)[1].strip().rstrip(".")
        return [(path, f"{e.instance!r} is not at one of this tenant's sending identities ({identities})")]
    return [(path or NON_FIELD_ERRORS, e.message)]
