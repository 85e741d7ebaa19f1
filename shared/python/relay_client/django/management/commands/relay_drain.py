"""Post what the outbox holds (rows a crash or an unreachable Relay left behind)."""

import time
from datetime import timedelta

from django.core.management.base import BaseCommand

from relay_client.django.outbox import drain


class Command(BaseCommand):
    help = "Post the Relay outbox's unsent rows (each at most once: its id is the idempotency key)."

    def add_arguments(self, parser):
        parser.add_argument("--min-age", type=float, default=0.0,
                            help="only rows at least this many seconds old (leave fresh ones to their on-commit post)")
        parser.add_argument("--every", type=float, default=None,
                            help="keep draining, every this many seconds")

    def handle(self, *args, min_age, every, **options):
        while True:
            n = drain(min_age=timedelta(seconds=min_age))
            self.stdout.write(f"posted {n}")
            if every is None:
                return
            time.sleep(every)
