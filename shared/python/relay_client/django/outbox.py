"""Posting the outbox, and keeping the projection.

``post_rows`` posts what one commit enqueued (``commit`` calls it on a thread once the
transaction commits); ``drain`` posts what a crash, a slow or an unreachable Relay left behind.
Every post of a row carries the row's idempotency key, so a row posted twice is one job.

Nothing here closes a row because of a failure of a whole request (413 for the batch, 401, 5xx,
a timeout, no connection): the drain sizes its batches under Relay's body limit, halves a batch
Relay finds too large, and closes a row only when Relay refused that row itself.

``apply`` writes a job resource into its row only when it is newer than what the row holds (one
conditional UPDATE, so concurrent callbacks cannot interleave); ``reconcile`` and ``refresh``
pull from Relay for when callbacks are lost.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models import Min, Q, QuerySet
from django.utils import timezone

from ..client import MAX_BATCH, Job, JobRequest, RelayClient
from ..errors import InvalidRequest, RelayError
from . import catalogue, conf
from .models import RANK, TERMINAL_RANK, RelayJob
from .signals import job_blocked, job_finished, job_refused

log = logging.getLogger("relay_client")

#: Most rows one drain reads at a time (each read is then cut into batches by bytes).
BATCH = MAX_BATCH
#: ``post_code`` of rows Relay will not take with the configured key (the drain keeps offering them).
AUTH_CODES = ("unauthorized", "forbidden")


class NotReady(Exception):
    """The row runs after an outbox row that has no Relay job yet: it waits for a later post."""


def after_ids(row: RelayJob, *, resolve: bool = True) -> list[str]:
    """The Relay job ids a row runs after (``.using(after=[...])``): an id naming an outbox row
    is that row's Relay job (``NotReady`` until it has one; a refused row makes this one refused,
    as Relay answers an unknown id); any other id is a Relay job id already. Without ``resolve``
    the ids as given (same length: for sizing a request before the row is saved)."""
    ids = [str(i) for i in (row.options or {}).get("after") or []]
    if not ids or not resolve:
        return ids
    local = {
        str(pk): (relay_id, status)
        for pk, relay_id, status in RelayJob.objects.using(conf.database())
        .filter(pk__in=ids)
        .values_list("pk", "relay_id", "status")
    }
    out = []
    for n, i in enumerate(ids):
        if i not in local:
            out.append(i)
            continue
        relay_id, status = local[i]
        if relay_id is not None:
            out.append(str(relay_id))
        elif status == "refused":
            raise InvalidRequest(
                422,
                "unknown_dependency",
                f"after[{n}]: outbox row {i} was refused, so it has no Relay job",
                {"field": f"after[{n}]"},
            )
        else:
            raise NotReady(i)
    return out


def request_for(row: RelayJob, *, resolve: bool = True) -> JobRequest:
    """The job request of a row: the same on every post, so a repeat is a replay."""
    opts = row.options or {}
    return JobRequest(
        task_type=row.task_type,
        idempotency_key=row.key,
        correlation_id=row.correlation_id,
        params=row.params or {},
        run_at=row.run_at,
        callback_url=conf.get("CALLBACK_URL"),
        max_attempts=opts.get("max_attempts"),
        timeout_seconds=opts.get("timeout_seconds"),
        concurrency_key=opts.get("concurrency_key"),
        concurrency_limit=opts.get("concurrency_limit"),
        after=after_ids(row, resolve=resolve),
        ordering_key=opts.get("ordering_key"),
        ordering_on_failure=opts.get("ordering_on_failure"),
    )


# -- the post after the commit -------------------------------------------------------------------


def post_rows(ids: list[uuid.UUID], *, timeout: float) -> DrainReport:
    """Post the committed rows among ``ids`` that are still unsent, in as few batch requests as
    their bytes allow, each network wait bounded by ``timeout`` and tried once. A row that runs
    after another of them goes in a later round, once that one has its Relay job. A failure of a
    whole request stops it and leaves the rest for the drain; a row Relay refused is closed."""
    report = DrainReport()
    with _client(timeout) as client:
        while True:
            waiting, before = DrainReport(), report.posted
            for start in range(0, len(ids), BATCH):
                rows = [r for r in unsent(ids[start : start + BATCH]) if _ready(r, waiting)]
                if not all(_post_batch(client, part, report) for part in _by_bytes(rows)):
                    report.left += waiting.left
                    return report
            report.refused += waiting.refused
            if not waiting.left or report.posted == before:
                report.left += waiting.left
                return report


def unsent(ids: list[uuid.UUID]) -> list[RelayJob]:
    """The rows among ``ids`` still waiting to be posted, oldest first."""
    rows = RelayJob.objects.using(conf.database()).filter(pk__in=ids, posted_at__isnull=True, status="unsent")
    return list(rows.order_by("created_at", "pk"))


def post(row_id: uuid.UUID | str, *, timeout: float | None = None, blocked: bool = False) -> bool:
    """Post one outbox row (its transaction has committed); True when Relay has the job.

    ``timeout`` bounds each network wait and makes it one attempt; without it the client's
    ``TIMEOUT`` and retries apply. ``blocked`` also posts a row a 409 blocked (after the tenant
    fixed the cause). A failure is recorded on the row, never raised.
    """
    statuses = ["unsent", "blocked"] if blocked else ["unsent"]
    row = RelayJob.objects.using(conf.database()).filter(pk=row_id, posted_at__isnull=True, status__in=statuses).first()
    if row is None:
        return True
    try:
        request = request_for(row)
    except NotReady:
        return False  # posted once the row it runs after is (the drain)
    except RelayError as e:
        _settle(row, e, DrainReport())
        return False
    try:
        with _client(timeout) as client:
            job = client.submit(request)
    except RelayError as e:
        if e.status not in (400, 401, 403, 409, 413, 422):
            log.warning("relay post of %s failed, left for the drain: %s", row.pk, e)
        _settle(row, e, DrainReport())
        return False
    _posted(row, job)
    return True


def _client(timeout: float | None) -> RelayClient:
    return conf.client() if timeout is None else conf.client(timeout=timeout, attempts=1)


def post_when_committed(row: RelayJob) -> None:
    """Post an unsent row now, or after the current transaction commits (never before it)."""
    transaction.on_commit(
        partial(post, row.pk, timeout=conf.post_timeout() or None, blocked=True), using=conf.database()
    )


# -- the drain ------------------------------------------------------------------------------------


@dataclass
class DrainReport:
    """What one drain did."""

    posted: int = 0
    refused: int = 0
    #: Rows Relay will not take until the tenant acts (409, or 401/403 for the key).
    blocked: int = 0
    #: Rows a failure of the whole request left unsent (the next drain offers them again).
    left: int = 0
    #: The failure that stopped this drain early, if one did.
    error: str = ""
    #: Unsent rows that cannot go out until the tenant acts, after this drain.
    stuck: int = 0


def drain(
    *,
    min_age: timedelta = timedelta(0),
    limit: int | None = None,
    blocked: bool = False,
    timeout: float | None = None,
) -> DrainReport:
    """Post every unsent outbox row older than ``min_age`` (``blocked``: and the blocked ones).

    Rows are locked (``SKIP LOCKED``) while posted, so drains running at once share the work. A
    failure of a whole request stops the drain and leaves its rows unsent (``error`` says why).
    ``timeout`` bounds each network wait and makes each request one attempt; without it the
    client's ``TIMEOUT`` and retries apply.
    """
    db = conf.database()
    report = DrainReport()
    statuses = ["unsent", "blocked"] if blocked else ["unsent"]
    after: tuple[datetime, uuid.UUID] | None = None
    seen = 0
    with _client(timeout) as client:
        while limit is None or seen < limit:
            size = BATCH if limit is None else min(BATCH, limit - seen)
            with transaction.atomic(using=db):
                rows = (
                    RelayJob.objects.using(db)
                    .select_for_update(skip_locked=True)
                    .filter(posted_at__isnull=True, status__in=statuses, created_at__lte=timezone.now() - min_age)
                )
                if after is not None:
                    rows = rows.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], pk__gt=after[1]))
                batch = list(rows.order_by("created_at", "pk")[:size])
                if not batch:
                    break
                seen += len(batch)
                after = (batch[-1].created_at, batch[-1].pk)
                ready = [r for r in batch if _ready(r, report)]
                ok = all(_post_batch(client, part, report) for part in _by_bytes(ready))
            if not ok or len(batch) < size:
                break
    report.stuck = stuck().count()
    return report


def _ready(row: RelayJob, report: DrainReport) -> bool:
    """Whether a row can be posted now: not while a row it runs after has no Relay job."""
    try:
        after_ids(row)
    except NotReady:
        report.left += 1
        return False
    except RelayError as e:
        _settle(row, e, report)
        return False
    return True


def stuck() -> QuerySet[RelayJob]:
    """Unsent rows that will not go out until the tenant acts (a 409, or a 401/403 for the key)."""
    return (
        RelayJob.objects.using(conf.database())
        .filter(posted_at__isnull=True)
        .filter(Q(status="blocked") | Q(post_code__in=AUTH_CODES))
    )


def request_size(row: RelayJob) -> int:
    """The bytes this row adds to a batch body."""
    item = request_for(row, resolve=False).batch_item()
    return len(json.dumps(item, separators=(",", ":"), ensure_ascii=False, default=str).encode()) + 1


def _by_bytes(rows: list[RelayJob]) -> Iterator[list[RelayJob]]:
    """Cut rows into batches whose body stays under ``MAX_BODY_BYTES`` (and ``MAX_BATCH`` items)."""
    limit = int(conf.get("MAX_BODY_BYTES"))
    empty = len('{"jobs":[]}')
    part: list[RelayJob] = []
    size = empty
    for row in rows:
        n = request_size(row)
        if part and (size + n > limit or len(part) >= MAX_BATCH):
            yield part
            part, size = [], empty
        part.append(row)
        size += n
    if part:
        yield part


def _post_batch(client: RelayClient, rows: list[RelayJob], report: DrainReport) -> bool:
    """Post one batch; False when a failure of the whole request should stop the drain."""
    try:
        results = client.submit_batch([request_for(r) for r in rows])
    except RelayError as e:
        if e.status in (400, 413, 422):
            # Refused as a whole: halve until the row Relay refuses stands alone.
            if len(rows) == 1:
                _settle(rows[0], e, report)
                return True
            mid = len(rows) // 2
            return _post_batch(client, rows[:mid], report) and _post_batch(client, rows[mid:], report)
        for r in rows:
            _settle(r, e, report)
        report.error = str(e)
        log.warning("relay post stopped, %d rows left unsent for the drain: %s", len(rows), e)
        return False
    created = []
    for row, res in zip(rows, results, strict=True):
        if res.job is not None and res.created and not res.job.terminal:
            created.append((row, res.job))
        elif res.job is not None:
            _posted(row, res.job)  # a replay, or a job that already ended: the careful way
        elif res.error is not None:
            _settle(row, res.error, report)
    _created(created)
    report.posted += sum(1 for r in results if r.job is not None)
    return True


# -- recording outcomes ---------------------------------------------------------------------------


def _posted(row: RelayJob, job: Job) -> None:
    RelayJob.objects.using(conf.database()).filter(pk=row.pk, posted_at__isnull=True).update(
        posted_at=timezone.now(), relay_id=job.id, post_error="", post_code="", status="unsent"
    )
    apply(job)


#: What ``_created`` writes: the post's own fields and the projection's.
_CREATED_FIELDS = [
    "posted_at",
    "relay_id",
    "post_error",
    "post_code",
    "status",
    "status_rank",
    "attempt",
    "progress",
    "result",
    "waiting_reason",
    "last_error",
    "started_at",
    "finished_at",
    "relay_updated_at",
    "synced_at",
]


def _created(pairs: list[tuple[RelayJob, Job]]) -> None:
    """Record the jobs one batch created (202, not ended yet) in one UPDATE, on the rows nothing
    has written since (a callback that came first keeps what it wrote: it is as new or newer)."""
    if not pairs:
        return
    now = timezone.now()
    for row, job in pairs:
        row.posted_at, row.relay_id, row.post_error, row.post_code = now, uuid.UUID(job.id), "", ""
        row.status, row.status_rank, row.attempt = job.status, RANK.get(job.status, 0), job.attempt
        row.progress, row.result, row.waiting_reason, row.last_error = (
            job.progress,
            job.result,
            job.waiting_reason,
            job.last_error,
        )
        row.started_at, row.finished_at, row.relay_updated_at, row.synced_at = (
            job.started_at,
            job.finished_at,
            job.updated_at,
            now,
        )
    RelayJob.objects.using(conf.database()).filter(posted_at__isnull=True, relay_updated_at__isnull=True).bulk_update(
        [row for row, _ in pairs], _CREATED_FIELDS
    )


def _settle(row: RelayJob, err: RelayError, report: DrainReport) -> None:
    """Record Relay's answer to one row that did not make a job."""
    rows = RelayJob.objects.using(conf.database()).filter(pk=row.pk, posted_at__isnull=True)
    if err.status in (400, 413, 422):
        # Relay read this row's request and will never take it: close it so no drain offers it.
        log.error("relay refused outbox row %s (%s): %s", row.pk, row.task_type, err)
        if err.code in ("unknown_task_type", "invalid_params"):
            catalogue.invalidate()  # the schema let it through: the catalogue changed since
        if rows.update(
            posted_at=timezone.now(),
            status="refused",
            status_rank=RANK["refused"],
            post_error=str(err),
            post_code=err.code,
            last_error=str(err),
        ):
            report.refused += 1
            refused = _reload(row)
            job_refused.send(RelayJob, row=refused, error=err)
            transaction.on_commit(
                partial(job_finished.send, RelayJob, row=refused, status="refused"),
                using=conf.database(),
                robust=True,
            )
    elif err.status == 409 and err.code != "retry":
        # A destination, template or callback secret the tenant has not stored: posting it again
        # cannot work until the tenant acts (then `relay_drain --blocked` or the admin posts it).
        log.error("relay blocked outbox row %s (%s): %s", row.pk, row.task_type, err)
        if rows.update(status="blocked", post_error=str(err), post_code=err.code):
            report.blocked += 1
            job_blocked.send(RelayJob, row=_reload(row), error=err)
    elif err.status in (401, 403):
        code = AUTH_CODES[0] if err.status == 401 else AUTH_CODES[1]
        log.error("relay refused the API key for outbox row %s: %s", row.pk, err)
        report.blocked += 1
        if rows.exclude(post_code=code).update(post_error=str(err), post_code=code):
            job_blocked.send(RelayJob, row=_reload(row), error=err)
    else:
        # A failure of the whole request: its caller logs it once for all its rows.
        log.debug("relay post of %s failed, left for the drain: %s", row.pk, err)
        report.left += 1
        rows.update(post_error=str(err), post_code=err.code)


