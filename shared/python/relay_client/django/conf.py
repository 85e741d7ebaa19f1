"""The ``RELAY`` setting.

``URL`` and ``API_KEY`` reach Relay; ``SIGNING_SECRETS`` (a list: during a rotation, the new
and the old ``whsec_`` secret) verify callbacks; ``STATUS_KEYS`` are the bearer keys that may
read the status view; ``PROJECT`` names the project in its status document; ``CALLBACK_URL``
(optional) is sent with each job instead of the tenant's callback URL; ``DATABASE`` is the alias
holding the outbox (default ``"default"``); ``SCHEDULES`` lists local periodic tasks,
``[{"name", "cron", "task"}]`` with ``task`` the task's module path, fired by ``relay_worker``;
``STATUS_SOURCES`` names the local work the status view reports (``"django_tasks_db"``,
``"django_q"``; default: each whose app is installed).

Bounds: the rows one transaction enqueued are posted together once it commits, in batch
requests, on a thread. ``POST_IN_BACKGROUND`` (default True): the commit does not wait for that
post at all; False: it waits at most ``POST_TIMEOUT`` for the whole post, however many rows.
``POST_TIMEOUT`` 0 posts nothing at commit (the worker's drain posts). ``TIMEOUT`` (seconds,
default 10) bounds each network wait of that post (one attempt: what fails is the drain's), of
the drain, reconcile and refresh; ``MAX_BODY_BYTES`` is the largest batch body sent.
``VALIDATE`` (default True) checks parameters against the task's published schema at
``.enqueue()``; that catalogue is fetched at start-up on a thread, ``CATALOGUE_TTL`` (default
300 s) is how long it is trusted before a refresh on a thread, ``CATALOGUE_TIMEOUT`` (default
1 s) bounds its fetch (tried at most once a minute while Relay cannot be reached).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..client import MAX_BODY_BYTES, RelayClient

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "TIMEOUT": 10.0,
    "POST_TIMEOUT": 2.0,
    "POST_IN_BACKGROUND": True,
    "MAX_BODY_BYTES": MAX_BODY_BYTES - 4096,
    "VALIDATE": True,
    "CATALOGUE_TTL": 300.0,
    "CATALOGUE_TIMEOUT": 1.0,
}


def _relay() -> dict[str, Any]:
    value = getattr(settings, "RELAY", None)
    if not isinstance(value, dict):
        raise ImproperlyConfigured("settings.RELAY must be a dict (see relay_client.django.conf)")
    return value


def settings_or_none() -> dict[str, Any] | None:
    """The ``RELAY`` setting, or None when it is not a dict."""
    value = getattr(settings, "RELAY", None)
    return value if isinstance(value, dict) else None


def get(name: str, default: Any = None) -> Any:
    return _relay().get(name, DEFAULTS.get(name, default))


def required(name: str) -> Any:
    value = _relay().get(name)
    if not value:
        raise ImproperlyConfigured(f"settings.RELAY[{name!r}] is not set")
    return value


def client(*, timeout: float | None = None, attempts: int = 4) -> RelayClient:
    """A client for the drain, reconcile and refresh (``TIMEOUT``), or for a bounded call."""
    t = float(get("TIMEOUT")) if timeout is None else timeout
    return RelayClient(required("URL"), required("API_KEY"), timeout=t, attempts=attempts)


def post_timeout() -> float:
    return max(float(get("POST_TIMEOUT")), 0.0)


def database() -> str:
    return str(get("DATABASE"))


def signing_secrets() -> list[str]:
    secrets = get("SIGNING_SECRETS") or []
    return [secrets] if isinstance(secrets, str) else list(secrets)


def status_keys() -> list[str]:
    keys = get("STATUS_KEYS") or []
    return [keys] if isinstance(keys, str) else list(keys)
