"""The tenant's resources beside its jobs, as ``RelayClient`` returns them: email templates, a
paged campaign's recipient pages, destinations (their secrets are written, never read back),
suppressions. Each keeps Relay's whole answer in ``raw``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._time import parse_time

#: The most recipients one campaign page takes (``PUT /v1/jobs/{id}/recipients/{page}``).
MAX_PAGE = 5000


@dataclass(frozen=True)
class Template:
    """A stored email template (``PUT /v1/templates/{name}``): MiniJinja text filled by each job's ``data``."""

    name: str
    subject: str
    text: str | None
    html: str | None
    updated_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Template:
        return cls(
            name=str(d["name"]),
            subject=str(d["subject"]),
            text=d.get("text_body", d.get("text")),
            html=d.get("html_body", d.get("html")),
            updated_at=parse_time(d.get("updated_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class PageReceipt:
    """Relay's receipt for one campaign page: ``released`` once every page is in (the campaign is due)."""

    page: int
    pages_received: int
    pages: int
    released: bool
    #: False when Relay already held this page (a replay: 200, nothing changed).
    stored: bool = True

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, stored: bool = True) -> PageReceipt:
        return cls(int(d["page"]), int(d["pages_received"]), int(d["pages"]), bool(d["released"]), stored)


@dataclass(frozen=True)
class Destination:
    """An outside HTTP API the tenant registered for ``http.request`` and ``webhook.send``.

    Secrets are never read back: ``secret_set_at``, ``signing_secret_set_at``,
    ``client_secret_set_at`` and ``refresh_token_set_at`` say when they were written.
    """

    name: str
    base_url: str
    auth_header: str | None
    timeout_ms: int
    rate_per_second: float
    url_patterns: list[str]
    writes_enabled: bool
    secret_set_at: datetime | None
    signing_secret_set_at: datetime | None
    #: ``{"outcome", "http_status", "at"}`` of the latest call, if any.
    last_call: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The OAuth grant minting the token, ``webhook.send``'s signature scheme, the success rule.
    oauth: dict[str, Any] | None = None
    signature: dict[str, Any] | None = None
    success: dict[str, Any] | None = None
    client_secret_set_at: datetime | None = None
    refresh_token_set_at: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Destination:
        return cls(
            name=str(d["name"]),
            base_url=str(d["base_url"]),
            auth_header=d.get("auth_header"),
            timeout_ms=int(d.get("timeout_ms") or 0),
            rate_per_second=float(d.get("rate_per_second") or 0),
            url_patterns=list(d.get("url_patterns") or []),
            writes_enabled=bool(d.get("writes_enabled", True)),
            secret_set_at=parse_time(d.get("secret_set_at")),
            signing_secret_set_at=parse_time(d.get("signing_secret_set_at")),
            last_call=d.get("last_call"),
            raw=dict(d),
            oauth=d.get("oauth"),
            signature=d.get("signature"),
            success=d.get("success"),
            client_secret_set_at=parse_time(d.get("client_secret_set_at")),
            refresh_token_set_at=parse_time(d.get("refresh_token_set_at")),
        )


@dataclass(frozen=True)
class Suppression:
    """An address the tenant's mail no longer goes to: ``reason`` ``bounce``, ``complaint`` or ``manual``."""

    address: str
    reason: str
    detail: str | None
    message_id: str | None
    created_at: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Suppression:
        return cls(
            address=str(d["address"]),
            reason=str(d["reason"]),
            detail=d.get("detail"),
            message_id=d.get("message_id"),
            created_at=parse_time(d.get("created_at")),
        )


@dataclass(frozen=True)
class SuppressionPage:
    suppressions: list[Suppression]
    #: Pass back as ``after`` for the next page; None on the last.
    next_after: str | None
