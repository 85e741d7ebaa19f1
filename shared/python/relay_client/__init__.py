"""Relay's client for Python: the job API (``RelayClient``) and its typed errors.

The Django integration (``django.tasks`` backend, outbox, callbacks, projection, status
collector) is ``relay_client.django``.
"""

from .client import MAX_BATCH, MAX_BODY_BYTES, TERMINAL, BatchResult, Job, JobPage, JobRequest, RelayClient
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RelayError,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "TERMINAL",
    "BatchResult",
    "Job",
    "JobPage",
    "JobRequest",
    "RelayClient",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "RelayError",
    "ServerError",
    "TransportError",
    "Unauthorized",
    "Unavailable",
]
