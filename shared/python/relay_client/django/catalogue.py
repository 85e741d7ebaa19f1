"""Relay's catalogue (``GET /v1/tasks``), so ``.enqueue()`` refuses what Relay would refuse.

The document is fetched on first use and kept ``CATALOGUE_TTL`` seconds; its ``version`` is
the SHA-256 of the document, logged when it changes. When Relay refuses a row the cache let
through (``unknown_task_type``, ``invalid_params``), the cache is dropped: the catalogue changed.
The fetch is bounded (``CATALOGUE_TIMEOUT``, default 1 s, one attempt); when Relay cannot be asked
the enqueue goes ahead unchecked (Relay checks at the post) and the fetch is not tried again
for a minute, so an unreachable Relay costs a request nothing more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from ..errors import RelayError
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
            self._validators[task_type] = cls(schema)
        return self._validators[task_type]


_lock = threading.Lock()
_cached: Catalogue | None = None
_failed_until = 0.0


def invalidate() -> None:
    """Forget the cached document: the next enqueue fetches it again."""
    global _cached, _failed_until
    with _lock:
        _cached, _failed_until = None, 0.0


def current(*, max_age: float | None = None) -> Catalogue | None:
    """The catalogue, fetched when missing or older than ``max_age`` (default ``CATALOGUE_TTL``);
    None when Relay cannot be asked now."""
    global _cached, _failed_until
    ttl = float(conf.get("CATALOGUE_TTL")) if max_age is None else max_age
    with _lock:
        now = time.monotonic()
        if _cached is not None and now - _cached.fetched_at < ttl:
            return _cached
        if now < _failed_until:
            return _cached
        budget = float(conf.get("CATALOGUE_TIMEOUT"))
        try:
            with conf.client(timeout=budget, attempts=1) as client:
                tasks = client.tasks()
        except RelayError as e:
            log.warning("relay catalogue unavailable, enqueues go unchecked for %.0fs: %s", RETRY_AFTER, e)
            _failed_until = now + RETRY_AFTER
            return _cached
        version = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
        if _cached is None or _cached.version != version:
            log.info("relay catalogue version %s: %s", version[:12], ", ".join(sorted(t["name"] for t in tasks)))
        _cached = Catalogue(version, now, {t["name"]: t.get("params_schema") or {} for t in tasks})
        return _cached


def check(task_type: str, params: dict[str, Any]) -> None:
    """Raise ``InvalidTask`` for a type Relay does not offer, ``InvalidParams`` for parameters its
    schema refuses; pass when the catalogue cannot be had."""
    cat = current()
    if cat is not None and task_type not in cat.schemas:
        cat = current(max_age=5.0)  # perhaps added since the last fetch
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
    return [(path or NON_FIELD_ERRORS, e.message)]
