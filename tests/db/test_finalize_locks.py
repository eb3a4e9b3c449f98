"""The create path's finalization opens with both of its locks in one statement (SPEC C-9,
G-4): the link key's, then its owner's apply lock, shared. While a finalization holds
them, an admission of the same link key and a `pack apply` of the same owner wait; a
finalization of another owner's link or another link key waits for neither."""

from __future__ import annotations

import asyncpg

from db.packs import OWNER_APPLY_KEY
from db.slot_guard import lock_link_key_and_owner_shared
from tests.db import rows

LINK_KEY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 7))"
APPLY_LOCK = f"SELECT pg_try_advisory_xact_lock({OWNER_APPLY_KEY})"
APPLY_LOCK_SHARED = f"SELECT pg_try_advisory_xact_lock_shared({OWNER_APPLY_KEY})"


async def _attempt(conn: asyncpg.Connection) -> tuple[str, str, str]:
    """A pending attempt: its link key, its id and its owner key."""
    install = await rows.insert_pack_install(conn)
    link_key = rows.new_link_key()
    attempt_id = await rows.insert_attempt(conn, install, link_key=link_key)
    owner = await conn.fetchval(
        "SELECT connector_owner_key FROM connector_push_attempt WHERE attempt_id = $1",
        attempt_id,
    )
    return link_key, str(attempt_id), str(owner)


async def _try(pool: asyncpg.Pool, statement: str, key: str) -> bool:
    async with pool.acquire() as other, other.transaction():
        return bool(await other.fetchval(statement, key))


async def test_the_first_statement_holds_the_link_key_then_the_owner_apply_lock_shared(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        link_key, attempt_id, owner = await _attempt(conn)
        other_key = rows.new_link_key()
        async with conn.transaction():
            held = await lock_link_key_and_owner_shared(conn, link_key, attempt_id)
            assert held.attempt_id == attempt_id
            assert not await _try(db_pool, LINK_KEY_LOCK, link_key)  # admission waits
            assert not await _try(db_pool, APPLY_LOCK, owner)  # an apply waits
            assert await _try(db_pool, APPLY_LOCK_SHARED, owner)  # another finalization not
            assert await _try(db_pool, LINK_KEY_LOCK, other_key)
            assert await _try(db_pool, APPLY_LOCK, f"not-{owner}")
        # Transaction-scoped: both are gone with its commit.
        assert await _try(db_pool, LINK_KEY_LOCK, link_key)
        assert await _try(db_pool, APPLY_LOCK, owner)
