"""A synchronous client for Relay's job API (``/v1/jobs``), on httpx.

Every submit carries an idempotency key and a correlation id chosen by the caller. A submit
whose answer is lost (timeout, connection reset, 503, 429, 409 ``retry``) is sent again with
the same key, so Relay answers the retry with the job it already created (200) instead of a
second job.
"""

from __future__ import annotations

import builtins
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from ._time import parse_time
from .errors import RelayError, TransportError, error_for
from .resources import MAX_PAGE, Destination, PageReceipt, Suppression, SuppressionPage, Template

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
#: Relay's limits on one job submission: the body (``MAX_JOB_BODY_BYTES`` in
#: ``shared/core/src/api``) and the items of one ``POST /v1/jobs:batch``.
MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_BATCH = 500
#: Relay's job statuses, in the order a job normally moves through them.
STATUSES = ("pending", "waiting", "running", "succeeded", "failed", "cancelled")


_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """One TLS context for every client: loading the CA bundle costs ~0.3 s, a client is cheap."""
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            import certifi

            _ssl_context = ssl.create_default_context(cafile=certifi.where())
        return _ssl_context


@dataclass(frozen=True)
class Job:
    """The job resource, with the fields a client reads most; ``raw`` holds all of them."""

    id: str
    task_type: str
    status: str
    correlation_id: str
    idempotency_key: str
    updated_at: datetime
    attempt: int = 0
    progress: dict[str, Any] | None = None
    result: Any = None
    waiting_reason: str | None = None
    last_error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Job:
        updated = parse_time(d.get("updated_at"))
        if updated is None:
            raise ValueError("a job resource without updated_at")
        return cls(
            id=str(d["id"]),
            task_type=str(d["task_type"]),
            status=str(d["status"]),
            correlation_id=str(d.get("correlation_id", "")),
            idempotency_key=str(d.get("idempotency_key", "")),
            updated_at=updated,
            attempt=int(d.get("attempt") or 0),
            progress=d.get("progress"),
            result=d.get("result"),
            waiting_reason=d.get("waiting_reason"),
            last_error=d.get("last_error"),
            started_at=parse_time(d.get("started_at")),
            finished_at=parse_time(d.get("finished_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class JobRequest:
    """One job to submit. ``idempotency_key`` and ``correlation_id`` are mandatory."""

    task_type: str
    idempotency_key: str
    correlation_id: str
    params: Mapping[str, Any] = field(default_factory=dict)
    run_at: datetime | None = None
    delay_seconds: int | None = None
    max_attempts: int | None = None
    timeout_seconds: int | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    callback_url: str | None = None
    #: Ids of this tenant's jobs (at most 100) this one runs after: it waits, pending, until each
    #: has succeeded, and is cancelled (naming the dependency) if one ends otherwise.
    after: Sequence[str] = ()
    #: FIFO per key: this tenant's jobs with one ordering key start in submission order, one at
    #: a time, each once the one ahead has succeeded.
    ordering_key: str | None = None
    #: What this job's failure does to the jobs behind it on its key: ``"hold"`` (Relay's
    #: default) or ``"cancel"``. Only with ``ordering_key``.
    ordering_on_failure: str | None = None

    def __post_init__(self) -> None:
        if not self.idempotency_key:
            raise ValueError("an idempotency key is mandatory")
        if not self.correlation_id:
            raise ValueError("a correlation id is mandatory")
        if isinstance(self.after, str):
            raise ValueError("after is a list of job ids, not one string")

    def body(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/jobs`` (the key goes in a header there)."""
        out: dict[str, Any] = {
            "task_type": self.task_type,
            "params": dict(self.params),
            "correlation_id": self.correlation_id,
        }
        if self.run_at is not None:
            out["run_at"] = self.run_at.isoformat()
        for name in (
            "delay_seconds",
            "max_attempts",
            "timeout_seconds",
            "concurrency_key",
            "concurrency_limit",
            "callback_url",
            "ordering_key",
            "ordering_on_failure",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.after:
            out["after"] = [str(a) for a in self.after]
        return out

    def batch_item(self) -> dict[str, Any]:
        """One item of ``POST /v1/jobs:batch`` (the key inside the item)."""
        return {**self.body(), "idempotency_key": self.idempotency_key}


@dataclass(frozen=True)
class BatchResult:
    """One item of a batch answer: ``job`` when created (202) or replayed (200), else ``error``."""

    status: int
    job: Job | None
    error: RelayError | None

    @property
    def created(self) -> bool:
        return self.status == 202


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None
    #: Pass back later as ``updated_since`` to see every job changed after this page.
    resume_cursor: str


class RelayClient:
    """Relay's job API for one tenant.

    ``attempts`` bounds how often one request is sent (timeouts and retryable answers); the
    wait between attempts doubles from ``backoff`` seconds, or follows ``Retry-After``.
    ``timeout`` bounds each wait on the network (connect, send, each read), ``connect_timeout``
    the connect alone when given.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        attempts: int = 4,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"authorization": f"Bearer {api_key}", "user-agent": "relay-client-python/0.1"},
            timeout=httpx.Timeout(timeout, connect=connect_timeout if connect_timeout is not None else timeout),
            transport=transport,
            verify=_tls(),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RelayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> Job:
        """``POST /v1/jobs``. A replay of the same request (same key) returns the same job."""
        data = self._call("POST", "/v1/jobs", json=request.body(), headers={"idempotency-key": request.idempotency_key})
        return Job.from_json(data)

    def submit_batch(self, requests: Sequence[JobRequest]) -> list[BatchResult]:
        """``POST /v1/jobs:batch`` (1 to 500 items); one result per item, in order.

        An error of the whole request (413 over the body limit, 401, 5xx, no answer) raises: it
        says nothing about any one item.
        """
        data = self._call("POST", "/v1/jobs:batch", json={"jobs": [r.batch_item() for r in requests]})
        out = []
        for i, r in enumerate(data["results"]):
            status = int(r["status"])
            job = Job.from_json(r["job"]) if r.get("job") else None
            err = error_for(status, {"error": r["error"]}) if r.get("error") else None
            if err is not None and isinstance(err.details.get("field"), str):
                # The field as a submit of this one item names it (`params.to[0]`, not `jobs[3].params.to[0]`).
                err.details["field"] = err.details["field"].removeprefix(f"jobs[{i}].")
            out.append(BatchResult(status, job, err))
        return out

    def tasks(self) -> list[dict[str, Any]]:
        """``GET /v1/tasks``: the catalogue a tenant may submit, each task with its ``params_schema``."""
        return list(self._call("GET", "/v1/tasks")["tasks"])

    def get(self, job_id: str) -> Job:
        return Job.from_json(self._call("GET", f"/v1/jobs/{job_id}"))

    def cancel(self, job_id: str) -> Job:
        """Cancel a pending or waiting job; ``Conflict`` (``not_cancellable``) otherwise."""
        return Job.from_json(self._call("POST", f"/v1/jobs/{job_id}/cancel"))

    def list(
        self,
        *,
        status: str | None = None,
        task_type: str | None = None,
        correlation_id: str | None = None,
        updated_since: datetime | str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> JobPage:
        """One page of ``GET /v1/jobs``, ordered by (updated_at, id): a change feed."""
        since = updated_since.isoformat() if isinstance(updated_since, datetime) else updated_since
        query = {
            k: v
            for k, v in {
                "status": status,
                "task_type": task_type,
                "correlation_id": correlation_id,
                "updated_since": since,
                "cursor": cursor,
                "limit": limit,
            }.items()
            if v is not None
        }
        data = self._call("GET", "/v1/jobs", params=query)
        return JobPage([Job.from_json(j) for j in data["jobs"]], data.get("next_cursor"), data["resume_cursor"])

    def changes(self, updated_since: datetime | str, *, limit: int = 500) -> Iterator[Job]:
        """Every job changed at or after ``updated_since``, following the cursor to the end."""
        page = self.list(updated_since=updated_since, limit=limit)
        yield from page.jobs
        while page.next_cursor:
            page = self.list(cursor=page.next_cursor, limit=limit)
            yield from page.jobs

    def message_events(
        self, *, updated_since: datetime | str | None = None, cursor: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """One page of ``GET /v1/messages/events``: ``{"events", "next_cursor", "resume_cursor"}``,
        the tenant's message events in the order Relay received them."""
        since = updated_since.isoformat() if isinstance(updated_since, datetime) else updated_since
        query = {k: v for k, v in {"updated_since": since, "cursor": cursor, "limit": limit}.items() if v is not None}
        data: dict[str, Any] = self._call("GET", "/v1/messages/events", params=query)
        return data

    # -- email: templates, campaign pages, suppressions -----------------------------------------

    def put_template(self, name: str, *, subject: str, text: str | None = None, html: str | None = None) -> Template:
        """``PUT /v1/templates/{name}``: create or replace a template (text, html or both); a part
        that does not compile is ``InvalidRequest`` ``template_syntax`` naming it."""
        body = {k: v for k, v in {"subject": subject, "text": text, "html": html}.items() if v is not None}
        return Template.from_json(self._call("PUT", f"/v1/templates/{_segment(name)}", json=body))

    def get_template(self, name: str) -> Template:
        return Template.from_json(self._call("GET", f"/v1/templates/{_segment(name)}"))

    def templates(self) -> builtins.list[Template]:
        return [Template.from_json(t) for t in self._call("GET", "/v1/templates")["templates"]]

    def delete_template(self, name: str) -> None:
        self._call("DELETE", f"/v1/templates/{_segment(name)}")

    def put_recipients(self, job_id: str, page: int, recipients: Sequence[Mapping[str, Any]]) -> PageReceipt:
        """``PUT /v1/jobs/{id}/recipients/{page}``: one page (1 to 5,000 ``{"to", "data"?}``) of a
        paged ``email.campaign`` (submitted with ``"pages": n``); idempotent per page. The
        campaign falls due when its last page lands (``released``)."""
        res = self._request("PUT", f"/v1/jobs/{job_id}/recipients/{int(page)}", json={"recipients": list(recipients)})
        return PageReceipt.from_json(res.json(), stored=res.status_code == 201)

    def put_recipient_pages(
        self, job_id: str, recipients: Sequence[Mapping[str, Any]], *, page_size: int = MAX_PAGE
    ) -> builtins.list[PageReceipt]:
        """Every page of a paged campaign from one list, ``page_size`` (at most ``MAX_PAGE``)
        recipients a page, in order: the campaign's ``pages`` is ``ceil(len(recipients) / page_size)``."""
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size is 1 to {MAX_PAGE}, not {page_size}")
        return [
            self.put_recipients(job_id, n, recipients[start : start + page_size])
            for n, start in enumerate(range(0, len(recipients), page_size))
        ]

    def suppressions(self, *, after: str | None = None, limit: int | None = None) -> SuppressionPage:
        """One page of ``GET /v1/suppressions`` in address order; pass ``next_after`` back for the next."""
        query = {k: v for k, v in {"after": after, "limit": limit}.items() if v is not None}
        data = self._call("GET", "/v1/suppressions", params=query)
        return SuppressionPage([Suppression.from_json(s) for s in data["suppressions"]], data.get("next_after"))

    def suppress(self, address: str) -> None:
        """``PUT /v1/suppressions/{address}``: stop sending to a bare address (``manual``)."""
        self._call("PUT", f"/v1/suppressions/{_segment(address)}")

    def unsuppress(self, address: str) -> None:
        """``DELETE /v1/suppressions/{address}``: send to it again (``NotFound`` if not listed)."""
        self._call("DELETE", f"/v1/suppressions/{_segment(address)}")

    # -- callbacks ----------------------------------------------------------------------------

    def set_callbacks(self, url: str | None, *, message_events: Sequence[str] | None = None) -> dict[str, Any]:
        """``PUT /v1/callbacks``: where the tenant's callbacks go (the first call answers the
        signing ``secret``, shown once); ``message_events`` None keeps the subscribed types."""
        body: dict[str, Any] = {"url": url}
        if message_events is not None:
            body["message_events"] = [str(t) for t in message_events]
        data: dict[str, Any] = self._call("PUT", "/v1/callbacks", json=body)
        return data

    def callback_settings(self) -> dict[str, Any]:
        """``GET /v1/callbacks`` (never the secret)."""
        data: dict[str, Any] = self._call("GET", "/v1/callbacks")
        return data

    def rotate_callback_secret(self, *, overlap_seconds: int | None = None) -> dict[str, Any]:
        """``POST /v1/callbacks/rotate``: a new secret (shown once); the old one signs too until the overlap ends."""
        body = {} if overlap_seconds is None else {"overlap_seconds": overlap_seconds}
        data: dict[str, Any] = self._call("POST", "/v1/callbacks/rotate", json=body)
        return data

    # -- destinations -------------------------------------------------------------------------

    def put_destination(
        self,
        name: str,
        *,
        base_url: str,
        auth_header: str | None = None,
        timeout_ms: int | None = None,
        rate_per_second: float | None = None,
        url_patterns: Sequence[str] | None = None,
        max_in_flight: int | None = None,
        oauth: Mapping[str, Any] | None = None,
        signature: Mapping[str, Any] | None = None,
        success: Mapping[str, Any] | None = None,
    ) -> Destination:
        """``PUT /v1/destinations/{name}``: create or replace (the secret's value is set apart, with
        ``set_destination_secret``, and never read back).

        ``oauth``: a grant that mints the token (``{"grant": "client_credentials", "token_url",
        "client_id", ...}``; its client secret with ``set_destination_client_secret``);
        ``signature``: ``webhook.send``'s HMAC scheme when not Standard Webhooks; ``success``:
        which answers succeed (``{"json": {"pointer": "/ok", "equals": True}}``). See the API
        documentation for their fields."""
        body: dict[str, Any] = {"base_url": base_url}
        optional: tuple[tuple[str, Any], ...] = (
            ("auth_header", auth_header),
            ("timeout_ms", timeout_ms),
            ("rate_per_second", rate_per_second),
            ("max_in_flight", max_in_flight),
            ("oauth", dict(oauth) if oauth is not None else None),
            ("signature", dict(signature) if signature is not None else None),
            ("success", dict(success) if success is not None else None),
        )
        for k, v in optional:
            if v is not None:
                body[k] = v
        if url_patterns is not None:
            body["url_patterns"] = list(url_patterns)
        return Destination.from_json(self._call("PUT", f"/v1/destinations/{_segment(name)}", json=body))

    def get_destination(self, name: str) -> Destination:
        return Destination.from_json(self._call("GET", f"/v1/destinations/{_segment(name)}"))

    def destinations(self) -> builtins.list[Destination]:
        return [Destination.from_json(d) for d in self._call("GET", "/v1/destinations")["destinations"]]

    def delete_destination(self, name: str) -> None:
        self._call("DELETE", f"/v1/destinations/{_segment(name)}")

    def set_destination_secret(self, name: str, value: str) -> None:
        """The auth header's value (kept in Secrets Manager; never returned)."""
        self._call("PUT", f"/v1/destinations/{_segment(name)}/secret", json={"value": value})

    def set_destination_signing_secret(self, name: str, value: str) -> None:
        """The secret ``webhook.send`` signs with: ``whsec_…``, or the receiver's own for a
        ``signature`` whose ``key`` is ``raw`` (never returned)."""
        self._call("PUT", f"/v1/destinations/{_segment(name)}/signing-secret", json={"value": value})

    def set_destination_client_secret(self, name: str, value: str) -> None:
        """The ``oauth`` grant's client secret (never returned)."""
        self._call("PUT", f"/v1/destinations/{_segment(name)}/client-secret", json={"value": value})

    def set_destination_refresh_token(self, name: str, value: str) -> None:
        """The ``oauth`` refresh-token grant's refresh token (never returned)."""
        self._call("PUT", f"/v1/destinations/{_segment(name)}/refresh-token", json={"value": value})

    def set_destination_writes(self, name: str, enabled: bool, *, reason: str | None = None) -> Destination:
        """The tenant's own write switch for one destination (off: its calls are held)."""
        body: dict[str, Any] = {"enabled": enabled}
        if reason is not None:
            body["reason"] = reason
        return Destination.from_json(self._call("PUT", f"/v1/destinations/{_segment(name)}/writes", json=body))

    # -- transport ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON of a successful answer (None for 204 No Content); an error answer raises."""
        res = self._request(method, path, **kwargs)
        return None if res.status_code == 204 or not res.content else res.json()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts
            try:
                res = self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                # Timed out or no connection: the request may have landed; the same key makes
                # the retry safe.
                if last:
                    # The full URL: "connection refused" most often means a Relay not running there.
                    url = f"{str(self._http.base_url).rstrip('/')}{path}"
                    raise TransportError(0, "transport", f"{method} {url}: {e!r}") from e
                time.sleep(delay)
                delay *= 2
                continue
            if res.is_success:
                return res
            try:
                body = res.json()
            except ValueError:
                body = None
            err = error_for(res.status_code, body, res.headers.get("retry-after"))
            if last or not _retryable(err):
                raise err
            after = res.headers.get("retry-after")
            time.sleep(min(float(after), 10.0) if after and after.isdigit() else delay)
            delay *= 2
        raise AssertionError("unreachable")


def _retryable(err: RelayError) -> bool:
    return err.status in (429, 503) or (err.status == 409 and err.code == "retry")


def _segment(value: str) -> str:
    """One path segment: ``/``, ``?`` and ``#`` (and the rest) escaped."""
    return quote(str(value), safe="@")
