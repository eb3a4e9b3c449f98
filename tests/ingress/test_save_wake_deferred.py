"""API-2 / NF-5: once a save is committed, waking its workflow is best effort and bounded.

Every CRM entry (the Python API, `save`, `push`, the HTTP save API) admits, commits,
then wakes through `wake_best_effort`, which first reads the reservation's rate
budget from Postgres. Whatever Postgres does at that point - stops answering
(SIGSTOP of every server process), or the pool is closed under it - the committed
decision stands and the wake-up is reported deferred to the relay, within the wake
bound: never an exception (an HTTP 500) and never a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import yaml
from temporalio.client import Client

from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_port
from db.migrate import apply_migrations
from protocol.admission import AdmissionDecision, CreateReserved, SaveRequest
from services import rate_limit
from services.packs import apply_pack
from services.record_loader import load_records, parse_records_document
from services.save_entry import WakeStatus, admit_one, wake_best_effort
from tests.e2e.conftest import EXAMPLES, demo_manifest
from tests.e2e.save_api_support import AUTH, save_api_config, save_body
from tests.ingress.pg_process import hung, own_postgres
from tests.ingress.support import live_server, wait_until

WAKE_TIMEOUT_S = 0.5
MARGIN_S = 1.5  # the machine is shared; without the bound the wake-up never returns
TASK_QUEUE = "unused"
SAVE = SaveRequest(
    connector_owner_key="demo-owner",
    action_slot_id="push-contact",
    destination_slot_id="remote-contacts",
    source_object="Contact",
    source_record_id="c-001",
    originating_user_id="alice",
)


@pytest.fixture
def postgres() -> Iterator[EmbeddedPostgres]:
    with own_postgres() as server:
        yield server


async def _demo_pool(dsn: str) -> asyncpg.Pool:
    """A pool on a database with the demo pack and records (no remote is called here)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    async with pool.acquire() as conn:
        await apply_pack(conn, demo_manifest("http://127.0.0.1:9"))
        records = yaml.safe_load((EXAMPLES / "demo-records.yaml").read_text())
        await load_records(conn, parse_records_document(records))
    return pool


@pytest.fixture
async def temporal() -> AsyncIterator[Client]:
    """A client of a Temporal that is not there (lazy: nothing is dialled until used)."""
    yield await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)


async def _reserved(pool: asyncpg.Pool) -> AdmissionDecision:
    decision = await admit_one(pool, SAVE)  # committed
    assert isinstance(decision, CreateReserved), decision
    return decision


def _wake(
    client: Client, pool: asyncpg.Pool, decision: AdmissionDecision
) -> asyncio.Task[WakeStatus]:
    return asyncio.create_task(
        wake_best_effort(client, TASK_QUEUE, decision, None, WAKE_TIMEOUT_S, pool=pool, save=SAVE)
    )


async def test_api2_postgres_hung_after_the_commit_defers_the_wake_within_its_bound(
    postgres: EmbeddedPostgres, temporal: Client
) -> None:
    dsn = postgres.dsn("postgres")
    await apply_migrations(dsn)
    pool = await _demo_pool(dsn)
    waking: asyncio.Task[WakeStatus] | None = None
    try:
        decision = await _reserved(pool)
        # The pool holds an open connection, so the hang strikes mid-conversation; this
        # database's budget rates were never read, so the wake-up must read them.
        with hung(postgres):
            started = time.monotonic()
            waking = _wake(temporal, pool, decision)
            await asyncio.wait({waking}, timeout=WAKE_TIMEOUT_S + MARGIN_S)
            elapsed = time.monotonic() - started
            assert waking.done(), "the wake-up is still waiting on the hung Postgres"
        assert waking.result() is WakeStatus.DEFERRED
        assert elapsed < WAKE_TIMEOUT_S + MARGIN_S
    finally:
        if waking is not None and not waking.done():  # Postgres answers again by now
            waking.cancel()
            await asyncio.gather(waking, return_exceptions=True)
        await pool.close()


async def test_api2_a_pool_closed_after_the_commit_defers_the_wake_instead_of_raising(
    db_dsn: str, temporal: Client
) -> None:
    pool = await _demo_pool(db_dsn)
    decision = await _reserved(pool)
    await pool.close()  # the budget read meets asyncpg's InterfaceError("pool is closed")
    waking = _wake(temporal, pool, decision)
    await asyncio.wait({waking}, timeout=WAKE_TIMEOUT_S + MARGIN_S)
    assert waking.done() and waking.result() is WakeStatus.DEFERRED


async def test_api2_the_http_save_api_answers_the_committed_save_when_its_wake_fails(
    db_dsn: str, temporal: Client
) -> None:
    """The save API's pool closes between the commit and the wake-up's budget read: the
    answer is the committed decision with `wake: deferred`, not a 500."""
    setup = await _demo_pool(db_dsn)
    config = save_api_config(wake_timeout_ms=10_000)
    try:
        async with live_server(
            config, db_dsn, temporal=(temporal, TASK_QUEUE), relay=False
        ) as live:
            pool = live.ingress.admitter.pool

            async def committed() -> bool:
                return await setup.fetchval("SELECT count(*) FROM connector_push_attempt") == 1

            # The server runs in this event loop: holding the budget cache's lock stops
            # its wake-up right after the commit, before it reads the rates.
            async with rate_limit._lock(pool):
                answer = asyncio.create_task(
                    live.client.post("/v1/saves", json=save_body(), headers=AUTH)
                )
                await wait_until(committed, what="the save committed")
                await pool.close()
            response = await answer
    finally:
        await setup.close()
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert (result["decision"], result["wake"]) == ("create_reserved", "deferred")
