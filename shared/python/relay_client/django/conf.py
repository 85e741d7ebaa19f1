"""The ``RELAY`` setting.

``URL`` and ``API_KEY`` reach Relay; ``SIGNING_SECRETS`` (a list: during a rotation, the new
and the old ``whsec_`` secret) verify callbacks; ``STATUS_KEYS`` are the bearer keys that may
read the status view; ``PROJECT`` names the project in its status document; ``CALLBACK_URL``
(optional) is sent with each job instead of the tenant's callback URL; ``DATABASE`` is the alias
holding the outbox (default ``"default"``); ``SCHEDULES`` lists local periodic tasks the project
declares, ``[{"name", "cron", "task"}]`` with ``task`` the task's module path.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..client import RelayClient


def _relay() -> dict[str, Any]:
    value = getattr(settings, "RELAY", None)
    if not isinstance(value, dict):
        raise ImproperlyConfigured("settings.RELAY must be a dict (see relay_client.django.conf)")
    return value


def get(name: str, default: Any = None) -> Any:
    return _relay().get(name, default)


def required(name: str) -> Any:
    value = _relay().get(name)
    if not value:
        raise ImproperlyConfigured(f"settings.RELAY[{name!r}] is not set")
    return value


def client() -> RelayClient:
    return RelayClient(required("URL"), required("API_KEY"), timeout=float(get("TIMEOUT", 10.0)))


def database() -> str:
    return str(get("DATABASE", "default"))


def signing_secrets() -> list[str]:
    secrets = get("SIGNING_SECRETS") or []
    return [secrets] if isinstance(secrets, str) else list(secrets)


def status_keys() -> list[str]:
    keys = get("STATUS_KEYS") or []
    return [keys] if isinstance(keys, str) else list(keys)
