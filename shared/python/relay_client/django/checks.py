"""System checks for the ``RELAY`` setting (``manage.py check``, and before ``runserver`` and
``migrate``): a missing key or a malformed URL fails the deployment, not every commit later."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from . import schedules

HINT = "see relay_client.django.conf, or the package README's Settings"


@register("relay")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    relay = getattr(settings, "RELAY", None)
    if not isinstance(relay, dict):
        return [Error("settings.RELAY is missing or not a dict", hint=HINT, id="relay.E001")]
    out: list[CheckMessage] = []
    url = relay.get("URL")
    parsed = urlparse(url) if isinstance(url, str) else None
    if not parsed or parsed.scheme not in ("http", "https") or not parsed.netloc:
        out.append(Error(f"RELAY['URL'] must be Relay's http(s) base URL, not {url!r}", hint=HINT, id="relay.E002"))
    key = relay.get("API_KEY")
    if not isinstance(key, str) or not key.strip():
        out.append(
            Error(
                "RELAY['API_KEY'] is empty: every post to Relay would be refused",
                hint="the tenant's API key (relay dev prints it at start)",
                id="relay.E003",
            )
        )
    elif key != key.strip():
        out.append(Error("RELAY['API_KEY'] has surrounding whitespace", id="relay.E003"))
    secrets = relay.get("SIGNING_SECRETS") or []
    for s in [secrets] if isinstance(secrets, str) else secrets:
        if not isinstance(s, str) or not s.startswith("whsec_"):
            out.append(
                Error(
                    "each RELAY['SIGNING_SECRETS'] entry is a 'whsec_...' secret from PUT /v1/callbacks",
                    id="relay.E004",
                )
            )
    for name in ("POST_TIMEOUT", "TIMEOUT", "CATALOGUE_TTL", "CATALOGUE_TIMEOUT"):
        value = relay.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            out.append(Error(f"RELAY[{name!r}] must be a number of seconds, not {value!r}", id="relay.E005"))
    for i, entry in enumerate(relay.get("SCHEDULES") or []):
        for problem in schedules.problems(entry):
            out.append(Error(f"RELAY['SCHEDULES'][{i}] {problem}", id="relay.E006"))
    out += _local_work(relay)
    out += _status_sources(relay.get("STATUS_SOURCES"))
    backends = [v.get("BACKEND", "") for v in (getattr(settings, "TASKS", None) or {}).values()]
    if not any(b.endswith("RelayBackend") for b in backends):
        out.append(
            Warning(
                "no TASKS entry uses relay_client.django.backend.RelayBackend: relay_task(...) enqueues go nowhere",
                id="relay.W001",
            )
        )
    return out


def _local_work(relay: dict[str, Any]) -> list[CheckMessage]:
    """Local tasks' attempts and backoff, the heartbeat and the worker kinds a deploy waits for."""
    from . import heartbeats

    out: list[CheckMessage] = []
    attempts = relay.get("TASK_ATTEMPTS", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        out.append(
            Error(f"RELAY['TASK_ATTEMPTS'] must be a whole number of at least 1, not {attempts!r}", id="relay.E008")
        )
    numbers = {"TASK_BACKOFF": 60.0, "HEARTBEAT_SECONDS": 10.0, "WORKER_STALE_SECONDS": 60.0}
    for name, default in numbers.items():
        value = relay.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            out.append(Error(f"RELAY[{name!r}] must be a number of seconds, not {value!r}", id="relay.E008"))
    beat, stale = relay.get("HEARTBEAT_SECONDS", 10.0), relay.get("WORKER_STALE_SECONDS", 60.0)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (beat, stale)) and stale < 3 * beat:
        out.append(
            Error(
                "RELAY['WORKER_STALE_SECONDS'] must be at least 3 heartbeats: a live worker's tasks would be recovered",
                id="relay.E008",
            )
        )
    kinds = relay.get("WORKERS", [heartbeats.RELAY_WORKER])
    known = (heartbeats.RELAY_WORKER, heartbeats.TASKS_WORKER)
    for kind in [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list | tuple) else [kinds]:
        if kind not in known:
            out.append(
                Error(f"RELAY['WORKERS'] names {kind!r}, which beats no heartbeat (known: {known})", id="relay.E009")
            )
    return out


def _status_sources(chosen: Any) -> list[CheckMessage]:
    """``STATUS_SOURCES``: known names whose apps are installed (unset: each installed one)."""
    from django.apps import apps

    from .status import SOURCES

    if chosen is None:
        return []
    names = [chosen] if isinstance(chosen, str) else chosen
    if not isinstance(names, list | tuple):
        return [Error(f"RELAY['STATUS_SOURCES'] must be a list of source names, not {chosen!r}", id="relay.E007")]
    out: list[CheckMessage] = []
    for name in names:
        if name not in SOURCES:
            out.append(
                Error(
                    f"RELAY['STATUS_SOURCES'] names {name!r}, which is no source of local work",
                    hint=f"known: {', '.join(sorted(SOURCES))}",
                    id="relay.E007",
                )
            )
        elif not apps.is_installed(name):
            out.append(
                Error(f"RELAY['STATUS_SOURCES'] names {name!r}, whose app is not in INSTALLED_APPS", id="relay.E007")
            )
    return out
