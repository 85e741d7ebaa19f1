"""Local ``django.tasks`` tasks for a project's scheduler: the periodic drain and reconciliation.

Enqueue them from whatever runs the project's schedules (cron, a scheduled container, a
periodic-task library) onto its local backend, e.g. every minute and every ten minutes::

    from relay_client.django.periodic import drain_outbox, reconcile_jobs
    drain_outbox.enqueue(min_age_seconds=30)
"""

from datetime import timedelta

from ._compat import task
from .outbox import drain, reconcile


@task
def drain_outbox(min_age_seconds: float = 30.0) -> int:
    """Post outbox rows older than ``min_age_seconds`` (fresh ones are being posted on commit)."""
    return drain(min_age=timedelta(seconds=min_age_seconds)).posted


@task
def reconcile_jobs(older_than_seconds: float = 600.0) -> int:
    return reconcile(older_than=timedelta(seconds=older_than_seconds))
