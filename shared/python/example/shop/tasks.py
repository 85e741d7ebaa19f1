"""The shop's tasks: one platform task type (runs on Relay) and one local task."""

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2 LTS: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]

from relay_client.django import relay_task

#: Runs on Relay; enqueue with keyword parameters (the job's params).
email_send = relay_task("email.send")
#: A task type that does nothing, for the tests.
noop = relay_task("noop")


@task
def tally_orders() -> dict:
    """Local work: needs this project's data, so it stays here (on django-tasks-db)."""
    from .models import Order

    return {"orders": Order.objects.count()}


@task
def broken() -> None:
    raise ValueError("this local task always fails")
