"""The server's own bounds, from the ingress policy: a request head that stalls is
closed within `head_timeout_ms` (slowloris), and a request beyond `max_connections` is
answered at once as the endpoint answers an internal failure (ING-2); both show in the
readback."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import yaml

from ingress.config import parse_policy, readback
from ingress.errors import DropReason
from protocol.ingress_policy import BATCH_RULE
from tests.ingress.support import (
    config_from,
    encode,
    event,
    live_server,
    policy_document,
    signed_headers,
)

HEAD_TIMEOUT_MS = 300
MARGIN_S = 1.5  # the machine is shared; without the bound the connection stays open


async def _closed_after(reader: asyncio.StreamReader) -> float:
    started = time.monotonic()
    async with asyncio.timeout(10):
        while await reader.read(4096):
            pass
    return time.monotonic() - started


async def test_a_stalled_head_is_closed_within_the_bound(db_dsn: str) -> None:
    config = config_from(policy_document(head_timeout_ms=HEAD_TIMEOUT_MS))
    async with live_server(config, db_dsn) as live:
        host, port = live.base_url.removeprefix("http://").split(":")
        # A fresh connection stalling halfway through its headers.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /webhooks/crm HTTP/1.1\r\nhost: x\r\ncontent-le")
        await writer.drain()
        fresh = await _closed_after(reader)
        writer.close()
        # A keep-alive connection: one full request, then a second head that stalls.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(b"GET /healthz HTTP/1.1\r\nhost:")
        await writer.drain()
        await reader.readexactly(len(b'{"status":"ok"}'))  # the first response's body
        kept_alive = await _closed_after(reader)
        writer.close()
        # A head that arrives in time is served.
        body = encode([event(1)])
        response = await live.client.post(
            "/webhooks/crm", content=body, headers=signed_headers(body, "/webhooks/crm")
        )
    assert response.status_code == 202
    assert HEAD_TIMEOUT_MS / 1000 * 0.5 < fresh < HEAD_TIMEOUT_MS / 1000 + MARGIN_S
    assert HEAD_TIMEOUT_MS / 1000 * 0.5 < kept_alive < HEAD_TIMEOUT_MS / 1000 + MARGIN_S


async def _serve_and_keep(
    host: str, port: int, kept: list[asyncio.StreamWriter]
) -> asyncio.StreamReader:
    """A connection served once (so the server surely counts it), then kept open."""
    reader, writer = await asyncio.open_connection(host, port)
    kept.append(writer)
    writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    await reader.readexactly(len(b'{"status":"ok"}'))
    return reader


async def test_ing2_connections_beyond_the_bound_get_the_endpoints_unavailable_answer(
    db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    """ING-2 over `max_connections`: a retry endpoint answers our 503 with Retry-After, an
    ack_drop endpoint 204 without it (and counts the drop), anything else 503 with
    Retry-After; each closes its connection, and nothing is written."""
    config = config_from(policy_document(max_connections=2, head_timeout_ms=5000))
    kept: list[asyncio.StreamWriter] = []
    async with live_server(config, db_dsn) as live:
        host, port = live.base_url.removeprefix("http://").split(":")
        try:
            # Two connections are within the bound: the second is served with both open.
            for _ in range(2):
                await _serve_and_keep(host, int(port), kept)
            answers = {}
            for path in ("/webhooks/crm", "/webhooks/crm-drop"):
                body = encode([event(1)])
                answers[path] = await live.client.post(
                    path, content=body, headers=signed_headers(body, path)
                )
            answers["/readyz"] = await live.client.get("/readyz")
        finally:
            for writer in kept:
                writer.close()
                await writer.wait_closed()
        dropped = live.ingress.drops.count("crm-drop", DropReason.OVER_CAPACITY)
    retry, drop, ready = answers["/webhooks/crm"], answers["/webhooks/crm-drop"], answers["/readyz"]
    for unavailable in (retry, ready):
        assert unavailable.status_code == 503
        assert unavailable.json() == {"error": "over_capacity"}
        assert unavailable.headers["retry-after"] == "5"
    assert drop.status_code == 204 and "retry-after" not in drop.headers
    assert {r.headers.get("connection") for r in answers.values()} == {"close"}
    assert dropped == 1
    assert await db_pool.fetchval("SELECT count(*) FROM ingress_receipt") == 0


def test_readback_shows_the_server_bounds_and_the_batch_rule() -> None:
    policy = parse_policy(yaml.safe_dump(policy_document()))
    data = readback(policy, {})
    assert (data["head_timeout_ms"], data["max_connections"]) == (2000, 1000)
    endpoints = data["endpoints"]
    assert isinstance(endpoints, list)
    assert [e.get("batch") for e in endpoints] == [BATCH_RULE, BATCH_RULE, None]
