import json
import time

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from relay_client.django import correlation, refresh
from relay_client.django.models import RelayJob

from .models import Order
from .tasks import email_send, noop, tally_orders


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """The order and its confirmation email commit together, or neither does."""
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=body["email"], total_cents=body["total_cents"])
        with correlation(f"order-{order.pk}"):
            result = email_send.enqueue(
                **{"from": "shop@example.com"},
                to=[order.email],
                subject="Your order",
                text=f"Order {order.pk} is confirmed.",
            )
        order.confirmation = result.id
        order.save()
    return JsonResponse({"order": order.pk, "job": result.id}, status=201)


def refresh_confirmation(request: HttpRequest, job_id) -> JsonResponse:
    """A detail page someone is watching: ask Relay now instead of waiting for the callback."""
    row = refresh(RelayJob.objects.get(pk=job_id))
    return JsonResponse({"status": row.status, "result": row.result})


@csrf_exempt
@require_POST
def enqueue_many(request: HttpRequest) -> JsonResponse:
    """``n`` jobs in one transaction, on Relay (``"backend": "relay"``) or on the local
    django-tasks-db queue (``"tasks_db"``); answers how long the enqueues and the commit took."""
    body = json.loads(request.body)
    started = time.monotonic()
    with transaction.atomic():
        with correlation(body["correlation_id"]):
            for i in range(int(body["n"])):
                if body["backend"] == "relay":
                    noop.enqueue(echo=str(i))
                else:
                    tally_orders.enqueue()
        enqueued = time.monotonic()
    committed = time.monotonic()
    return JsonResponse({"enqueue_s": enqueued - started, "commit_s": committed - enqueued}, status=201)
