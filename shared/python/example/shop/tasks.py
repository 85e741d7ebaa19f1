"""The shop's tasks: platform task types (run on Relay) and local tasks, some with attempts."""

import time

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2 LTS: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]

from relay_client.django import relay_task
from relay_client.django.local import local_task

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


@local_task(max_attempts=3, backoff=1, takes_context=True)
def flaky(context, failures: int) -> dict:
    """Fails its first ``failures`` attempts, then succeeds."""
    if context.attempt <= failures:
        raise RuntimeError(f"attempt {context.attempt} of flaky fails")
    return {"attempt": context.attempt}


@local_task(max_attempts=2, backoff=0, takes_context=True)
def slow_first(context, seconds: float) -> dict:
    """Its first attempt runs ``seconds`` (long enough to be killed in); later ones return at once."""
    if context.attempt == 1:
        time.sleep(seconds)
    return {"attempt": context.attempt}


def count_orders(prefix: str = "") -> int:
    """A plain function (no ``@task``): a schedule may name it."""
    from .models import Order

    return Order.objects.filter(email__startswith=prefix).count()


@task
def order_id(email: str) -> int:
    """Fails (``Order.DoesNotExist``) until the order exists: a failure fixed, then run again."""
    from .models import Order

    return Order.objects.get(email=email).pk
