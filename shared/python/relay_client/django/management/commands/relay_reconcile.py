"""Re-pull non-terminal jobs whose callbacks may have been lost."""

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from relay_client.django.outbox import reconcile


class Command(BaseCommand):
    help = "Re-pull from Relay (updated_since) every non-terminal job not heard of for --older-than seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=600.0,
            metavar="SECONDS",
            help="re-pull jobs not heard of for this many seconds (default %(default)s: 10 minutes)",
        )

    def handle(self, *args: Any, older_than: float, **options: Any) -> None:
        n = reconcile(older_than=timedelta(seconds=older_than))
        self.stdout.write(f"repaired {n}")
