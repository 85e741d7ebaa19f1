"""``RelayJob``: one row per platform job, written by ``enqueue`` in the caller's transaction.

Until ``posted_at`` is set the row is the outbox entry; its ``idempotency_key`` (the caller's
own, or the row's id) is unique in the table and sent with every post, so however often it is
posted (the on-commit post, a drain, both) Relay creates one job. After
that it is the projection: Relay's last known state of the job, a cache (Relay is
authoritative). ``relay_updated_at`` and ``status_rank`` order updates: an update older than
what the row holds is ignored, whatever order callbacks, reconciliation and refreshes arrive in.
"""

from __future__ import annotations

import uuid

from django.db import models

#: The rank of each status among updates with the same ``updated_at`` (a later stage wins).
RANK = {
    "unsent": -1,
    "blocked": -1,
    "pending": 0,
    "waiting": 0,
    "running": 1,
    "succeeded": 2,
    "failed": 2,
    "cancelled": 2,
    "refused": 2,
}
TERMINAL_RANK = 2
#: The statuses a row can have: Relay's, and the outbox's own ``unsent`` (waiting to be posted),
#: ``blocked`` (Relay answered 409: e.g. a destination or template the tenant has not stored;
#: posted again only on demand) and ``refused`` (Relay will never take the request).
STATUS_CHOICES = [(s, s) for s in RANK]


class RelayJob(models.Model):
    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, help_text="Also the idempotency key of the submit."
    )
    task_type = models.CharField(max_length=200)
    params = models.JSONField(default=dict)
    #: The caller's own idempotency key (``.using(idempotency_key=...)``); null means the row's id.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    #: The job request's other fields: ``max_attempts``, ``timeout_seconds``, ``concurrency_key``,
    #: ``concurrency_limit`` (every post of the row sends the same request).
    options = models.JSONField(default=dict, blank=True)
    correlation_id = models.CharField(max_length=200)
    run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: Null while the row waits in the outbox.
    posted_at = models.DateTimeField(null=True, blank=True)
    #: Why the last post failed (kept for the next drain), or why Relay refused it.
    post_error = models.TextField(blank=True, default="")
    #: Relay's error code of the last failed post (``transport``, ``unauthorized``,
    #: ``unknown_destination``, ``invalid_params``, ...), empty once posted.
    post_code = models.CharField(max_length=60, blank=True, default="")
    relay_id = models.UUIDField(null=True, blank=True, unique=True)
    #: Relay's status; "unsent" before the post, "refused" when Relay refused the request.
    status = models.CharField(max_length=20, default="unsent", choices=STATUS_CHOICES)
    status_rank = models.SmallIntegerField(default=-1)
    attempt = models.IntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    waiting_reason = models.CharField(max_length=40, null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: The job resource's ``updated_at`` this row reflects.
    relay_updated_at = models.DateTimeField(null=True, blank=True)
    #: When this row last learned Relay's state (callback, reconciliation or refresh).
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "relay"
        indexes = [
            models.Index(fields=["created_at"], name="relay_outbox_idx", condition=models.Q(posted_at__isnull=True)),
            models.Index(fields=["status_rank", "synced_at"], name="relay_open_idx"),
            models.Index(fields=["correlation_id"], name="relay_correlation_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_type} {self.id} ({self.status})"

    @property
    def key(self) -> str:
        """The idempotency key every post of this row carries."""
        return self.idempotency_key or str(self.id)

    @property
    def terminal(self) -> bool:
        return self.status_rank >= TERMINAL_RANK


class ScheduleSlot(models.Model):
    """One firing of a ``RELAY["SCHEDULES"]`` entry: the unique (name, slot) makes each slot fire
    once, however many ``relay_worker`` processes run."""

    name = models.CharField(max_length=200)
    slot = models.DateTimeField()
    task_result_id = models.CharField(max_length=200, blank=True, default="")
    fired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "relay"
        constraints = [models.UniqueConstraint(fields=["name", "slot"], name="relay_schedule_slot_once")]

    def __str__(self) -> str:
        return f"{self.name} @ {self.slot.isoformat()}"


class RelayMessageEvent(models.Model):
    """One event on a message this project sent through Relay (bounce, complaint, delivery,
    suppression...), as its signed callback or the feed (``GET /v1/messages/events``) gave it.
    Kept once per Relay event id, so a repeated delivery or a replay changes nothing."""

    #: Relay's id of the event: increasing in the order Relay received events.
    event_id = models.BigIntegerField(unique=True)
    #: ``message.bounced``, ``message.complained``, ``message.suppressed``, ``message.delivered``...
    type = models.CharField(max_length=40)
    message_id = models.UUIDField()
    #: The Relay job that sent the message (``RelayJob.relay_id``).
    job_id = models.UUIDField()
    correlation_id = models.CharField(max_length=200)
    recipients = models.JSONField(default=list)
    occurred_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField()
    bounce_type = models.CharField(max_length=40, blank=True, default="")
    bounce_subtype = models.CharField(max_length=60, blank=True, default="")
    complaint_type = models.CharField(max_length=60, blank=True, default="")
    note = models.TextField(blank=True, default="")

    class Meta:
        app_label = "relay"
        indexes = [models.Index(fields=["message_id"], name="relay_message_event_idx")]

    def __str__(self) -> str:
        return f"{self.type} {self.message_id}"


from .records import LocalRun, ScheduleState, WorkerHeartbeat  # noqa: E402  (the relay app's other models)

__all__ = ["LocalRun", "RelayJob", "RelayMessageEvent", "ScheduleSlot", "ScheduleState", "WorkerHeartbeat"]
