"""Process-level durability: SIGKILL after acknowledgements loses nothing acknowledged
(ING-1); Postgres stopped answers 503, never 2xx/4xx, and /readyz says not ready (ING-2)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml

from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_port
from db.migrate import apply_migrations
from tests.ingress.support import (
    ENVIRON,
    encode,
    event,
    live_server,
    make_config,
    policy_document,
    signed_headers,
    wait_until,
)

PATH = "/webhooks/crm"


def _start_ingress(tmp_path: Path, dsn: str, port: int) -> subprocess.Popen[bytes]:
    policy = tmp_path / "policy.yaml"
    document = policy_document()
    document["endpoints"][0]["body_limit"] = 65536
    policy.write_text(yaml.safe_dump(document))
    env = {
        **os.environ,
        **ENVIRON,
        "DATABASE_URL": dsn,
        "CONNECTOR_PUSH_INGRESS_PORT": str(port),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "ingress", str(policy)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_sigkill_after_acknowledgements_loses_nothing_acknowledged(
    tmp_path: Path, db_dsn: str, db_pool: asyncpg.Pool
) -> None:
    port = free_port()
    process = _start_ingress(tmp_path, db_dsn, port)
    acked: list[dict[str, str | None]] = []
    killed = asyncio.Event()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

            async def healthy() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(healthy, timeout_s=20)

            async def sender(worker: int) -> None:
                for n in range(10_000):
                    if killed.is_set():
                        return
                    batch = [event(worker * 100_000 + n * 3 + k, object_id=k) for k in range(3)]
                    body = encode(batch)
                    try:
                        response = await client.post(
                            PATH, content=body, headers=signed_headers(body, PATH)
                        )
                    except httpx.TransportError:
                        return
                    if response.status_code == 202:
                        acked.extend(response.json()["receipts"])
                        if len(acked) >= 300 and not killed.is_set():
                            process.send_signal(signal.SIGKILL)
                            killed.set()

            await asyncio.gather(*(sender(w) for w in range(8)))
    finally:
        process.kill()
        process.wait(timeout=10)
    assert killed.is_set() and len(acked) >= 300
    async with db_pool.acquire() as conn:
        receipts = {
            r["receipt_id"] for r in await conn.fetch("SELECT receipt_id FROM ingress_receipt")
        }
        events = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM connector_event")}
    assert {a["receiptId"] for a in acked} <= receipts
    assert {a["eventId"] for a in acked} <= events


@pytest.fixture
def own_postgres() -> EmbeddedPostgres:
    root = Path(tempfile.mkdtemp(prefix="cp-pg-ingress-"))
    server = EmbeddedPostgres(root / "data", "127.0.0.1", free_port(), durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_postgres_stopped_is_503_and_not_ready(own_postgres: EmbeddedPostgres) -> None:
    dsn = own_postgres.dsn("postgres")
    await apply_migrations(dsn)
    async with live_server(make_config(), dsn) as live:
        body = encode([event(1)])
        first = await live.client.post(PATH, content=body, headers=signed_headers(body, PATH))
        assert first.status_code == 202
        await asyncio.to_thread(own_postgres.stop)
        for n in range(2, 6):
            body = encode([event(n)])
            response = await live.client.post(
                PATH, content=body, headers=signed_headers(body, PATH)
            )
            assert response.status_code == 503
            assert response.headers["retry-after"]
        assert (await live.client.get("/readyz")).status_code == 503
        assert (await live.client.get("/healthz")).status_code == 200
