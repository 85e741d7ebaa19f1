"""Fixtures: a real ``relay dev`` (its own database on the test Postgres), the dev tenant's key,
callbacks pointed at pytest-django's live server, and helpers to wait and sign.

``RELAY_BIN`` names the relay binary (``cargo test`` passes the one it built); the Postgres
server is the one in ``DATABASE_URL`` (default 127.0.0.1:5432, user postgres).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import psycopg
import pytest
from django.conf import settings

from relay_client import RelayClient

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "example"


@dataclass
class Relay:
    url: str
    key: str
    status_key: str
    database_url: str
    bin: str
    log: Path

    def client(self, **kwargs) -> RelayClient:
        return RelayClient(self.url, self.key, **kwargs)

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(
            method, self.url + path, headers={"authorization": f"Bearer {self.key}"}, timeout=10, **kwargs
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_url(dbname: str) -> str:
    base = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    return urlunparse(base._replace(path=f"/{dbname}"))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="session")
def tmp_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("relay")


@pytest.fixture(scope="session")
def relay(tmp_dir: Path) -> Iterator[Relay]:
    """``relay dev`` on a free port with a database of its own, dropped afterwards."""
    binary = os.environ.get("RELAY_BIN")
    if not binary or not Path(binary).exists():
        pytest.fail("RELAY_BIN must name the relay binary (cargo test sets it; or target/debug/relay)")
    dbname = f"relay_py_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{dbname}"')
    db_url = server_url(dbname)
    port = free_port()
    log = tmp_dir / "relay-dev.log"
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RELAY_CALLBACK_ALLOW": "127.0.0.1/32",
        "RELAY_LOG": "warn",
        "RELAY_SWEEP_INTERVAL_SECONDS": "2",
    }
    proc = subprocess.Popen(
        [binary, "dev", "--addr", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        cwd=tmp_dir,  # its local secret store (.relay/) stays out of the source tree
    )
    try:
        key = proc.stdout.readline().strip() if proc.stdout else ""
        if not key:
            pytest.fail(f"relay dev printed no key: {log.read_text()}")
        url = f"http://127.0.0.1:{port}"
        wait_for("relay's /healthz", lambda: _answers(url + "/healthz"))
        status_key = subprocess.run(
            [binary, "status-key", "create", "console"], env=env, check=True, capture_output=True, text=True
        ).stdout.strip()
        # `relay dev` starts in shadow mode; callbacks (and only they: email stays unsent) must
        # really go out to the live server.
        for switch, value in (("shadow", "off"), ("write:callbacks", "on")):
            subprocess.run(
                [binary, "modes", "set", switch, value, "--reason", "python tests"],
                env=env,
                check=True,
                capture_output=True,
            )
        yield Relay(url, key, status_key, db_url, binary, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        with psycopg.connect(server_url("postgres"), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def relay_settings(relay: Relay) -> dict:
    """Point the project's ``RELAY`` setting at the test Relay."""
    from relay_client.django import catalogue

    # The suite's commits wait for their post, long enough for a loaded machine (a test reads
    # the posted row right after the commit); test_commit_bound measures the default, posting in
    # the background, and test_never_lose the bound.
    relay_settings: dict[str, Any] = settings.RELAY
    relay_settings.update(URL=relay.url, API_KEY=relay.key, STATUS_KEYS=["local-status-key"])
    relay_settings.update(POST_IN_BACKGROUND=False, POST_TIMEOUT=10.0)
    catalogue.invalidate()  # what the start-up prefetch learned (or failed to) before this URL
    return relay_settings


@pytest.fixture(scope="session")
def callbacks(relay: Relay, relay_settings: dict, live_server) -> str:
    """Relay's callbacks go to the live server; returns the signing secret (set in settings)."""
    res = relay.api("PUT", "/v1/callbacks", json={"url": f"{live_server.url}/relay/callbacks"})
    assert res.status_code == 200, res.text
    secret = res.json()["secret"]
    relay_settings["SIGNING_SECRETS"] = [secret]
    return secret


@pytest.fixture
def signing(relay_settings: dict, callbacks: str) -> Iterator[dict]:
    """The RELAY setting, restored after a test that changes its secrets."""
    before = list(relay_settings["SIGNING_SECRETS"])
    yield relay_settings
    relay_settings["SIGNING_SECRETS"] = before


@pytest.fixture
def relay_conf(relay_settings: dict) -> Iterator[dict]:
    """The RELAY setting for one test to change: restored after it, the catalogue cache dropped."""
    from relay_client.django import catalogue

    before = dict(relay_settings)
    catalogue.invalidate()
    yield relay_settings
    relay_settings.clear()
    relay_settings.update(before)
    catalogue.invalidate()


@pytest.fixture
def silent_relay() -> Iterator[str]:
    """A URL whose port accepts connections and never answers (a hung Relay or load balancer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def jobs_on_relay(relay: Relay, correlation_id: str) -> list:
    """Every job Relay holds with this correlation id, once each (following the cursor: the feed
    is in update order, so a job that changes while it is read comes again on a later page)."""
    out: dict = {}
    with relay.client() as client:
        page = client.list(correlation_id=correlation_id, limit=500)
        out.update((j.id, j) for j in page.jobs)
        while page.next_cursor:
            page = client.list(correlation_id=correlation_id, cursor=page.next_cursor, limit=500)
            out.update((j.id, j) for j in page.jobs)
    return list(out.values())


def run_manage(
    *args: str, db_name: str, check: bool = True, env_overrides: dict[str, str] | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """``manage.py`` of the example project in a subprocess, on the test database."""
    env = {**child_env(db_name), **(env_overrides or {})}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        check=check,
        **kwargs,
    )


def child_env(db_name: str) -> dict[str, str]:
    r: dict[str, Any] = settings.RELAY
    return {
        **os.environ,
        "DJANGO_DB_NAME": db_name,
        "RELAY_URL": r["URL"],
        "RELAY_API_KEY": r["API_KEY"],
        "RELAY_SIGNING_SECRETS": " ".join(r.get("SIGNING_SECRETS") or []),
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1, default=str)
