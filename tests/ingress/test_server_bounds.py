"""The server's own bounds, from the ingress policy: a request head that stalls is
closed within `head_timeout_ms` (slowloris), and connections beyond `max_connections`
are answered 503 at once; both show in the readback."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import yaml

from ingress.config import parse_policy, readback
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


async def test_connections_beyond_the_bound_get_503(db_dsn: str, db_pool: asyncpg.Pool) -> None:
    config = config_from(policy_document(max_connections=2, head_timeout_ms=5000))
    async with live_server(config, db_dsn) as live:
        host, port = live.base_url.removeprefix("http://").split(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        try:
            body = encode([event(1)])
            response = await live.client.post(
                "/webhooks/crm", content=body, headers=signed_headers(body, "/webhooks/crm")
            )
        finally:
            for _, writer in idle:
                writer.close()
    assert response.status_code == 503
    assert await db_pool.fetchval("SELECT count(*) FROM ingress_receipt") == 0


def test_readback_shows_the_server_bounds_and_the_batch_rule() -> None:
    policy = parse_policy(yaml.safe_dump(policy_document()))
    data = readback(policy, {})
    assert (data["head_timeout_ms"], data["max_connections"]) == (2000, 1000)
    endpoints = data["endpoints"]
    assert isinstance(endpoints, list)
    assert [e.get("batch") for e in endpoints] == [BATCH_RULE, BATCH_RULE, None]
