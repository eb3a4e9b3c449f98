"""The create-path fault tests' rig (the test starts and stops the workers) and what they
read back: attempt status, the remote's ledger of creates, parked links, record fields."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from temporalio.client import Client

from sandbox.client import SandboxClient
from tests.e2e.conftest import Stack
from tests.e2e.rig import Rig
from tests.e2e.support import eventually

CONTACTS = "/crm/v3/objects/contacts"
COMPANIES = "/crm/v3/objects/companies"


@pytest.fixture
async def rig(
    demo_db: asyncpg.Pool, temporal_client: Client, task_queue: str, sandbox: SandboxClient
) -> AsyncIterator[Rig]:
    """Like `stack`, but the test starts (and may stop) the workers itself."""
    rig = Rig(
        Stack(demo_db, temporal_client, task_queue, sandbox), temporal_client, demo_db, task_queue
    )
    try:
        yield rig
    finally:
        await rig.close()


async def status_of(stack: Stack, key: str, status: str) -> asyncpg.Record:
    return await eventually(lambda: stack.attempt(key), lambda r: r["status"] == status)


async def creates(stack: Stack, object_type: str) -> list[str | None]:
    """Every create the remote recorded, replays included: any second POST shows up."""
    return [e.object_id for e in await stack.sandbox.ledger(object_type=object_type, kind="create")]


async def parked_ids(client: Client, key: str) -> list[str]:
    # The operator's query (WF-4), narrowed to one key: earlier tests' closed runs of the
    # same id keep their last attributes, so the status filter matters.
    query = f'NeedsOperator = true AND ExecutionStatus = "Running" AND LinkKey = "{key}"'
    return [wf.id async for wf in client.list_workflows(query)]


async def record_fields(stack: Stack, obj: str, record_id: str) -> str:
    fields = await stack.pool.fetchval(
        "SELECT fields::text FROM crm_record WHERE source_object = $1 AND record_id = $2",
        obj,
        record_id,
    )
    assert isinstance(fields, str)
    return fields
