"""A paged ``email.campaign`` from a Django project: enqueue it with ``pages``, then hand its
recipients over once the enqueue has committed.

    campaign = relay_task("email.campaign")
    with transaction.atomic():
        result = campaign.enqueue(message={"from": ..., "template": "newsletter"}, pages=ceil(n / 5000))
    send_recipient_pages(result.id, [{"to": u.email, "data": {"name": u.first_name}} for u in users])

The campaign waits, pending, until its last page lands, then sends one ``email.send`` per
recipient; ``job_finished`` reports its end.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..resources import MAX_PAGE, PageReceipt
from . import conf
from .outbox import relay_job


def send_recipient_pages(
    result_id: uuid.UUID | str, recipients: Sequence[Mapping[str, Any]], *, page_size: int = MAX_PAGE
) -> list[PageReceipt]:
    """Put every page of the campaign enqueued as ``result_id`` (after its commit), in order.
    Idempotent per page: after a failure, call it again with the same recipients."""
    row = relay_job(result_id)
    with conf.client() as client:
        return client.put_recipient_pages(str(row.relay_id), recipients, page_size=page_size)
