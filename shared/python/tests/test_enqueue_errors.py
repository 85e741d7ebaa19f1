"""Items 3 and 4 of issue 36: what Relay would refuse is refused at ``.enqueue()`` from the task's
published schema; what only Relay can check is marked on the row with a signal, and rows stuck
behind a 401/403/409 make ``relay_drain`` fail; configuration mistakes fail ``manage.py check``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from relay_client.django import catalogue, correlation, drain, relay_task
from relay_client.django._compat import InvalidTask
from relay_client.django.catalogue import InvalidParams
from relay_client.django.models import RelayJob
from relay_client.django.signals import job_blocked, job_refused
from relay_client.django.status import document
from shop.tasks import email_send, noop

from .conftest import jobs_on_relay, run_manage

pytestmark = pytest.mark.django_db(transaction=True)

FROM = {"from": "shop@example.com"}


class Received:
    def __init__(self, signal) -> None:
        self.calls: list[dict] = []
        self.signal = signal

    def __enter__(self) -> Received:
        self.signal.connect(self.receive, dispatch_uid=id(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self.signal.disconnect(dispatch_uid=id(self))

    def receive(self, sender, **kwargs) -> None:
        self.calls.append(kwargs)


def test_parameters_the_schema_refuses_raise_at_enqueue_naming_the_field(relay, relay_conf):
    with pytest.raises(InvalidParams) as e, transaction.atomic():
        email_send.enqueue(**FROM, to="not-an-email", subject="s", text="t")
    assert list(e.value.message_dict) == ["to"] and "array" in e.value.message_dict["to"][0]
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(**FROM, to=["a@example.com"], subjcet="typo", text="t")
    assert e.value.message_dict == {"subjcet": ["this task takes no such parameter"]}
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(to=["a@example.com"], text="t")
    assert e.value.message_dict == {"from": ["this field is required"]}
    with pytest.raises(InvalidParams) as e:
        relay_task("sleep").enqueue(seconds="ten")
    assert list(e.value.message_dict) == ["seconds"]
    with pytest.raises(InvalidParams, match="bytes: Relay takes at most"):
        noop.enqueue(echo="x" * 2_200_000)
    with pytest.raises(InvalidParams) as e:
        email_send.enqueue(**FROM, to=[f"u{i}@example.com" for i in range(51)], subject="s", text="t")
    assert e.value.message_dict == {"to": ["51 items: at most 50"]}, "the count, not the 51 addresses"
    with pytest.raises(TypeError, match=r"noop: parameter 'echo' is not JSON .*datetime.*isoformat"):
        noop.enqueue(echo={"at": datetime.now(UTC)})
    assert not RelayJob.objects.exists(), "nothing was written"


def test_an_unknown_task_type_fails_at_its_first_enqueue(relay, relay_conf):
    emial = relay_task("emial.send")
    with pytest.raises(InvalidTask, match="no task type 'emial.send'.*email.send"):
        emial.enqueue(**FROM, to=["a@example.com"], text="t")
    assert not RelayJob.objects.exists()
    cat = catalogue.current()
    assert cat is not None and len(cat.version) == 64


def test_what_only_relay_checks_marks_the_row_refused_and_signals(relay, relay_conf):
    corr = f"only-relay-{uuid.uuid4()}"
    with Received(job_refused) as refused, transaction.atomic(), correlation(corr):
        # A header Relay sets itself: a check the published schema does not carry (an address that
        # is not one is refused at .enqueue(): test_rules).
        result = email_send.enqueue(**FROM, to=["a@example.com"], subject="s", text="t", headers={"Reply-To": "x"})
    row = RelayJob.objects.get(pk=result.id)
    assert (row.status, row.post_code) == ("refused", "invalid_params"), row.post_error
    [call] = refused.calls
    assert call["row"].pk == row.pk and call["error"].field == "params.headers.Reply-To"
    assert email_send.get_result(result.id).errors, "the TaskResult says why"
    assert document()["failures"]["last_hour"] == 1, "the status view counts it"
    assert jobs_on_relay(relay, corr) == []


def test_a_409_blocks_the_row_the_drain_leaves_it_and_relay_drain_fails_until_the_tenant_acts(relay, relay_conf):
    corr = f"blocked-{uuid.uuid4()}"
    name = f"dest{uuid.uuid4().hex[:8]}"
    http_request = relay_task("http.request")
    with Received(job_blocked) as blocked, transaction.atomic(), correlation(corr):
        result = http_request.enqueue(destination=name, method="POST", path="/hook", body={"a": 1})
    row = RelayJob.objects.get(pk=result.id)
    assert (row.status, row.post_code, row.posted_at) == ("blocked", "unknown_destination", None)
    assert [c["row"].pk for c in blocked.calls] == [row.pk]
    assert document()["failures"]["open_exceptions"] == 1, "the status view shows it"
    report = drain()
    assert (report.posted, report.blocked, report.stuck) == (0, 0, 1), "a blocked row is not offered again"
    db = connection.settings_dict["NAME"]
    out = run_manage("relay_drain", db_name=db, check=False)
    assert out.returncode != 0 and "1 outbox rows are stuck" in out.stderr, out.stdout + out.stderr
    res = relay.api("PUT", f"/v1/destinations/{name}", json={"base_url": "http://127.0.0.1:9/"})
    assert res.status_code in (200, 201), res.text
    out = run_manage("relay_drain", "--blocked", db_name=db, check=False)
    assert out.returncode == 0 and "posted 1" in out.stdout, out.stdout + out.stderr
    assert [j.idempotency_key for j in jobs_on_relay(relay, corr)] == [result.id]


def test_a_wrong_api_key_leaves_rows_unsent_signals_once_and_relay_drain_fails(relay, relay_conf):
    corr = f"wrong-key-{uuid.uuid4()}"
    catalogue.current()  # the schema was fetched with the right key
    relay_conf["API_KEY"] = "rk_wrong"
    with Received(job_blocked) as blocked:
        for _ in range(2):
            with transaction.atomic(), correlation(corr):
                noop.enqueue()
        report = drain()
    assert (report.posted, report.stuck) == (0, 2) and "401" in report.error, report
    assert set(RelayJob.objects.values_list("status", "post_code")) == {("unsent", "unauthorized")}
    assert len(blocked.calls) == 2, "one signal per row, not one per retry"
    db = connection.settings_dict["NAME"]
    out = run_manage("relay_drain", db_name=db, check=False, env_overrides={"RELAY_API_KEY": "rk_wrong"})
    assert out.returncode != 0 and "stuck" in out.stderr, out.stdout + out.stderr
    out = run_manage("relay_drain", db_name=db, check=False, env_overrides={"RELAY_API_KEY": relay.key})
    assert out.returncode == 0 and "posted 2" in out.stdout, out.stdout + out.stderr
    assert len(jobs_on_relay(relay, corr)) == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RELAY_API_KEY": ""}, "relay.E003"),
        ({"RELAY_URL": "relay.internal:8080"}, "relay.E002"),
        ({"RELAY_SIGNING_SECRETS": "not-a-secret"}, "relay.E004"),
    ],
)
def test_configuration_mistakes_fail_manage_py_check(relay, relay_settings, env, message):
    db = connection.settings_dict["NAME"]
    assert run_manage("check", db_name=db, check=False).returncode == 0
    out = run_manage("check", db_name=db, check=False, env_overrides=env)
    assert out.returncode != 0 and message in out.stderr, out.stdout + out.stderr


def test_a_schema_relay_no_longer_holds_is_dropped_when_relay_refuses_what_it_let_through(relay, relay_conf):
    fresh = catalogue.current()
    assert fresh is not None
    # As if the cached copy predated a change that made `sleep` stricter.
    stale = catalogue.Catalogue("stale", fresh.fetched_at, {**fresh.schemas, "sleep": {"type": "object"}})
    catalogue._cached = stale
    with transaction.atomic():
        result = relay_task("sleep").enqueue(seconds="ten")
    assert RelayJob.objects.get(pk=result.id).status == "refused"
    assert catalogue._cached is None, "the copy that let it through was dropped"
    with pytest.raises(InvalidParams):
        relay_task("sleep").enqueue(seconds="ten")
    assert catalogue.current() is not None and catalogue.current().version == fresh.version
