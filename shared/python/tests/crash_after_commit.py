"""Run as a subprocess by test_outbox: enqueue a Relay task (``argv[2]`` of them, default 1) in
one transaction, then hang right after the commit, before the on-commit post runs, so the test
can kill the process there.

on_commit callbacks run in the order they were registered: the hang is registered first.
"""

import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
django.setup()

from django.db import transaction  # noqa: E402

from relay_client.django import correlation  # noqa: E402
from shop.tasks import noop  # noqa: E402


def hang() -> None:
    print("committed", flush=True)
    time.sleep(120)


with transaction.atomic():
    transaction.on_commit(hang)
    with correlation(sys.argv[1]):
        for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
            result = noop.enqueue(echo=str(i))
    print(f"row {result.id}", flush=True)
print("posted", flush=True)  # never reached when the test kills the process in hang()
