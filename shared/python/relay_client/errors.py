"""Relay's error answers as typed exceptions.

Every error Relay gives is ``{"error": {"code", "message", ...details}}`` with a stable
``code`` (``shared/core/src/api/error.rs`` and the handlers). ``error_for`` picks the class by
code first, then by HTTP status.
"""

from __future__ import annotations

from typing import Any


class RelayError(Exception):
    """An error answer from Relay, or no answer at all (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}

    @property
    def field(self) -> str | None:
        """The request field at fault, when Relay names one."""
        f = self.details.get("field")
        return f if isinstance(f, str) else None


class TransportError(RelayError):
    """No answer: connection refused, timed out (after the client's retries)."""


class BadRequest(RelayError):
    """400: an unreadable body or query (``invalid_query``, ``unreadable_body``, ...)."""


class Unauthorized(RelayError):
    """401: a missing or wrong API key."""


class Forbidden(RelayError):
    """403: the key is valid but may not do this (e.g. a platform-only task type)."""


class NotFound(RelayError):
    """404: no such job (another tenant's job answers the same)."""


class Conflict(RelayError):
    """409: e.g. ``not_cancellable``, or ``retry`` (a row changed while the request ran)."""


class PayloadTooLarge(RelayError):
    """413: ``body_too_large``."""


class InvalidRequest(RelayError):
    """422: the request was read but refused (``unknown_task_type``, ``invalid_params``, ``invalid_field``, ...)."""


class IdempotencyKeyReused(InvalidRequest):
    """422 ``idempotency_key_reused``: the key was used for a different request.

    ``job_id`` names the job the key belongs to.
    """

    @property
    def job_id(self) -> str | None:
        v = self.details.get("job_id")
        return v if isinstance(v, str) else None


class RateLimited(RelayError):
    """429 ``rate_limited``: over the tenant's rate; ``retry_after`` in seconds when given."""

    retry_after: float | None = None


class Unavailable(RelayError):
    """503 ``unavailable``: the database is unavailable; retry shortly."""


class ServerError(RelayError):
    """500 ``internal``: a bug in Relay."""


_BY_CODE: dict[str, type[RelayError]] = {
    "idempotency_key_reused": IdempotencyKeyReused,
    "rate_limited": RateLimited,
    "unavailable": Unavailable,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
}

_BY_STATUS: dict[int, type[RelayError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}


def error_for(status: int, body: Any, retry_after: str | None = None) -> RelayError:
    """The exception for one error answer (``body`` is the parsed JSON, or anything else)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"code": "unexpected", "message": f"HTTP {status} without Relay's error body"}
    details = {k: v for k, v in err.items() if k not in ("code", "message")}
    code = str(err.get("code", "unexpected"))
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else RelayError)
    exc = cls(status, code, str(err.get("message", "")), details)
    if isinstance(exc, RateLimited) and retry_after:
        try:
            exc.retry_after = float(retry_after)
        except ValueError:
            pass
    return exc
