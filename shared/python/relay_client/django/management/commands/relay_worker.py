"""The project's Relay worker: drain, reconcile and the declared schedules, until SIGTERM."""

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from relay_client.django.worker import Worker


class Command(BaseCommand):
    help = (
        "Run the Relay outbox drain, the reconciliation and RELAY['SCHEDULES'] on their intervals "
        "until SIGTERM or SIGINT (then finish the step under way and exit 0)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--drain-every", type=float, default=30.0, help="seconds between drains (default %(default)s)"
        )
        parser.add_argument(
            "--min-age",
            type=float,
            default=10.0,
            help="drain only rows at least this many seconds old; fresh ones are their commit's (default %(default)s)",
        )
        parser.add_argument(
            "--reconcile-every",
            type=float,
            default=300.0,
            help="seconds between reconciliations, which re-pull jobs whose callbacks were lost (default %(default)s)",
        )
        parser.add_argument(
            "--older-than",
            type=float,
            default=600.0,
            help="reconcile jobs not heard of for this many seconds (default %(default)s)",
        )
        parser.add_argument(
            "--schedules-every",
            type=float,
            default=15.0,
            help="seconds between looks for due RELAY['SCHEDULES'] slots (default %(default)s)",
        )
        parser.add_argument(
            "--prune-days",
            type=float,
            default=None,
            help="also delete finished rows older than this many days, hourly (default: never)",
        )
        parser.add_argument("--once", action="store_true", help="run each step once and exit")

    def handle(self, *args: Any, **o: Any) -> None:
        worker = Worker(
            drain_every=o["drain_every"],
            drain_min_age=o["min_age"],
            reconcile_every=o["reconcile_every"],
            reconcile_older_than=o["older_than"],
            schedules_every=o["schedules_every"],
            prune_after_days=o["prune_days"],
            say=self.say,
        )
        if o["once"]:
            worker.run_once()
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        worker.run()

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
