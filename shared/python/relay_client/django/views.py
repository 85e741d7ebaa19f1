"""The callback receiver and the status view. Mount them with
``path("relay/", include("relay_client.django.urls"))``."""

from __future__ import annotations

import hmac
import logging
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from standardwebhooks import Webhook

from ..client import Job
from . import conf
from .outbox import apply

log = logging.getLogger("relay_client")


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def verify(body: bytes, headers: dict[str, str]) -> Any:
    """The payload when any configured secret verifies the Standard Webhooks signature, else None.

    During a rotation Relay signs with the old and the new secret and this side may hold
    either or both, so a callback verifies on any secret in ``SIGNING_SECRETS``.
    """
    for secret in conf.signing_secrets():
        try:
            return Webhook(secret).verify(body, headers)
        except Exception:  # a wrong secret, a malformed header, an old timestamp: try the next
            continue
    return None


@csrf_exempt
@require_POST
def callback(request: HttpRequest) -> JsonResponse:
    """A signed callback from Relay: verify, then apply the job resource if it is newer."""
    headers = {k: request.headers.get(k, "") for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    payload = verify(request.body, headers)
    if payload is None:
        log.warning("relay callback %s refused: no signing secret verifies it", headers["webhook-id"])
        return _error(400, "bad_signature", "the webhook signature does not verify")
    data = payload.get("data") if isinstance(payload, dict) else None
    try:
        job = Job.from_json(data) if isinstance(data, dict) else None
    except (KeyError, TypeError, ValueError):
        job = None
    if job is None:
        return _error(400, "invalid_payload", "a callback's data must be a job resource")
    applied = apply(job)
    return JsonResponse({"applied": applied})


@require_GET
def status(request: HttpRequest) -> JsonResponse:
    """``relay.status/v1`` for the project's local work; needs ``Authorization: Bearer <status key>``."""
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    keys = conf.status_keys()
    if not given or not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        return _error(401, "unauthorized", "missing or wrong status key (Authorization: Bearer <key>)")
    from .status import document
    return JsonResponse(document())
