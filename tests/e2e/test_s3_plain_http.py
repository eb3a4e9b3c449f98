"""SPEC S-3 at the worker: a production worker refuses `http://` remotes before anything is
written, unless the deployment names the exception (`CONNECTOR_PUSH_ALLOW_PLAIN_HTTP`).

Real Postgres, a real Temporal server and the sandbox as a real HTTP server on 127.0.0.1
(plain http): the worker is built as `worker.main` builds it, from `RuntimeSettings` read
from the environment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
import yaml
from temporalio.client import Client
from typer.testing import CliRunner

from cli.main import app
from db import journal as jq
from protocol.admission import CreateReserved
from sandbox.client import SandboxClient
from tests.e2e.conftest import Stack, contact_key, demo_manifest
from tests.e2e.support import eventually
from worker.runtime import build_worker, remote_http_client
from worker.settings import RuntimeSettings


@asynccontextmanager
async def _worker_stack(
    pool: asyncpg.Pool, client: Client, task_queue: str, sandbox: SandboxClient
) -> AsyncIterator[Stack]:
    """A stack whose worker's HTTP client follows the environment's settings, as the
    worker process's does (`worker.main.run_worker`)."""
    settings = RuntimeSettings()
    http = remote_http_client(refuse_plain=settings.refuses_plain_http())
    async with http, build_worker(client, pool, http, task_queue):
        stack = Stack(pool, client, task_queue, sandbox)
        try:
            yield stack
        finally:
            await stack.close()


async def _journal(stack: Stack, key: str) -> list[asyncpg.Record]:
    attempt = await stack.attempt(key)
    async with stack.pool.acquire() as conn:
        return await jq.attempt_journal(conn, str(attempt["attempt_id"]))


async def test_s3_a_production_worker_sends_nothing_over_plain_http(
    demo_db: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sandbox: SandboxClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was: the create went to the http:// sandbox. Now every try is refused before it
    connects, journaled `not_sent` and retried (its retries would run out into a park for
    an operator), with the reason logged; the sandbox saw nothing."""
    monkeypatch.setenv("CONNECTOR_PUSH_DEPLOYMENT_PROFILE", "production")
    monkeypatch.delenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", raising=False)
    key = contact_key("c-001")
    with caplog.at_level(logging.WARNING, logger="services.remote"):
        async with _worker_stack(demo_db, temporal_client, task_queue, sandbox) as stack:
            assert isinstance(await stack.push("c-001"), CreateReserved)
            # Two tries settled (the newest may be journalled with its outcome not yet written).
            journal = await eventually(
                lambda: _journal(stack, key),
                lambda rows: sum(row["outcome"] is not None for row in rows) >= 2,
            )
            assert {row["outcome"] for row in journal} - {None} == {"not_sent"}
            assert (await stack.attempt(key))["status"] != "finalized"
    assert await sandbox.ledger() == []
    assert "refused before sending" in caplog.text
    assert "not https" in caplog.text and "CONNECTOR_PUSH_ALLOW_PLAIN_HTTP" in caplog.text


async def test_s3_a_production_worker_allowed_plain_http_sends(
    demo_db: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sandbox: SandboxClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The named exception (`CONNECTOR_PUSH_ALLOW_PLAIN_HTTP=1`): the create goes."""
    monkeypatch.setenv("CONNECTOR_PUSH_DEPLOYMENT_PROFILE", "production")
    monkeypatch.setenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", "1")
    key = contact_key("c-001")
    async with _worker_stack(demo_db, temporal_client, task_queue, sandbox) as stack:
        assert isinstance(await stack.push("c-001"), CreateReserved)
        await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert len(await sandbox.ledger(object_type="contacts", kind="create")) == 1


async def test_s3_pack_apply_in_production_refuses_a_plain_http_profile(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: installed, and then every request of its profiles refused at the worker. Now
    `pack apply` (and its --dry-run) exits 2 naming each profile, nothing written; the
    deployment's named exception lets it through."""
    pack = tmp_path / "demo.yaml"
    pack.write_text(yaml.safe_dump(demo_manifest("http://127.0.0.1:9")), encoding="utf-8")
    monkeypatch.setenv("CONNECTOR_PUSH_DEPLOYMENT_PROFILE", "production")
    apply = ("pack", "apply", str(pack), "--database-url", db_dsn, "--operator", "ops")
    conn = await asyncpg.connect(db_dsn)
    try:
        for args in (apply, (*apply, "--dry-run")):
            refused = await asyncio.to_thread(CliRunner().invoke, app, list(args))
            assert refused.exit_code == 2, refused.output
            assert "profiles[0].baseUrl" in refused.output and "not https" in refused.output
            assert await conn.fetchval("SELECT count(*) FROM pack_install") == 0
        monkeypatch.setenv("CONNECTOR_PUSH_ALLOW_PLAIN_HTTP", "1")
        claims = ("--accept-unverified-claims", "--reason", "S-3 test")  # production's other gate
        allowed = await asyncio.to_thread(CliRunner().invoke, app, [*apply, *claims])
        assert allowed.exit_code == 0, allowed.output
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 1
    finally:
        await conn.close()
