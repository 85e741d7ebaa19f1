"""The Django admin for the outbox and projection rows: filter by status, post a row now (an
unsent or blocked one, e.g. after registering the destination a 409 named), refresh from Relay.
The message events are listed read-only. The schedules, each with its switch (actions: off,
on); local task runs with their attempts and errors."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import conf, outbox, schedules
from .models import LocalRun, RelayJob, RelayMessageEvent, ScheduleSlot, ScheduleState, WorkerHeartbeat


@admin.register(RelayJob)
class RelayJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at run time
    list_display = (
        "id",
        "task_type",
        "status",
        "post_code",
        "correlation_id",
        "attempt",
        "created_at",
        "posted_at",
        "finished_at",
    )
    list_filter = ("status", "task_type", "post_code")
    search_fields = ("id", "relay_id", "correlation_id", "idempotency_key")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    actions = ["post_now", "refresh_from_relay"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in RelayJob._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Post to Relay now (unsent or blocked rows)")
    def post_now(self, request: HttpRequest, queryset: QuerySet[RelayJob]) -> None:
        rows = list(queryset.filter(posted_at__isnull=True))
        for row in rows:
            outbox.post_when_committed(row)
        posted = (
            RelayJob.objects.using(conf.database()).filter(pk__in=[r.pk for r in rows], posted_at__isnull=False).count()
        )
        level = messages.SUCCESS if posted == len(rows) else messages.WARNING
        self.message_user(request, f"{posted} of {len(rows)} unsent rows posted; see post_error for the rest", level)

    @admin.action(description="Refresh from Relay")
    def refresh_from_relay(self, request: HttpRequest, queryset: QuerySet[RelayJob]) -> None:
        failed = 0
        rows = list(queryset.filter(relay_id__isnull=False))
        for row in rows:
            try:
                outbox.refresh(row)
            except Exception as e:  # one unreachable answer should not hide the others
                failed += 1
                self.message_user(request, f"{row.pk}: {e}", messages.ERROR)
        self.message_user(request, f"{len(rows) - failed} rows refreshed from Relay")


@admin.register(ScheduleSlot)
class ScheduleSlotAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "slot", "task_result_id", "fired_at")
    list_filter = ("name",)
    ordering = ("-slot",)

    actions = ["run_again"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Run again (failed tasks, with their arguments)")
    def run_again(self, request: HttpRequest, queryset: QuerySet[LocalRun]) -> None:
        _run_again(self, request, [r.result_id for r in queryset])


def _run_again(model_admin: admin.ModelAdmin, request: HttpRequest, ids: list[str]) -> None:  # type: ignore[type-arg]
    from .local import NotFailed, rerun

    again = []
    for result_id in ids:
        try:
            again.append(f"{result_id} as {rerun(result_id, by=request.user.get_username()).id}")
        except NotFailed as e:
            model_admin.message_user(request, str(e), messages.WARNING)
    if again:
        model_admin.message_user(request, f"run again: {', '.join(again)}")


if apps.is_installed("django_tasks_db"):
    from django_tasks_db.admin import DBTaskResultAdmin
    from django_tasks_db.models import DBTaskResult

    class LocalTaskResultAdmin(DBTaskResultAdmin):
        """django-tasks-db's admin, with the names a person reads, attempts, errors, and "Run again"."""

        list_display = ("id", "name", "status", "attempts", "error", "enqueued_at", "finished_at", "queue_name")
        actions = ["run_again"]

        def _run(self, obj: Any) -> LocalRun | None:
            if not hasattr(obj, "_relay_run"):  # one query per row, not one per column
                obj._relay_run = LocalRun.objects.filter(result_id=str(obj.id)).first()
            return obj._relay_run  # type: ignore[no-any-return]

        @admin.display(description="task")
        def name(self, obj: Any) -> str:
            from .local import display_name

            run = self._run(obj)
            return run.name if run else display_name(obj.task_path, obj.args_kwargs)

        @admin.display(description="attempts")
        def attempts(self, obj: Any) -> str:
            run = self._run(obj)
            return f"{len(obj.worker_ids or [])} of {run.max_attempts}" if run else str(len(obj.worker_ids or []))

        @admin.display(description="error")
        def error(self, obj: Any) -> str:
            from .status.tasks_db import last_line

            run = self._run(obj)
            again = f" (run again as {run.rerun_as})" if run and run.rerun_as else ""
            return ((run.last_error if run else "") or last_line(obj.traceback)) + again

        @admin.action(description="Run again (failed tasks, with their arguments)")
        def run_again(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
            _run_again(self, request, [str(r.id) for r in queryset])

    if admin.site.is_registered(DBTaskResult):
        admin.site.unregister(DBTaskResult)
    admin.site.register(DBTaskResult, LocalTaskResultAdmin)


@admin.register(ScheduleState)
class ScheduleStateAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Each ``RELAY["SCHEDULES"]`` entry's switch: off stays off across restarts and deploys."""

    list_display = ("name", "enabled", "cron", "task", "declared", "last_slot", "changed_at", "changed_by")
    list_filter = ("enabled",)
    ordering = ("name",)
    actions = ["switch_off", "switch_on"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        schedules.sync()  # every declared schedule is listed, fired yet or not
        return super().changelist_view(request, extra_context)

    def _entry(self, obj: ScheduleState) -> schedules.Schedule | None:
        return next((s for s in schedules.declared() if s.name == obj.name), None)

    @admin.display(description="cron")
    def cron(self, obj: ScheduleState) -> str:
        entry = self._entry(obj)
        return entry.cron if entry else "-"

    @admin.display(description="task")
    def task(self, obj: ScheduleState) -> str:
        entry = self._entry(obj)
        return entry.task if entry else "-"

    @admin.display(description="declared", boolean=True)
    def declared(self, obj: ScheduleState) -> bool:
        return self._entry(obj) is not None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _switch(self, request: HttpRequest, queryset: QuerySet[ScheduleState], enabled: bool) -> None:
        done = []
        for row in queryset:
            try:
                schedules.switch(row.name, enabled, by=request.user.get_username())
            except KeyError as e:
                self.message_user(request, str(e), messages.WARNING)
            else:
                done.append(row.name)
        if done:
            self.message_user(request, f"switched {'on' if enabled else 'off'}: {', '.join(done)}")

    @admin.action(description="Switch off (stays off across deploys)")
    def switch_off(self, request: HttpRequest, queryset: QuerySet[ScheduleState]) -> None:
        self._switch(request, queryset, False)

    @admin.action(description="Switch on")
    def switch_on(self, request: HttpRequest, queryset: QuerySet[ScheduleState]) -> None:
        self._switch(request, queryset, True)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: the workers that beat, and whether each is live now."""

    list_display = ("kind", "instance_id", "host", "pid", "started_at", "last_seen_at", "stopped_at", "live")
    list_filter = ("kind", ("stopped_at", admin.EmptyFieldListFilter))
    ordering = ("-last_seen_at",)

    @admin.display(description="live", boolean=True)
    def live(self, obj: WorkerHeartbeat) -> bool:
        from django.utils import timezone

        from .heartbeats import stale_after

        return obj.stopped_at is None and obj.last_seen_at >= timezone.now() - stale_after()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RelayMessageEvent)
class RelayMessageEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: the events are Relay's; find a recipient's bounces and complaints."""

    list_display = ("event_id", "type", "message_id", "correlation_id", "bounce_type", "occurred_at")
    list_filter = ("type", "bounce_type")
    search_fields = ("message_id", "job_id", "correlation_id", "recipients")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LocalRun)
class LocalRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Local tasks on ``LocalBackend``: their attempts policy, each attempt's error, recoveries."""

    list_display = ("name", "result_id", "max_attempts", "last_error", "recovered", "failed_at", "rerun_of", "rerun_as")
    list_filter = (("failed_at", admin.EmptyFieldListFilter), "name")
    search_fields = ("result_id", "name", "last_error", "rerun_of", "rerun_as")
    ordering = ("-failed_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
