"""The shape of ``relay.status/v1``, shared by every source of local work.

A source (django-tasks-db, django-q2) reads its own tables and hands back a :class:`Part` built
with these helpers; :func:`merge` puts the parts of the sources a project runs into one document,
so a project in the middle of a move shows both sources' queues, runs and failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

CONTRACT = "relay.status/v1"
#: 1.2: the optional ``activity`` series and ``exceptions`` (local tasks failed for good).
VERSION = "1.2"
RECENT_RUNS = 50
#: The activity chart, as Relay's own document draws it: 12 buckets of 5 minutes, oldest first.
ACTIVITY_BUCKETS = 12
ACTIVITY_BUCKET_S = 300
#: Most finished runs each series reads; beyond it the series says ``truncated``.
ACTIVITY_CAP = 20000
#: Most open exceptions a document lists.
EXCEPTIONS = 10
#: ``django.tasks`` result statuses as the contract names outcomes.
OUTCOMES = {"READY": "pending", "RUNNING": "running", "SUCCESSFUL": "succeeded", "FAILED": "failed"}
_EPOCH = datetime.min.replace(tzinfo=UTC)


def iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


def age(now: datetime, since: datetime | None) -> float:
    """Seconds from ``since`` to ``now``; 0 when there is nothing (or the clock ran backwards)."""
    return max((now - since).total_seconds(), 0.0) if since else 0.0


@dataclass
class Part:
    """What one source reports. Workers and runs carry the time they sort on (newest first)."""

    workers: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    schedules: list[dict[str, Any]] = field(default_factory=list)
    runs: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)
    failed_last_hour: int = 0
    failed_last_24h: int = 0
    open_exceptions: int = 0
    #: Finished runs and failures per activity bucket (oldest first); None: the source keeps none.
    activity: Activity | None = None
    #: Open exceptions, with the time they sort on (newest first).
    exceptions: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Activity:
    runs: list[int] = field(default_factory=lambda: [0] * ACTIVITY_BUCKETS)
    failures: list[int] = field(default_factory=lambda: [0] * ACTIVITY_BUCKETS)
    truncated: bool = False


def activity(now: datetime, finished: list[tuple[datetime, bool]], *, truncated: bool = False) -> Activity:
    """The series from ``(finished_at, failed)`` pairs: bucket 0 is the oldest 5 minutes of the hour."""
    out = Activity(truncated=truncated)
    for at, failed in finished:
        ago = int(max((now - at).total_seconds(), 0.0) // ACTIVITY_BUCKET_S)
        if ago < ACTIVITY_BUCKETS:
            out.runs[ACTIVITY_BUCKETS - 1 - ago] += 1
            if failed:
                out.failures[ACTIVITY_BUCKETS - 1 - ago] += 1
    return out


def exception(
    id: str, job_id: str, task_type: str, kind: str, cause: str, opened_at: datetime
) -> tuple[datetime, dict[str, Any]]:
    return opened_at, {
        "id": id,
        "job_id": job_id,
        "tenant": None,
        "task_type": task_type,
        "kind": kind,
        "cause": cause[:300],
        "opened_at": iso(opened_at),
    }


def worker(
    kind: str,
    instance_id: str,
    last_seen_at: datetime,
    *,
    host: str | None = None,
    pid: int | None = None,
    started_at: datetime | None = None,
) -> tuple[datetime, dict[str, Any]]:
    out: dict[str, Any] = {"kind": kind, "instance_id": instance_id, "last_seen_at": iso(last_seen_at)}
    if host is not None or pid is not None or started_at is not None:
        out.update(host=host, pid=pid, started_at=iso(started_at))
    return last_seen_at, out


def queue(
    name: str,
    transport: str,
    now: datetime,
    *,
    depth: int,
    oldest_due: datetime | None,
    scheduled: int | None = None,
    running: int | None = None,
) -> dict[str, Any]:
    """A queue: ``depth`` jobs due and not running, the oldest of them due since ``oldest_due``."""
    return {
        "name": name,
        "transport": transport,
        "depth": depth,
        "oldest_pending_age_s": age(now, oldest_due) if depth else 0.0,
        "scheduled": scheduled,
        "running": running,
    }


def schedule(
    name: str,
    cron: str | None,
    *,
    last_run_at: datetime | None,
    last_outcome: str | None,
    next_run_at: datetime | None,
) -> dict[str, Any]:
    return {
        "name": name,
        "cron": cron,
        "last_run_at": iso(last_run_at),
        "last_outcome": last_outcome,
        "next_run_at": iso(next_run_at),
    }


def run(
    id: str,
    task_type: str,
    status: str,
    now: datetime,
    *,
    created_at: datetime | None,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    run_at: datetime | None = None,
    attempt: int | None = None,
    max_attempts: int | None = None,
    last_error: str | None = None,
) -> tuple[datetime, dict[str, Any]]:
    """A run with the job resource's field names; a running one carries its elapsed time."""
    out: dict[str, Any] = {
        "id": id,
        "task_type": task_type,
        "status": status,
        "tenant": None,
        "run_at": iso(run_at),
        "attempt": attempt,
        "max_attempts": max_attempts,
        "started_at": iso(started_at),
        "created_at": iso(created_at),
        "updated_at": iso(finished_at or started_at or created_at),
        "finished_at": iso(finished_at),
        "last_error": last_error or None,
        "progress": None,
    }
    if status == "running" and started_at:
        out["progress"] = {"kind": "elapsed", "elapsed_s": age(now, started_at)}
    return created_at or _EPOCH, out


def merge(project: str, now: datetime, parts: list[Part]) -> dict[str, Any]:
    """One ``relay.status/v1`` document from the parts, workers and runs newest first."""
    workers = sorted((w for p in parts for w in p.workers), key=lambda w: w[0], reverse=True)
    runs = sorted((r for p in parts for r in p.runs), key=lambda r: r[0], reverse=True)
    exceptions = sorted((e for p in parts for e in p.exceptions), key=lambda e: e[0], reverse=True)
    series = [p.activity for p in parts if p.activity is not None]
    doc: dict[str, Any] = {
        "contract": CONTRACT,
        "version": VERSION,
        "project": project,
        "generated_at": iso(now),
        "workers": [w for _, w in workers],
        "queues": [q for p in parts for q in p.queues],
        "schedules": [s for p in parts for s in p.schedules],
        "recent_runs": [r for _, r in runs[:RECENT_RUNS]],
        "failures": {
            "last_hour": sum(p.failed_last_hour for p in parts),
            "last_24h": sum(p.failed_last_24h for p in parts),
            "open_exceptions": sum(p.open_exceptions for p in parts),
        },
        "exceptions": [e for _, e in exceptions[:EXCEPTIONS]],
    }
    if series:
        doc["activity"] = {
            "bucket_s": ACTIVITY_BUCKET_S,
            "runs": [sum(a.runs[i] for a in series) for i in range(ACTIVITY_BUCKETS)],
            "failures": [sum(a.failures[i] for a in series) for i in range(ACTIVITY_BUCKETS)],
            "truncated": any(a.truncated for a in series),
        }
    return doc
