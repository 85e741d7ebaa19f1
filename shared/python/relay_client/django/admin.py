"""The Django admin for the outbox and projection rows: filter by status, post a row now (an
unsent or blocked one, e.g. after registering the destination a 409 named), refresh from Relay.
The message events are listed read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import conf, outbox
from .models import RelayJob, RelayMessageEvent, ScheduleSlot


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
