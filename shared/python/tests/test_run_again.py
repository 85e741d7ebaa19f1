"""Run again: a failed local task re-enqueued once with its arguments (the admin's action on
django-tasks-db's results and on the local runs, and ``rerun``), the new result linking the old."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django_tasks_db.models import DBTaskResult

from relay_client.django.local import NotFailed, rerun
from relay_client.django.records import LocalRun
from relay_client.django.status import document
from shop.models import Order
from shop.tasks import order_id

from .test_local_attempts import work

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_admin_runs_a_failed_task_again_once_and_the_new_result_links_the_old():
    failed = order_id.enqueue("late@example.com")
    work(1)
    assert DBTaskResult.objects.get(id=failed.id).status == "FAILED"
    assert any(e["job_id"] == str(failed.id) for e in document()["exceptions"])
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/django_tasks_database/dbtaskresult/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "shop.tasks.order_id" in html and "DoesNotExist: Order matching query does not exist." in html, html[:3000]
    Order.objects.create(email="late@example.com", total_cents=100)  # the cause fixed
    action = {"action": "run_again", "_selected_action": [str(failed.id)]}
    res = client.post("/admin/django_tasks_database/dbtaskresult/", action, follow=True)
    said = [str(m) for m in res.context["messages"]] if res.context else []
    assert len(said) == 1 and said[0].startswith(f"run again: {failed.id} as "), said
    # Twice (a double click, a second operator): still one re-run.
    client.post("/admin/relay/localrun/", {"action": "run_again", "_selected_action": [str(failed.id)]})
    again = LocalRun.objects.get(rerun_of=str(failed.id))
    assert LocalRun.objects.get(pk=str(failed.id)).rerun_as == again.result_id
    assert DBTaskResult.objects.filter(task_path="shop.tasks.order_id").count() == 2
    new = DBTaskResult.objects.get(id=again.result_id)
    assert new.args_kwargs == {"args": ["late@example.com"], "kwargs": {}} and new.status == "READY"
    assert rerun(str(failed.id)).id == again.result_id
    # Run again, the failure is no longer an open exception, and its run names the re-run.
    doc = document()
    assert not any(e["job_id"] == str(failed.id) for e in doc["exceptions"])
    [shown] = [r for r in doc["recent_runs"] if r["id"] == str(failed.id)]
    assert shown["last_error"].endswith(f"does not exist. (run again as {again.result_id})"), shown
    work(1)
    new.refresh_from_db()
    assert (new.status, new.return_value) == ("SUCCESSFUL", Order.objects.get().pk)
    with pytest.raises(NotFailed):
        rerun(again.result_id)


def test_run_records_of_pruned_results_are_deleted_with_them():
    from relay_client.django.local import prune_orphans

    kept, pruned = order_id.enqueue("a@example.com"), order_id.enqueue("b@example.com")
    DBTaskResult.objects.filter(id=pruned.id).delete()  # django-tasks-db's prune_db_task_results
    assert prune_orphans() == 1
    assert list(LocalRun.objects.values_list("result_id", flat=True)) == [str(kept.id)]
