"""LANE-1: unknown dispatch lanes are storable; unknown statuses are not."""

from __future__ import annotations

import asyncpg
import pytest

from db import links as q
from services.operator import park_in_flight
from tests.db.rows import insert_attempt, insert_link, insert_pack_install, new_link_key


async def test_dispatch_lane_defaults_to_configured(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        attempt_id = await insert_attempt(conn, pack_install_id, link_key=new_link_key())
        patch_id = await conn.fetchval(
            "INSERT INTO connector_patch_dispatch (link_key, status) VALUES ($1, 'pending')"
            " RETURNING patch_id",
            await insert_link(conn, pack_install_id),
        )
        lanes = await conn.fetch(
            "SELECT dispatch_lane FROM connector_push_attempt WHERE attempt_id = $1"
            " UNION ALL SELECT dispatch_lane FROM connector_patch_dispatch WHERE patch_id = $2",
            attempt_id,
            patch_id,
        )
        assert [row["dispatch_lane"] for row in lanes] == ["configured", "configured"]


async def test_an_unknown_lane_is_stored_untouched(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        attempt_id = await insert_attempt(
            conn, pack_install_id, link_key=new_link_key(), dispatch_lane="lane_from_the_future"
        )
        assert (
            await conn.fetchval(
                "SELECT dispatch_lane FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
            )
            == "lane_from_the_future"
        )


async def test_a_deferred_attempt_needs_its_association_vector(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await insert_attempt(
            conn,
            await insert_pack_install(conn),
            link_key=new_link_key(),
            dispatch_lane="deferred_association",
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "UPDATE connector_push_attempt SET association_source_ids = NULL"
                " WHERE attempt_id = $1",
                attempt_id,
            )


@pytest.mark.parametrize(
    "table", ["connector_remote_link", "connector_push_attempt", "connector_patch_dispatch"]
)
async def test_the_status_check_rejects_unknown_values_even_without_triggers(
    db_pool: asyncpg.Pool, table: str
) -> None:
    # The status triggers reject unknown values first; this proves the CHECK
    # behind them holds on its own (e.g. with triggers disabled for a repair).
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        # The attempt first: a key with a link never gets a create attempt (0090).
        link_key = new_link_key()
        await insert_attempt(conn, pack_install_id, link_key=link_key)
        await insert_link(conn, pack_install_id, link_key=link_key)
        await conn.execute(
            "INSERT INTO connector_patch_dispatch (link_key, status) VALUES ($1, 'pending')",
            link_key,
        )
        await conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        with pytest.raises(asyncpg.CheckViolationError) as caught:
            await conn.execute(f"UPDATE {table} SET status = 'bogus'")
        assert caught.value.constraint_name == f"{table}_status_ck"


async def test_no_attempt_move_touches_a_row_in_an_unknown_lane(db_pool: asyncpg.Pool) -> None:
    """LANE-1: every mutation names its allowed lanes. `move_attempt` is the one way the
    runtime (recovery, writeback, parking, operator actions) changes an attempt's status:
    in an unknown lane it is a compare-and-set miss, and the row stays as it was."""
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        attempt_id = await insert_attempt(
            conn, pack_install_id, link_key=new_link_key(), dispatch_lane="lane_from_the_future"
        )
        before = dict(
            await conn.fetchrow(
                "SELECT * FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
            )
        )
        moved = await q.move_attempt(
            conn, str(attempt_id), ["pending"], "terminal_failed", last_error="exhausted"
        )
        assert moved is None
        after = dict(
            await conn.fetchrow(
                "SELECT * FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
            )
        )
        assert after == before


async def test_parking_after_exhausted_retries_leaves_an_unknown_lane_untouched(
    db_pool: asyncpg.Pool,
) -> None:
    """REC-3/REC-4 park what ran out of retries, but LANE-1 wins: a pending attempt in a
    lane this runtime does not claim (its dispatch refused it, then retries ran out, e.g.
    through a Postgres outage) is not normalised to terminal_failed."""
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        key = new_link_key()
        attempt_id = await insert_attempt(
            conn, pack_install_id, link_key=key, dispatch_lane="lane_from_the_future"
        )
        async with conn.transaction():
            await park_in_flight(conn, key, "retries exhausted")
        status = await conn.fetchval(
            "SELECT status FROM connector_push_attempt WHERE attempt_id = $1", attempt_id
        )
        assert status == "pending"
