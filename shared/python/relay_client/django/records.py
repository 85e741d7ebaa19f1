"""The rows the package keeps about local work: each local task's run record (its attempts
policy, errors, readable name, run-again links), each declared schedule's switch and last slot,
and each worker's heartbeat. ``models`` imports them, so they are the ``relay`` app's models."""

from __future__ import annotations

from django.db import models


class LocalRun(models.Model):
    """What the package knows of one ``django.tasks`` result on the local backend
    (``relay_client.django.local.LocalBackend``): written with the result at enqueue."""

    #: The django-tasks-db result's id.
    result_id = models.CharField(max_length=64, primary_key=True)
    #: The name a person reads: the task's module path, or the function a schedule names.
    name = models.CharField(max_length=300)
    #: Attempts in all (the first included) and the first retry's wait, doubled for each later one.
    max_attempts = models.PositiveIntegerField(default=1)
    backoff_seconds = models.FloatField(default=60.0)
    #: The latest attempt's error (``ValueError: message``) and each attempt's, oldest first.
    last_error = models.TextField(blank=True, default="")
    errors = models.JSONField(default=list, blank=True)
    #: Times a worker that stopped being seen mid-task left it to be recovered.
    recovered = models.PositiveIntegerField(default=0)
    #: Set when the task failed for good (its attempts spent).
    failed_at = models.DateTimeField(null=True, blank=True)
    #: The failed result this one runs again, and the result that ran this one again.
    rerun_of = models.CharField(max_length=64, blank=True, default="")
    rerun_as = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        app_label = "relay"
        indexes = [models.Index(fields=["failed_at"], name="relay_localrun_failed_idx")]

    def __str__(self) -> str:
        return f"{self.name} {self.result_id}"


class ScheduleState(models.Model):
    """One ``RELAY["SCHEDULES"]`` entry's state: its switch (an admin action turns it off and on;
    a deploy never turns a switched-off schedule back on) and the latest slot it handled."""

    name = models.CharField(max_length=200, unique=True)
    enabled = models.BooleanField(default=True)
    #: The latest slot fired or passed over; slots after it are due.
    last_slot = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        app_label = "relay"

    def __str__(self) -> str:
        return f"{self.name} ({'on' if self.enabled else 'off'})"


class WorkerHeartbeat(models.Model):
    """A worker process (``relay_worker``, ``relay_tasks_worker``) and when it was last seen."""

    kind = models.CharField(max_length=40)
    instance_id = models.CharField(max_length=64, unique=True)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    #: Set when the worker stopped cleanly.
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "relay"
        indexes = [models.Index(fields=["kind", "last_seen_at"], name="relay_heartbeat_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.instance_id}"
