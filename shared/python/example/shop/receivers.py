"""The domain object follows its Relay job: an order's confirmation is marked when the job ends,
however the project learned it (callback, reconcile, refresh)."""

from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from relay_client.django.models import RelayJob
from relay_client.django.signals import job_finished

from .models import Order


@receiver(job_finished, sender=RelayJob, dispatch_uid="shop.confirmation_finished")
def confirmation_finished(sender: type[RelayJob], row: RelayJob, status: str, **kwargs: Any) -> None:
    # One conditional UPDATE: idempotent, and a no-op for a job that confirms no order.
    Order.objects.filter(confirmation=row.pk, confirmation_finished_at__isnull=True).update(
        confirmation_status=status, confirmation_finished_at=timezone.now()
    )
