"""Relay's client for Python: the job API and the tenant's templates, campaign pages,
destinations, suppressions and callback settings (``RelayClient``), and its typed errors.

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
from .resources import MAX_PAGE, Destination, PageReceipt, Suppression, SuppressionPage, Template

__all__ = [
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_PAGE",
    "Destination",
    "PageReceipt",
    "Suppression",
    "SuppressionPage",
    "Template",
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
