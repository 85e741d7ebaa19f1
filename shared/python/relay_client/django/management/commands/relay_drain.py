"""Post what the outbox holds (rows a crash or an unreachable Relay left behind)."""

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from relay_client.django.outbox import drain


class Command(BaseCommand):
    help = (
        "Post the Relay outbox's unsent rows (each at most once: its idempotency key). Exits non-zero "
        "while rows are stuck behind a 401/403 (the API key) or a 409 (e.g. an unknown destination)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--min-age",
            type=float,
            default=0.0,
            help="only rows at least this many seconds old (leave fresh ones to their on-commit post)",
        )
        parser.add_argument(
            "--every",
            type=float,
            default=None,
            help="keep draining, every this many seconds (relay_worker does this and more)",
        )
        parser.add_argument(
            "--blocked",
            action="store_true",
            help="also post rows a 409 blocked (after storing the destination or template it named)",
        )

    def handle(self, *args: Any, min_age: float, every: float | None, blocked: bool, **options: Any) -> None:
        while True:
            r = drain(min_age=timedelta(seconds=min_age), blocked=blocked)
            self.stdout.write(
                f"posted {r.posted}, refused {r.refused}, blocked {r.blocked}, left {r.left}, "
                f"stuck {r.stuck}" + (f"; stopped: {r.error}" if r.error else "")
            )
            if every is None:
                if r.stuck:
                    raise CommandError(
                        f"{r.stuck} outbox rows are stuck until the tenant acts (a 401/403 for the "
                        "API key, or a 409: see their post_error in the admin)"
                    )
                return
            time.sleep(every)