def _reload(row: RelayJob) -> RelayJob:
    return RelayJob.objects.using(conf.database()).get(pk=row.pk)


# -- the projection -------------------------------------------------------------------------------


def apply(job: Job) -> bool:
    """Write ``job`` into its row when newer than what the row holds; True when written.

    Newer: a later ``updated_at``, or the same one with a later stage (running after pending,
    terminal after running). A replay or an older update changes nothing, except what Relay
    works out when read (``waiting_reason``, ``progress``), which the same version may refresh.
    The row is found by Relay's id, or by the idempotency key for a job not yet recorded as posted.
    """
    db = conf.database()
    rank = RANK.get(job.status, 0)
    newer = (
        Q(relay_updated_at__isnull=True)
        | Q(relay_updated_at__lt=job.updated_at)
        | Q(relay_updated_at=job.updated_at, status_rank__lt=rank)
    )
    mine = Q(relay_id=job.id) | Q(idempotency_key=job.idempotency_key, relay_id__isnull=True)
    try:
        mine |= Q(pk=uuid.UUID(job.idempotency_key), idempotency_key__isnull=True, relay_id__isnull=True)
    except ValueError:
        pass
    now = timezone.now()
    rows = RelayJob.objects.using(db).filter(mine)
    # A job Relay reports is posted, whoever posted it.
    rows.filter(posted_at__isnull=True).update(posted_at=now, relay_id=job.id, post_error="", post_code="")
    values = {
        "relay_id": job.id,
        "status": job.status,
        "status_rank": rank,
        "attempt": job.attempt,
        "progress": job.progress,
        "result": job.result,
        "waiting_reason": job.waiting_reason,
        "last_error": job.last_error,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "relay_updated_at": job.updated_at,
        "synced_at": now,
    }
    written = 0
    if rank >= TERMINAL_RANK:
        # Entering this terminal status: one conditional UPDATE, so of two callers delivering the
        # same ending (a callback and a reconcile at once) only one sends `job_finished`.
        written = rows.filter(newer).exclude(status=job.status).update(**values)
        if written:
            _finished(job.id, job.status)
    written += rows.filter(newer).update(**values)
    if not written and rank < TERMINAL_RANK:
        same = rows.filter(relay_updated_at=job.updated_at, status_rank=rank)
        for pk, reason, progress in same.values_list("pk", "waiting_reason", "progress"):
            if (reason, progress) != (job.waiting_reason, job.progress):
                same.filter(pk=pk).update(waiting_reason=job.waiting_reason, progress=job.progress, synced_at=now)
    return written > 0


