"""The deploy gate: wait a bounded time for a live worker of each declared kind; exit non-zero
when one is missing, so the deploy fails instead of succeeding without its worker."""

import time
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from relay_client.django import heartbeats


def _moment(value: str) -> datetime:
    at = parse_datetime(value)
    if at is None:
        raise ValueError(f"not an ISO 8601 time: {value!r}")
    return at if timezone.is_aware(at) else timezone.make_aware(at, timezone.get_default_timezone())


class Command(BaseCommand):
    help = (
        "Wait up to --timeout seconds for a live heartbeat of each worker kind in RELAY['WORKERS'] "
        "(relay_worker, relay_tasks_worker); exit 1 naming the kinds with none."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default %(default)s)")
        parser.add_argument(
            "--kinds", default=None, help="comma-separated kinds to wait for (default: RELAY['WORKERS'])"
        )
        parser.add_argument(
            "--started-after",
            type=_moment,
            default=None,
            help="count only workers started after this ISO 8601 time (the deploy's start: its new tasks)",
        )
        parser.add_argument("--every", type=float, default=2.0, help="seconds between looks (default %(default)s)")

    def handle(self, *args: Any, **o: Any) -> None:
        kinds = o["kinds"].split(",") if o["kinds"] else heartbeats.declared_kinds()
        deadline = time.monotonic() + o["timeout"]
        while True:
            live = heartbeats.fresh(kinds, started_after=o["started_after"])
            missing = [k for k in kinds if k not in live]
            if not missing:
                self.stdout.write(f"live: {', '.join(kinds)}")
                return
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"no live {', '.join(missing)} after {o['timeout']:g} s "
                    f"(a worker beats every {heartbeats.every():g} s; is its service running?)"
                )
            time.sleep(max(min(o["every"], deadline - time.monotonic()), 0.0))
