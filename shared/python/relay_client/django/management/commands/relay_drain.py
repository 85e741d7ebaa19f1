"""Post what the outbox holds (rows a crash or an unreachable Relay left behind)."""

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from relay_client.django.outbox import drain


class Command(BaseCommand):
    help = (
        "Post the Relay outbox's unsent rows (each at most once: its idempotency key). Exits non-zero "
        "when Relay did not take them (down, silent, 5xx: the rows stay unsent for the next drain) and "
        "while rows are stuck behind a 401/403 (the API key) or a 409 (e.g. an unknown destination)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--min-age",
            type=float,
            default=0.0,
            help="only rows at least this many seconds old (default %(default)s; leave fresh ones to their commit)",
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
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="seconds each network wait may take, one attempt per request (default: RELAY['TIMEOUT'], "
            "10, with up to 4 attempts: a silent Relay costs about 45 s)",
        )

    def handle(
        self, *args: Any, min_age: float, every: float | None, blocked: bool, timeout: float | None, **options: Any
    ) -> None:
        while True:
            r = drain(min_age=timedelta(seconds=min_age), blocked=blocked, timeout=timeout)
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
                if r.error:
                    raise CommandError(f"Relay did not take the outbox ({r.left} rows left unsent): {r.error}")
                return
            time.sleep(every)
