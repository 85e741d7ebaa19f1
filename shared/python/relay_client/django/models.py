"""``RelayJob``: one row per platform job, written by ``enqueue`` in the caller's transaction.

Until ``posted_at`` is set the row is the outbox entry; its ``id`` is the idempotency key, so
however often it is posted (the on-commit post, a drain, both) Relay creates one job. After
that it is the projection: Relay's last known state of the job, a cache (Relay is
authoritative). ``relay_updated_at`` and ``status_rank`` order updates: an update older than
what the row holds is ignored, whatever order callbacks, reconciliation and refreshes arrive in.
"""

from __future__ import annotations

import uuid

from django.db import models

#: The rank of each status among updates with the same ``updated_at`` (a later stage wins).
RANK = {"unsent": -1, "pending": 0, "waiting": 0, "running": 1, "succeeded": 2, "failed": 2, "cancelled": 2,
        "refused": 2}
TERMINAL_RANK = 2


class RelayJob(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False,
                          help_text="Also the idempotency key of the submit.")
    task_type = models.CharField(max_length=200)
    params = models.JSONField(default=dict)
    correlation_id = models.CharField(max_length=200)
    run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: Null while the row waits in the outbox.
    posted_at = models.DateTimeField(null=True, blank=True)
    #: Why the last post failed (kept for the next drain), or why Relay refused it.
    post_error = models.TextField(blank=True, default="")
    relay_id = models.UUIDField(null=True, blank=True, unique=True)
    #: Relay's status; "unsent" before the post, "refused" when Relay refused the request.
    status = models.CharField(max_length=20, default="unsent")
    status_rank = models.SmallIntegerField(default=-1)
    attempt = models.IntegerField(default=0)
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
    def terminal(self) -> bool:
        return self.status_rank >= TERMINAL_RANK
