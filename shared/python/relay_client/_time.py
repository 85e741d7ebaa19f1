"""Relay's times on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time from Relay (``Z`` or an offset), or None."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
