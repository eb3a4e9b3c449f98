"""Rows and a refusal check shared by the journal and row-guard db tests."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from db import journal as jq
from db.errors import EvidenceGuardError, invariant_errors
from tests.db.rows import (
    insert_attempt,
    insert_pack_install,
    new_link_key,
)

REQUEST = {"method": "POST", "profile": {"not_applied_statuses": [429]}}


async def new_attempt(conn: asyncpg.Connection, status: str = "pending") -> uuid.UUID:
    install = await insert_pack_install(conn)
    attempt_id = await insert_attempt(conn, install, link_key=new_link_key())
    await conn.execute(
        "UPDATE connector_push_attempt_request SET request_snapshot = $2::jsonb "
        "WHERE attempt_id = $1",
        attempt_id,
        json.dumps(REQUEST),
    )
    return attempt_id


async def sent_attempt(
    conn: asyncpg.Connection, outcome: str | None, status: int | None = None
) -> tuple[uuid.UUID, int]:
    """An attempt whose one try passed its fence (claim + checkpoint + journal row)."""
    attempt_id = await new_attempt(conn)
    claimed = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
    assert claimed is not None and claimed[1] is not None
    journal_id = claimed[1]
    if outcome is not None:
        assert await jq.record_outcome(conn, journal_id, outcome, status, None, None)
    return attempt_id, journal_id


async def refused(conn: asyncpg.Connection, sql: str, *args: object) -> None:
    with pytest.raises(EvidenceGuardError), invariant_errors():
        async with conn.transaction():
            await conn.execute(sql, *args)
