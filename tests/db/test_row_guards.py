"""Links and attempts are never deleted, their identities never change, and a remote id is
stored only in canonical form (PROF-4): each forbidden write is tried and refused."""

from __future__ import annotations

import asyncpg
import pytest

from tests.db.journal_support import new_attempt, refused
from tests.db.rows import (
    insert_link,
    insert_pack_install,
)

# -- links and attempts are never deleted, identities never change ----------------------


async def test_links_and_attempts_cannot_be_deleted(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await new_attempt(conn)
        link_key = await insert_link(conn, await insert_pack_install(conn))
        await refused(conn, "DELETE FROM connector_push_attempt WHERE attempt_id = $1", attempt_id)
        await refused(conn, "DELETE FROM connector_remote_link WHERE link_key = $1", link_key)
        await refused(conn, "TRUNCATE connector_push_attempt CASCADE")
        await refused(conn, "TRUNCATE connector_remote_link CASCADE")
        await refused(conn, "TRUNCATE connector_patch_dispatch CASCADE")


@pytest.mark.parametrize(
    "assignment",
    [
        "link_key = 'lk1_' || repeat('0', 64)",
        "source_record_id = 'other'",
        "connector_owner_key = 'other'",
        "destination_slot_id = 'other'",
        "remote_id = 'other'",
    ],
)
async def test_link_identity_is_immutable(db_pool: asyncpg.Pool, assignment: str) -> None:
    async with db_pool.acquire() as conn:
        link_key = await insert_link(conn, await insert_pack_install(conn))
        await refused(
            conn, f"UPDATE connector_remote_link SET {assignment} WHERE link_key = $1", link_key
        )


@pytest.mark.parametrize(
    ("table", "assignment"),
    [
        ("connector_push_attempt", "link_key = 'lk1_' || repeat('0', 64)"),
        ("connector_push_attempt", "attempt_ordinal = 7"),
        ("connector_push_attempt", "source_record_id = 'other'"),
        # the frozen half of the attempt (migration 0350)
        ("connector_push_attempt_request", "request_idempotency_key = 'other'"),
        ("connector_push_attempt_request", "action_type = 'other'"),
    ],
)
async def test_attempt_identity_is_immutable(
    db_pool: asyncpg.Pool, table: str, assignment: str
) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await new_attempt(conn)
        await refused(conn, f"UPDATE {table} SET {assignment} WHERE attempt_id = $1", attempt_id)


# -- PROF-4: canonical remote ids ----------------------------------------------------------


@pytest.mark.parametrize("remote_id", [" 1002", "1002 ", "10\t02", "1002\n"])
async def test_a_non_canonical_remote_id_is_refused(db_pool: asyncpg.Pool, remote_id: str) -> None:
    async with db_pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError):
            await insert_link(conn, await insert_pack_install(conn), remote_id=remote_id)
