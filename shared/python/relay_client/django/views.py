"""The callback receiver and the status view. Mount them with
``path("relay/", include("relay_client.django.urls"))``."""

from __future__ import annotations

import hmac
import logging
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from ..client import Job
from . import conf
from .message_events import apply_message_event
from .outbox import apply

log = logging.getLogger("relay_client")


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def verify(body: bytes, headers: dict[str, str]) -> Any:
    """The payload when any configured secret verifies the Standard Webhooks signature, else None."""
    return check(body, headers)[0]


def check(body: bytes, headers: dict[str, str]) -> tuple[Any, str]:
    """``(payload, "")`` when any configured secret verifies the callback, else ``(None, code)``:
    ``stale_timestamp`` when a secret signed it but its timestamp is over 5 minutes from now (a
    replay, or this host's clock), ``bad_signature`` otherwise.

    During a rotation Relay signs with the old and the new secret and this side may hold
    either or both, so a callback verifies on any secret in ``SIGNING_SECRETS``.
    """
    stale = False
    for secret in conf.signing_secrets():
        try:
            webhook = Webhook(secret)
            return webhook.verify(body, headers), ""
        except WebhookVerificationError as e:
            stale = stale or ("timestamp" in str(e) and _signed_by(webhook, body, headers))
        except Exception:  # a malformed secret or header: try the next
            continue
    return None, "stale_timestamp" if stale else "bad_signature"


def _signed_by(webhook: Webhook, body: bytes, headers: dict[str, str]) -> bool:
    """Whether the signature is this secret's, the timestamp aside."""
    try:
        at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
        expected = webhook.sign(headers["webhook-id"], at, body.decode()).split(",", 1)[1]
    except (KeyError, ValueError, OverflowError, OSError, IndexError):
        return False
    given = [s.split(",", 1)[1] for s in headers.get("webhook-signature", "").split() if s.startswith("v1,")]
    return any(hmac.compare_digest(expected.encode(), g.encode()) for g in given)


@csrf_exempt
@require_POST
def callback(request: HttpRequest) -> JsonResponse:
    """A signed callback from Relay: verify, then apply the job resource if it is newer, or keep
    the message event (``message.*``) once and send ``message_event``."""
    headers = {k: request.headers.get(k, "") for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    payload, code = check(request.body, headers)
    if code == "stale_timestamp":
        log.warning(
            "relay callback %s refused: its timestamp %s is over 5 minutes from this host's clock",
            headers["webhook-id"],
            headers["webhook-timestamp"],
        )
        return _error(
            400,
            code,
            "the signature verifies but webhook-timestamp is over 5 minutes from now "
            "(a replay, or this host's clock is off)",
        )
    if payload is None and not conf.signing_secrets():
        log.warning(
            "relay callback %s refused: RELAY['SIGNING_SECRETS'] is empty; set it to the secret "
            "PUT /v1/callbacks returned (whsec_...) and restart this process",
            headers["webhook-id"],
        )
        return _error(400, "bad_signature", "this receiver holds no signing secret")
    if payload is None:
        log.warning("relay callback %s refused: no signing secret verifies it", headers["webhook-id"])
        return _error(400, "bad_signature", "the webhook signature does not verify")
    data = payload.get("data") if isinstance(payload, dict) else None
    kind = payload.get("type") if isinstance(payload, dict) else None
    if isinstance(kind, str) and kind.startswith("message."):
        try:
            kept = apply_message_event(data) if isinstance(data, dict) else None
        except (KeyError, TypeError, ValueError):
            kept = None
        if kept is None:
            return _error(400, "invalid_payload", "a message event's data must be a message event")
        return JsonResponse({"applied": kept})
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
