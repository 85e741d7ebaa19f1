"""Delete old finished outbox/projection rows."""

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from relay_client.django.outbox import prune


class Command(BaseCommand):
    help = "Delete Relay rows that finished (or were refused) more than --days ago; never unsent or live ones."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=float,
            default=30.0,
            metavar="DAYS",
            help="delete rows finished more than this many days ago (default %(default)s; fractions allowed)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    def handle(self, *args: Any, days: float, dry_run: bool, **options: Any) -> None:
        n = prune(older_than=timedelta(days=days), dry_run=dry_run)
        self.stdout.write(f"{'would delete' if dry_run else 'deleted'} {n}")
