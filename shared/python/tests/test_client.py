"""The API client against a real ``relay dev``."""

from __future__ import annotations

import uuid

import httpx
import pytest

from relay_client import (
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    JobRequest,
    NotFound,
    RelayClient,
    TransportError,
    Unauthorized,
)

from .conftest import Relay, wait_for


def req(task_type: str = "noop", **kw) -> JobRequest:
    c = kw.pop("correlation_id", f"corr-{uuid.uuid4()}")
    return JobRequest(task_type=task_type, idempotency_key=kw.pop("key", str(uuid.uuid4())), correlation_id=c, **kw)


def test_submit_replays_by_key_and_refusals_are_typed(relay: Relay):
    with relay.client() as client:
        first = req()
        job = client.submit(first)
        assert (job.task_type, job.correlation_id, job.idempotency_key) == (
            "noop",
            first.correlation_id,
            first.idempotency_key,
        )
        assert client.submit(first).id == job.id, "the same key and request is the same job"
        with pytest.raises(IdempotencyKeyReused) as reused:
            client.submit(req(key=first.idempotency_key, params={}, correlation_id="another"))
        assert reused.value.job_id == job.id
        with pytest.raises(InvalidRequest) as unknown:
            client.submit(req("no.such.task"))
        assert (unknown.value.code, unknown.value.field) == ("unknown_task_type", "task_type")
        with pytest.raises(NotFound):
            client.get(str(uuid.uuid4()))
        done = wait_for("the noop job to finish", lambda: (j := client.get(job.id)).terminal and j)
        assert done.status == "succeeded"
        with pytest.raises(Conflict) as conflict:
            client.cancel(job.id)
        assert conflict.value.code == "not_cancellable"
    with RelayClient(relay.url, "wrong-key") as wrong, pytest.raises(Unauthorized):
        wrong.get(job.id)
    with pytest.raises(ValueError):
        JobRequest(task_type="noop", idempotency_key="", correlation_id="c")


def test_batch_cancel_and_the_change_feed(relay: Relay):
    with relay.client() as client:
        since = client.list(limit=1).resume_cursor
        later = req(delay_seconds=3600)
        results = client.submit_batch([later, req("no.such.task"), req()])
        assert [r.status for r in results] == [202, 422, 202]
        assert results[0].job is not None and results[2].job is not None
        assert results[1].error is not None and results[1].error.field == "task_type"
        assert client.submit_batch([later])[0].status == 200, "a replayed batch item"
        cancelled = client.cancel(results[0].job.id)
        assert cancelled.status == "cancelled"
        seen = {j.id: j for j in client.changes(since)}
        assert {results[0].job.id, results[2].job.id} <= set(seen)
        assert seen[results[0].job.id].status == "cancelled"
        page = client.list(correlation_id=later.correlation_id)
        assert [j.id for j in page.jobs] == [results[0].job.id]


class LoseFirstAnswer(httpx.HTTPTransport):
    """Sends each request for real, but the first answer is lost (a read timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        res = super().handle_request(request)
        if self.sent == 1:
            res.close()
            raise httpx.ReadTimeout("answer lost", request=request)
        return res


def test_a_timed_out_submit_is_retried_with_the_same_key_and_makes_one_job(relay: Relay):
    transport = LoseFirstAnswer()
    r = req()
    with RelayClient(relay.url, relay.key, transport=transport, backoff=0.01) as client:
        job = client.submit(r)
    assert transport.sent == 2, "the submit was sent twice"
    with relay.client() as client:
        jobs = client.list(correlation_id=r.correlation_id).jobs
    assert [j.id for j in jobs] == [job.id], "one job for two sends"
    with RelayClient("http://127.0.0.1:1", "k", attempts=2, backoff=0.01) as dead, pytest.raises(TransportError) as e:
        dead.submit(req())
    assert "POST http://127.0.0.1:1/v1/jobs" in str(e.value), "a Relay not running names the URL it was looked for at"
