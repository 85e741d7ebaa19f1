"""Transactional enqueue: a rolled-back change sends nothing; a committed one sends exactly one
job, even when the process dies between the commit and the post."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import pytest
from django.db import connection, transaction

from relay_client.django import correlation, drain, outbox
from relay_client.django._compat import TaskResultStatus
from relay_client.django.models import RelayJob
from shop.models import Order
from shop.tasks import email_send, noop

from .conftest import EXAMPLE, child_env, jobs_on_relay, run_manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rolled_back_transaction_sends_nothing(relay, relay_settings):
    corr = f"rollback-{uuid.uuid4()}"
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(email="a@example.com", total_cents=100)
        with correlation(corr):
            noop.enqueue()
        raise RuntimeError("the change fails after the enqueue")
    assert RelayJob.objects.count() == 0 and Order.objects.count() == 0
    assert drain().posted == 0
    assert jobs_on_relay(relay, corr) == []


def test_a_committed_transaction_sends_exactly_one_job(relay, relay_settings):
    corr = f"commit-{uuid.uuid4()}"
    with transaction.atomic():
        with correlation(corr):
            result = email_send.enqueue(
                **{"from": "shop@example.com"}, to=["a@example.com"], subject="Hi", text="Hello"
            )
        assert jobs_on_relay(relay, corr) == [], "nothing leaves before the commit"
    row = wait_for(
        "the post after the commit", lambda: RelayJob.objects.filter(pk=result.id, posted_at__isnull=False).first()
    )
    assert row.relay_id is not None
    [job] = jobs_on_relay(relay, corr)
    assert (job.idempotency_key, job.correlation_id, job.task_type) == (result.id, corr, "email.send")
    # Posted again, as a drain running beside the on-commit post would: the same job.
    with relay.client() as client:
        [again] = client.submit_batch([outbox.request_for(row)])
    assert (again.status, again.job.id) == (200, job.id)
    assert drain().posted == 0
    assert [j.id for j in jobs_on_relay(relay, corr)] == [job.id]
    assert email_send.get_result(result.id).id == result.id
    assert email_send.get_result(result.id).status in (
        TaskResultStatus.READY,
        TaskResultStatus.RUNNING,
        TaskResultStatus.SUCCESSFUL,
    )


@pytest.mark.parametrize("n", [1, 300])
def test_a_process_killed_between_commit_and_post_gets_its_jobs_from_the_drain(relay, relay_settings, n):
    corr = f"crash-{uuid.uuid4()}"
    child = subprocess.Popen(
        [sys.executable, str(EXAMPLE.parent / "tests" / "crash_after_commit.py"), corr, str(n)],
        cwd=EXAMPLE,
        env=child_env(connection.settings_dict["NAME"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    stdout = child.stdout
    try:
        lines = []
        wait_for(
            "the child to commit",
            lambda: lines.append(stdout.readline()) or "committed\n" in lines,  # type: ignore[func-returns-value]
            timeout=60,
            every=0,
        )
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL, err
    assert "posted\n" not in lines
    rows = RelayJob.objects.filter(correlation_id=corr)
    assert rows.count() == n and not rows.filter(posted_at__isnull=False).exists(), "the kill came before the post"
    assert jobs_on_relay(relay, corr) == [], "Relay has not heard of them"
    assert drain().posted == n
    jobs = jobs_on_relay(relay, corr)
    assert sorted(j.idempotency_key for j in jobs) == sorted(str(pk) for pk in rows.values_list("pk", flat=True))
    assert drain().posted == 0
    assert len(jobs_on_relay(relay, corr)) == n


def test_relay_unreachable_at_commit_leaves_the_row_for_the_drain(relay, relay_settings):
    corr = f"down-{uuid.uuid4()}"
    url = relay_settings["URL"]
    relay_settings["URL"] = "http://127.0.0.1:1"
    try:
        with transaction.atomic(), correlation(corr):
            result = noop.enqueue()
    finally:
        relay_settings["URL"] = url
    row = wait_for("the post to fail", lambda: RelayJob.objects.filter(pk=result.id, post_code="transport").first())
    assert row.posted_at is None and "transport" in row.post_error
    assert drain().posted == 1
    assert len(jobs_on_relay(relay, corr)) == 1


def test_the_periodic_drain_runs_as_local_work(relay, relay_settings):
    from relay_client.django.periodic import drain_outbox

    corr = f"periodic-{uuid.uuid4()}"
    url = relay_settings["URL"]
    relay_settings["URL"] = "http://127.0.0.1:1"
    try:
        with transaction.atomic(), correlation(corr):
            noop.enqueue()
    finally:
        relay_settings["URL"] = url
    drain_outbox.enqueue(min_age_seconds=0)
    out = run_manage("db_worker", "--batch", "--no-startup-delay", db_name=connection.settings_dict["NAME"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert RelayJob.objects.get(correlation_id=corr).posted_at is not None
    assert len(jobs_on_relay(relay, corr)) == 1


def test_one_commit_posts_what_it_kept_and_nothing_a_rolled_back_savepoint_dropped(relay, relay_settings):
    corr = f"savepoints-{uuid.uuid4()}"

    def dropped(echo: str) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            noop.enqueue(echo=echo)
            raise RuntimeError("this savepoint rolls back")

    with transaction.atomic(), correlation(corr):
        dropped("first, dropped")  # the transaction's first enqueue goes with its savepoint
        kept = [noop.enqueue(echo="a").id]
        dropped("b, dropped")
        with transaction.atomic():
            kept.append(noop.enqueue(echo="c").id)  # a savepoint that is released: kept
        kept.append(noop.enqueue(echo="d").id)
    rows = RelayJob.objects.filter(correlation_id=corr)
    assert sorted(str(pk) for pk in rows.values_list("pk", flat=True)) == sorted(kept)
    assert not rows.filter(posted_at__isnull=True).exists(), "the commit posted every row it kept"
    assert sorted(j.idempotency_key for j in jobs_on_relay(relay, corr)) == sorted(kept)
