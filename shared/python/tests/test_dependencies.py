"""``after``: a job that runs after others, through the client against a real ``relay dev``."""

from __future__ import annotations

import uuid

import pytest

from relay_client import InvalidRequest, JobRequest

from .conftest import Relay, wait_for


def req(task_type: str = "noop", **kw) -> JobRequest:
    return JobRequest(task_type=task_type, idempotency_key=str(uuid.uuid4()), correlation_id="deps", **kw)


def test_the_client_sends_after_and_the_job_waits_for_its_dependency(relay: Relay):
    assert "after" not in req().body(), "no after, no field: the request hash of old requests holds"
    with pytest.raises(ValueError):
        req(after="not-a-list")
    with relay.client() as client:
        first = client.submit(req(delay_seconds=2))
        then = client.submit(req(after=[first.id]))
        waiting = client.get(then.id)
        assert (waiting.status, waiting.raw["waiting_reason"]) == ("pending", "waiting_for_dependency")
        done = wait_for("the dependent to finish", lambda: (j := client.get(then.id)).terminal and j)
        assert done.status == "succeeded"
        first_end = client.get(first.id).finished_at
        assert done.started_at is not None and first_end is not None and done.started_at >= first_end
        with pytest.raises(InvalidRequest) as unknown:
            client.submit(req(after=[str(uuid.uuid4())]))
        assert (unknown.value.code, unknown.value.field) == ("unknown_dependency", "after[0]")
