"""ID-5 (one occupying attempt per link key) and ID-4 (one link per remote locator)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from db.errors import (
    AttemptSlotOccupiedError,
    DuplicateAttemptOrdinalError,
    RemoteLocatorClaimedError,
    invariant_errors,
)
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    new_link_key,
    set_status,
)


async def _terminal_failed_attempt(conn: asyncpg.Connection, link_key: str) -> object:
    pack_install_id = await insert_pack_install(conn)
    attempt_id = await insert_attempt(conn, pack_install_id, link_key=link_key)
    await set_status(conn, "attempt", attempt_id, "terminal_failed")
    return attempt_id


async def test_a_second_active_attempt_for_a_link_key_is_rejected(db_pool: asyncpg.Pool) -> None:
    link_key = new_link_key()
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        await insert_attempt(conn, pack_install_id, link_key=link_key, ordinal=1)
        with pytest.raises(AttemptSlotOccupiedError), invariant_errors():
            await insert_attempt(conn, pack_install_id, link_key=link_key, ordinal=2)
        # Another link key is unaffected.
        await insert_attempt(conn, pack_install_id, link_key=new_link_key(), ordinal=1)


async def test_an_unsuperseded_terminal_failed_attempt_blocks_a_new_one(
    db_pool: asyncpg.Pool,
) -> None:
    link_key = new_link_key()
    async with db_pool.acquire() as conn:
        await _terminal_failed_attempt(conn, link_key)
        with pytest.raises(AttemptSlotOccupiedError), invariant_errors():
            await insert_attempt(
                conn, await insert_pack_install(conn), link_key=link_key, ordinal=2
            )


async def test_after_superseded_the_next_ordinal_is_accepted(db_pool: asyncpg.Pool) -> None:
    link_key = new_link_key()
    successor = uuid.uuid4()
    async with db_pool.acquire() as conn:
        first = await _terminal_failed_attempt(conn, link_key)
        # superseded_by's foreign key is deferred: supersede first, then reserve.
        async with conn.transaction():
            await conn.execute(
                "UPDATE connector_push_attempt SET status = 'superseded', superseded_by = $2"
                " WHERE attempt_id = $1",
                first,
                successor,
            )
            await insert_attempt(
                conn,
                await insert_pack_install(conn),
                link_key=link_key,
                ordinal=2,
                attempt_id=successor,
            )
        ordinals = await conn.fetch(
            "SELECT attempt_ordinal, status FROM connector_push_attempt WHERE link_key = $1"
            " ORDER BY attempt_ordinal",
            link_key,
        )
        assert [tuple(row) for row in ordinals] == [(1, "superseded"), (2, "pending")]


async def test_a_duplicate_ordinal_for_a_link_key_is_rejected(db_pool: asyncpg.Pool) -> None:
    link_key = new_link_key()
    async with db_pool.acquire() as conn:
        first = await _terminal_failed_attempt(conn, link_key)
        await set_status(conn, "attempt", first, "superseded")
        with pytest.raises(DuplicateAttemptOrdinalError), invariant_errors():
            await insert_attempt(
                conn, await insert_pack_install(conn), link_key=link_key, ordinal=1
            )


async def test_a_finalized_attempt_releases_the_slot(db_pool: asyncpg.Pool) -> None:
    link_key = new_link_key()
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        attempt_id = await insert_attempt(conn, pack_install_id, link_key=link_key)
        for status in ("processing", "writeback_pending", "finalized"):
            await set_status(conn, "attempt", attempt_id, status)
        await insert_attempt(conn, pack_install_id, link_key=link_key, ordinal=2)


async def test_a_remote_locator_belongs_to_one_non_retired_link(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        first = await insert_link(conn, pack_install_id, remote_id="remote-42")
        with pytest.raises(RemoteLocatorClaimedError), invariant_errors():
            await insert_link(conn, pack_install_id, remote_id="remote-42")
        # Same remote id in another remote scope is another locator.
        await insert_link(conn, pack_install_id, remote_id="remote-42", remote_scope="portal-2")
        await set_status(conn, "link", first, "retired")
        await insert_link(conn, pack_install_id, remote_id="remote-42")


async def test_suspended_links_still_hold_their_locator(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        first = await insert_link(conn, pack_install_id, remote_id="remote-7")
        await set_status(conn, "link", first, "suspended_drift")
        with pytest.raises(RemoteLocatorClaimedError), invariant_errors():
            await insert_link(conn, pack_install_id, remote_id="remote-7")


async def test_the_locator_scope_ignores_target_object_profile_and_slot_names(
    db_pool: asyncpg.Pool,
) -> None:
    """ID-4 / seed "Link Key": target object and profile names are validation snapshots, not
    part of the uniqueness scope: two links with other names (and another action slot) but
    the same owner, destination slot, scope and remote id are refused (issue 15)."""
    renamed = {
        "target_object": "people",
        "profile_name": "hubspot-renamed",
        "action_slot_id": "action-2",
        "flow_action_name": "Push_Person",
    }
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        await insert_link(conn, pack_install_id, remote_id="remote-77")
        with pytest.raises(RemoteLocatorClaimedError), invariant_errors():
            await insert_link(conn, pack_install_id, remote_id="remote-77", columns=renamed)
        # The destination slot is part of the scope: another one is another locator.
        other = {**renamed, "destination_slot_id": "dest-2"}
        await insert_link(conn, pack_install_id, remote_id="remote-77", columns=other)


@pytest.mark.parametrize("link_status", ["finalized", "suspended_drift", "retired"])
async def test_a_key_with_a_link_never_gets_another_create_attempt(
    db_pool: asyncpg.Pool, link_status: str
) -> None:
    """Migration 0090: admission PATCHes once a key has a link, and finalize's key lock keeps
    a racing admission from reserving a create; should either be skipped, Postgres refuses
    the attempt (CP004) instead of letting a second create be reserved. The first attempt
    (and the link it finalized) are written in that order and stay legal."""
    link_key = new_link_key()
    async with db_pool.acquire() as conn:
        pack_install_id = await insert_pack_install(conn)
        first = await insert_attempt(conn, pack_install_id, link_key=link_key)
        await set_status(conn, "attempt", first, "terminal_failed")
        await insert_link(conn, pack_install_id, link_key=link_key)
        await set_status(conn, "link", link_key, link_status)
        with pytest.raises(asyncpg.PostgresError, match="has a link") as refused:
            await insert_attempt(conn, pack_install_id, link_key=link_key, ordinal=2)
        assert refused.value.sqlstate == "CP004"
        count = "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1"
        assert await conn.fetchval(count, link_key) == 1
