"""Item 2 of issue 48: ``job_finished`` tells the project a job ended, once per terminal status,
whichever way it learned it: a real signed callback, a reconciliation, a refresh. The example
shop's receiver (``shop.receivers``) marks the order whose confirmation the job was."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction

from relay_client.django import correlation, reconcile, refresh
from relay_client.django.models import RelayJob
from relay_client.django.signals import job_finished
from shop.models import Order
from shop.tasks import noop

from .conftest import Relay, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished():
    """Every (row id, status) ``job_finished`` carried during the test."""
    seen: list[tuple[str, str]] = []

    def receiver(sender, row, status, **kwargs):
        seen.append((str(row.pk), status))

    job_finished.connect(receiver, weak=False)
    yield seen
    job_finished.disconnect(receiver)


def place_order() -> Order:
    """An order and the job confirming it, committed together (noop stands for the email)."""
    with transaction.atomic(), correlation(f"finished-{uuid.uuid4()}"):
        order = Order.objects.create(email="a@example.com", total_cents=100)
        order.confirmation = uuid.UUID(noop.enqueue(echo=str(order.pk)).id)
        order.save()
    return order


def done_on_relay(relay: Relay, order: Order) -> None:
    row = RelayJob.objects.get(pk=str(order.confirmation))
    with relay.client() as client:
        wait_for("Relay to finish the job", lambda: client.get(str(row.relay_id)).terminal)


def test_a_real_callback_marks_the_order_once(relay, callbacks, live_server, finished):
    order = place_order()
    wait_for("the callback", lambda: Order.objects.get(pk=order.pk).confirmation_finished_at)
    order.refresh_from_db()
    assert order.confirmation_status == "succeeded"
    marked_at = order.confirmation_finished_at
    # The shop's receiver marked the order; this test's receiver runs after it, in the same thread.
    wait_for("the signal", lambda: finished)
    assert finished == [(str(order.confirmation), "succeeded")]
    # Learning the same ending again, every other way, sends nothing more.
    assert reconcile(older_than=timedelta(0)) == 0
    refresh(RelayJob.objects.get(pk=str(order.confirmation)))
    assert finished == [(str(order.confirmation), "succeeded")]
    order.refresh_from_db()
    assert order.confirmation_finished_at == marked_at


@pytest.mark.parametrize("way", ["reconcile", "refresh"])
def test_a_lost_callback_still_marks_the_order_once(relay, relay_conf, finished, way):
    # Callbacks for these jobs go where nothing listens: the ending reaches the project only by pulling.
    relay_conf["CALLBACK_URL"] = "http://127.0.0.1:9/relay/callbacks"
    order = place_order()
    done_on_relay(relay, order)
    assert not Order.objects.get(pk=order.pk).confirmation_finished_at, "no callback arrived"
    assert finished == []
    for _ in range(2):
        if way == "reconcile":
            reconcile(older_than=timedelta(0))
        else:
            refresh(RelayJob.objects.get(pk=str(order.confirmation)))
    order.refresh_from_db()
    assert (order.confirmation_status, bool(order.confirmation_finished_at)) == ("succeeded", True)
    assert finished == [(str(order.confirmation), "succeeded")]


def test_a_refused_job_finishes_as_refused(relay, relay_settings, finished):
    from shop.tasks import email_send

    relay_settings_validate = relay_settings.get("VALIDATE", True)
    relay_settings["VALIDATE"] = False  # let the enqueue through: Relay refuses it at the post
    try:
        with transaction.atomic(), correlation(f"refused-{uuid.uuid4()}"):
            order = Order.objects.create(email="not an address", total_cents=1)
            result = email_send.enqueue(**{"from": "shop@example.com"}, to=[order.email], subject="s", text="t")
            order.confirmation = uuid.UUID(result.id)
            order.save()
    finally:
        relay_settings["VALIDATE"] = relay_settings_validate
    order.refresh_from_db()
    assert order.confirmation_status == "refused"
    assert finished == [(result.id, "refused")]
