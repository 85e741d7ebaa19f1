"""Posting the outbox, and keeping the projection.

``post`` runs after the enqueuing transaction commits; ``drain`` posts what a crash or an
unreachable Relay left behind. Both use the row's id as the idempotency key, so a row posted
twice is one job. ``apply`` writes a job resource into its row only when it is newer than what
the row holds (one conditional UPDATE, so concurrent callbacks cannot interleave);
``reconcile`` and ``refresh`` pull from Relay for when callbacks are lost.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from ..client import Job, JobRequest
from ..errors import RelayError, TransportError
from . import conf
from .models import RANK, TERMINAL_RANK, RelayJob

log = logging.getLogger("relay_client")

#: Most rows one drain posts in one batch request (Relay takes up to 500).
BATCH = 500


def _request(row: RelayJob) -> JobRequest:
    return JobRequest(task_type=row.task_type, idempotency_key=str(row.id), correlation_id=row.correlation_id,
                      params=row.params or {}, run_at=row.run_at, callback_url=conf.get("CALLBACK_URL"))


def _refusal(err: RelayError) -> bool:
    """Relay read the request and refused it: posting it again cannot succeed."""
    return err.status in (400, 413, 422)


def post(row_id: uuid.UUID | str) -> bool:
    """Post one outbox row (after its transaction committed); True when Relay has the job.

    A failure is logged and left to ``drain``; it never raises into the committed request.
    """
    db = conf.database()
    row = RelayJob.objects.using(db).filter(pk=row_id, posted_at__isnull=True).first()
    if row is None:
        return True
    try:
        with conf.client() as client:
            job = client.submit(_request(row))
    except RelayError as e:
        _failed(row, e)
        return False
    _posted(row, job)
    return True


def drain(*, min_age: timedelta = timedelta(0), limit: int | None = None) -> int:
    """Post every outbox row older than ``min_age``; returns how many Relay now holds.

    Rows are locked (``SKIP LOCKED``) while posted, so drains running at once share the work.
    """
    db = conf.database()
    posted = 0
    while limit is None or posted < limit:
        size = BATCH if limit is None else min(BATCH, limit - posted)
        with transaction.atomic(using=db):
            rows = list(
                RelayJob.objects.using(db)
                .select_for_update(skip_locked=True)
                .filter(posted_at__isnull=True, created_at__lte=timezone.now() - min_age)
                .order_by("created_at")[:size]
            )
            if not rows:
                break
            try:
                with conf.client() as client:
                    results = client.submit_batch([_request(r) for r in rows])
            except RelayError as e:
                for r in rows:
                    _failed(r, e)
                log.warning("relay drain: %s", e)
                break
            for row, res in zip(rows, results, strict=True):
                if res.job is not None:
                    _posted(row, res.job)
                    posted += 1
                elif res.error is not None:
                    _failed(row, res.error)
        if len(rows) < size:
            break
    return posted


def _posted(row: RelayJob, job: Job) -> None:
    db = conf.database()
    RelayJob.objects.using(db).filter(pk=row.pk, posted_at__isnull=True).update(
        posted_at=timezone.now(), relay_id=job.id, post_error="")
    apply(job)


def _failed(row: RelayJob, err: RelayError) -> None:
    db = conf.database()
    if _refusal(err):
        # Relay will never take this request: close the row so the drain stops offering it.
        log.error("relay refused outbox row %s (%s): %s", row.pk, row.task_type, err)
        RelayJob.objects.using(db).filter(pk=row.pk, posted_at__isnull=True).update(
            posted_at=timezone.now(), status="refused", status_rank=RANK["refused"], post_error=str(err),
            last_error=str(err))
    else:
        kind = "unreachable" if isinstance(err, TransportError) else "error"
        log.warning("relay post of %s failed (%s), left for the drain: %s", row.pk, kind, err)
        RelayJob.objects.using(db).filter(pk=row.pk, posted_at__isnull=True).update(post_error=str(err))


def apply(job: Job) -> bool:
    """Write ``job`` into its row when newer than what the row holds; True when written.

    Newer: a later ``updated_at``, or the same one with a later stage (running after pending,
    terminal after running). A replay or an older update changes nothing. The row is found by
    Relay's id, or by the idempotency key (the row's id) for a job not yet recorded as posted.
    """
    db = conf.database()
    rank = RANK.get(job.status, 0)
    newer = (Q(relay_updated_at__isnull=True) | Q(relay_updated_at__lt=job.updated_at)
             | Q(relay_updated_at=job.updated_at, status_rank__lt=rank))
    mine = Q(relay_id=job.id)
    try:
        mine |= Q(pk=uuid.UUID(job.idempotency_key), relay_id__isnull=True)
    except ValueError:
        pass
    return _update(db, mine, newer, job, rank, timezone.now()) > 0


def _update(db: str, mine: Q, newer: Q, job: Job, rank: int, now: datetime) -> int:
    rows = RelayJob.objects.using(db).filter(mine)
    # A job Relay reports is posted, whoever posted it.
    rows.filter(posted_at__isnull=True).update(posted_at=now, relay_id=job.id, post_error="")
    return rows.filter(newer).update(
        relay_id=job.id, status=job.status, status_rank=rank, attempt=job.attempt, progress=job.progress,
        result=job.result, waiting_reason=job.waiting_reason, last_error=job.last_error,
        finished_at=job.finished_at, relay_updated_at=job.updated_at, synced_at=now,
    )


def refresh(row: RelayJob) -> RelayJob:
    """Ask Relay for the job now (a detail page someone is watching); returns the row reloaded.

    An unsent row is posted first.
    """
    if row.relay_id is None:
        post(row.pk)
    else:
        with conf.client() as client:
            apply(client.get(str(row.relay_id)))
    row.refresh_from_db(using=conf.database())
    return row


def reconcile(*, older_than: timedelta = timedelta(minutes=10)) -> int:
    """Re-pull every non-terminal job not heard of for ``older_than``, through ``updated_since``.

    The feed from the oldest such row's ``updated_at`` holds every change since, so one pass
    repairs every row whose callbacks were lost. Returns how many rows changed.
    """
    db = conf.database()
    now = timezone.now()
    stale = RelayJob.objects.using(db).filter(
        posted_at__isnull=False, relay_id__isnull=False, status_rank__lt=TERMINAL_RANK
    ).filter(Q(synced_at__isnull=True) | Q(synced_at__lt=now - older_than))
    bounds = stale.aggregate(updated=Min("relay_updated_at"), posted=Min("posted_at"))
    since = bounds["updated"] or bounds["posted"]
    if since is None:
        return 0
    changed = 0
    with conf.client() as client:
        for job in client.changes(since):
            changed += int(apply(job))
    # Every live job changed at or after `since` was in the feed: the rest are current.
    stale.update(synced_at=now)
    return changed
