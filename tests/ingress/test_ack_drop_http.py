"""An `ack_drop` endpoint next to a retry endpoint (issue 15; seed 004 "L0 Ordinary Ingress":
"Security and protocol failures remain fail-closed", "`request_uri_resolve_failed` is the
single named fail-closed internal `503` exception"; SPEC ING-2, ING-3).

`crm` is the default (retryable 503) endpoint and `crm-drop` the same endpoint opted
into ack_drop. A security or protocol failure answers exactly the same on both (never
a 204); only an internal failure differs: 204 without Retry-After on `crm-drop`.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_port
from db.migrate import apply_migrations
from ingress.app import wall_clock_ms
from tests.ingress.support import (
    NOTHING_STORED,
    Live,
    counts,
    encode,
    event,
    execution,
    live_server,
    make_config,
    signed_headers,
)

RETRY, DROP, ACTIONS = "/webhooks/crm", "/webhooks/crm-drop", "/actions/crm"


@pytest.fixture
async def live(db_dsn: str) -> AsyncIterator[Live]:
    async with live_server(make_config(), db_dsn) as server:
        yield server


def _failing_request(case: str, path: str) -> tuple[bytes, dict[str, str]]:
    body = encode([event(1)])
    now = wall_clock_ms()
    match case:
        case "bad_signature":
            return body, signed_headers(body, path, secret="nope")
        case "stale_timestamp":
            return body, signed_headers(body, path, timestamp_ms=now - 301_000)
        case "unsigned":
            return body, {"content-type": "application/json"}
        case "malformed":
            return b"[{", signed_headers(b"[{", path)
        case "not_a_batch":
            return b"{}", signed_headers(b"{}", path)
        case "oversized":
            big = encode([event(i) for i in range(40)])
            return big, signed_headers(big, path)
    raise AssertionError(case)


CASES = {
    "bad_signature": 401,
    "stale_timestamp": 401,
    "unsigned": 401,
    "malformed": 400,
    "not_a_batch": 400,
    "oversized": 413,
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_security_and_protocol_failures_are_the_same_on_both_modes(
    live: Live, db_pool: asyncpg.Pool, case: str
) -> None:
    answers = []
    for path in (RETRY, DROP):
        body, headers = _failing_request(case, path)
        response = await live.client.post(path, content=body, headers=headers)
        answers.append((response.status_code, response.json().get("reason")))
    assert answers[0] == answers[1]
    assert answers[0][0] == CASES[case]  # never 204 for a security or protocol failure
    assert await counts(db_pool) == NOTHING_STORED


def _unverifiable_headers(case: str, body: bytes, path: str) -> dict[str, str]:
    headers = signed_headers(body, path)
    match case:
        case "unsigned":
            return {"content-type": "application/json"}
        case "no_timestamp":
            del headers["x-hubspot-request-timestamp"]
            return headers
        case "stale_timestamp":
            return signed_headers(body, path, timestamp_ms=wall_clock_ms() - 301_000)
    raise AssertionError(case)


async def _status_with_a_stalled_body(live: Live, path: str, headers: dict[str, str]) -> bytes:
    """POST the head and one byte of a body whose rest never comes; the status line."""
    host, port = live.base_url.removeprefix("http://").split(":")
    body = encode([event(1)])
    fields = {**headers, "host": "x", "content-length": str(len(body))}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + b"\r\n" + body[:1])
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("case", ["unsigned", "no_timestamp", "stale_timestamp"])
async def test_ing3_what_the_headers_refuse_is_401_on_both_modes_even_if_the_body_stalls(
    live: Live, db_pool: asyncpg.Pool, case: str
) -> None:
    """ING-3: a missing signature or timestamp, or a stale timestamp, is known from the
    headers alone, so it is a 401 in both modes without waiting for the body; waiting,
    a stalled body would run into the deadline and answer 503, or 204 on ack_drop."""
    statuses = []
    for path in (RETRY, DROP):
        headers = _unverifiable_headers(case, encode([event(1)]), path)
        statuses.append(await _status_with_a_stalled_body(live, path, headers))
    assert [s.split(b" ")[1] for s in statuses] == [b"401", b"401"], statuses
    assert await counts(db_pool) == NOTHING_STORED


async def _asgi_post(
    live: Live, path: str, query: bytes, body: bytes, headers: dict[str, str], *, raw_path: bool
) -> int:
    """Call the served ASGI app with a hand-built scope, as a server that passes a
    non-ASCII target through (or no `raw_path` at all) would; the signed URI cannot be
    resolved. (uvicorn itself refuses a non-ASCII target with its own 400.)"""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "query_string": query,
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    if raw_path:
        scope["raw_path"] = path.encode()
    inbound = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbound.pop(0) if inbound else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await live.app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    status: int = start["status"]
    return status


@pytest.mark.parametrize("raw_path", [True, False], ids=["non-ascii-target", "no-raw-path"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (RETRY, encode([event(1)])),
        (DROP, encode([event(1)])),
        (ACTIONS, encode(execution())),
    ],
    ids=["webhook-retry", "webhook-ack-drop", "workflow-action"],
)
async def test_request_uri_resolve_failed_is_503_on_every_endpoint_kind(
    live: Live, db_pool: asyncpg.Pool, path: str, body: bytes, raw_path: bool
) -> None:
    headers = {
        **signed_headers(body, path),
        "content-type": "application/json",
        "content-length": str(len(body)),
    }
    query = b"q=\xc3\xa4" if raw_path else b""
    assert await _asgi_post(live, path, query, body, headers, raw_path=raw_path) == 503
    assert await counts(db_pool) == NOTHING_STORED


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="cp-pg-ackdrop-"))
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port(), durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_postgres_down_is_204_without_retry_after_only_on_ack_drop(
    own_postgres: EmbeddedPostgres,
) -> None:
    dsn = own_postgres.dsn("postgres")
    await apply_migrations(dsn)
    async with live_server(make_config(), dsn) as live:
        await asyncio.to_thread(own_postgres.stop)
        answers = {}
        for n, path in enumerate((RETRY, DROP), start=1):
            body = encode([event(n)])
            response = await live.client.post(
                path, content=body, headers=signed_headers(body, path)
            )
            answers[path] = (response.status_code, response.headers.get("retry-after"))
        # A security failure stays 401 on the ack_drop endpoint even with Postgres down.
        body = encode([event(9)])
        unsigned = await live.client.post(DROP, content=body)
    assert answers[DROP] == (204, None)
    assert answers[RETRY][0] == 503 and answers[RETRY][1]
    assert unsigned.status_code == 401