def _finished(relay_id: str, status: str) -> None:
    """Send ``job_finished`` for the row that just ended, once the write has committed."""
    db = conf.database()

    def send() -> None:
        row = RelayJob.objects.using(db).filter(relay_id=relay_id).first()
        if row is not None:
            job_finished.send(RelayJob, row=row, status=status)

    transaction.on_commit(send, using=db, robust=True)


def relay_job(result_id: uuid.UUID | str) -> RelayJob:
    """The row of a committed enqueue (``result.id``) with its Relay job: posted now when the
    commit's post has not landed yet. Raises ``RelayError`` when Relay cannot take it now (the
    row stays for the drain), ``RelayJob.DoesNotExist`` for no such row (or one not committed)."""
    db = conf.database()
    row = RelayJob.objects.using(db).get(pk=result_id)
    if row.relay_id is None:
        request = request_for(row)
        with conf.client() as client:
            try:
                job = client.submit(request)
            except RelayError as e:
                _settle(row, e, DrainReport())
                raise
        _posted(row, job)
        row.refresh_from_db(using=db)
    return row


def refresh(row: RelayJob) -> RelayJob:
    """Ask Relay for the job now (a detail page someone is watching); returns the row reloaded.

    An unsent row is posted, but never before the transaction that may still roll it back has
    committed: inside ``atomic()`` the post waits for the commit.
    """
    if row.relay_id is None:
        post_when_committed(row)
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
    stale = (
        RelayJob.objects.using(db)
        .filter(posted_at__isnull=False, relay_id__isnull=False, status_rank__lt=TERMINAL_RANK)
        .filter(Q(synced_at__isnull=True) | Q(synced_at__lt=now - older_than))
    )
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


def prune(*, older_than: timedelta, dry_run: bool = False) -> int:
    """Delete finished rows (terminal or refused) last touched before ``older_than`` ago, and the
    schedule slots as old; never an unsent, blocked or live row. Returns how many rows go."""
    from django.db.models.functions import Coalesce

    from .models import ScheduleSlot

    db = conf.database()
    cutoff = timezone.now() - older_than
    done = (
        RelayJob.objects.using(db)
        .filter(status_rank__gte=TERMINAL_RANK)
        .annotate(last=Coalesce("finished_at", "relay_updated_at", "posted_at", "created_at"))
        .filter(last__lt=cutoff)
    )
    n = done.count()
    if not dry_run:
        RelayJob.objects.using(db).filter(pk__in=done.values("pk")).delete()
        ScheduleSlot.objects.using(db).filter(slot__lt=cutoff).delete()
    return n
