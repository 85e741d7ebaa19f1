"""django-tasks-db's ``db_worker`` with attempts and backoff, a heartbeat, and the recovery of the
tasks of workers that died (``relay_client.django.tasks_worker``). Same options as ``db_worker``."""

from typing import Any

from django.core.management.base import CommandError
from django_tasks_db.management.commands.db_worker import Command as DbWorkerCommand

from relay_client.django.tasks_worker import TasksWorker


class Command(DbWorkerCommand):
    help = (
        "Run local django.tasks work on django-tasks-db with retries (max_attempts, backoff), a heartbeat "
        "(RELAY['HEARTBEAT_SECONDS']) and the recovery of tasks whose worker died; db_worker's options."
    )

    def handle(self, *args: Any, **o: Any) -> None:
        self.configure_logging(o["verbosity"])
        if o.get("reload"):
            self.stderr.write("relay_tasks_worker does not reload on code changes (--reload ignored): restart it")
        queue_names = o["queue_name"].split(",")
        excluded = o["exclude_queues"].split(",") if o["exclude_queues"] else []
        if excluded and "*" not in queue_names:
            raise CommandError("--exclude-queues can only be used with --queue-name=*")
        worker = TasksWorker(
            queue_names=queue_names,
            interval=o["interval"],
            batch=o["batch"],
            backend_name=o["backend_name"],
            startup_delay=o["startup_delay"],
            max_tasks=o["max_tasks"],
            worker_id=o["worker_id"],
            excluded_queue_names=excluded,
        )
        worker.configure_signals()
        worker.run()
