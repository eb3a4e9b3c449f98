"""JRN-2 against Postgres: evidence only grows. Every write that would clear a checkpoint,
or end an attempt or PATCH as if no try could have landed, is tried and refused."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from db import journal as jq
from tests.db.journal_support import refused, sent_attempt
from tests.db.rows import (
    insert_link,
    insert_pack_install,
    insert_patch,
)

# -- JRN-2: evidence only grows --------------------------------------------------------


async def test_the_checkpoint_is_never_cleared(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, "not_sent")
        await refused(
            conn,
            "UPDATE connector_push_attempt SET remote_io_started_at = NULL WHERE attempt_id = $1",
            attempt_id,
        )
        await refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'pending' WHERE attempt_id = $1",
            attempt_id,
        )
        await refused(
            conn,
            'UPDATE connector_push_attempt_request SET request_snapshot = \'{"method": "POST"}\' '
            "WHERE attempt_id = $1",
            attempt_id,
        )


@pytest.mark.parametrize(
    ("outcome", "status"), [(None, None), ("no_answer", None), ("answered", 503), ("answered", 409)]
)
async def test_an_effect_possible_attempt_cannot_end_terminal(
    db_pool: asyncpg.Pool, outcome: str | None, status: int | None
) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, outcome, status)
        await refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )
        # ambiguous is always a legal way to park it
        await conn.execute(
            "UPDATE connector_push_attempt SET status = 'ambiguous_remote_effect' "
            "WHERE attempt_id = $1",
            attempt_id,
        )


@pytest.mark.parametrize(
    ("outcome", "status"), [("not_sent", None), ("answered", 400), ("answered", 429)]
)
async def test_terminal_after_a_definite_answer_or_no_effect(
    db_pool: asyncpg.Pool, outcome: str, status: int | None
) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, outcome, status)
        await conn.execute(
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )


async def test_a_definite_rejection_must_be_the_last_try(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, "answered", 400)
        second = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
        assert second is not None and second[1] is not None
        assert await jq.record_outcome(conn, second[1], "no_answer", None, None, None)
        await refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )


@pytest.mark.parametrize("rejection", [422, 400, 409])
async def test_no_terminal_and_no_supersede_after_a_try_that_may_have_landed(
    db_pool: asyncpg.Pool, rejection: int
) -> None:
    """SPEC §15 C-1 (P-77), migration 0100: try 1 may have landed (its answer was lost);
    the same-key re-send is answered 422/400/409. Before, 0010 let the attempt end
    terminal_failed on the last try's definite rejection, and supersede then POSTed a
    second object. Now both moves are refused whatever the last try answered."""
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, "no_answer")
        second = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
        assert second is not None and second[1] is not None
        assert await jq.record_outcome(conn, second[1], "answered", rejection, None, None)
        await refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )
        await conn.execute(
            "UPDATE connector_push_attempt SET status = 'ambiguous_remote_effect' "
            "WHERE attempt_id = $1",
            attempt_id,
        )
        # A row left terminal_failed before 0100 (made here with the triggers bypassed):
        # supersede of it is refused too.
        triggers = ("connector_push_attempt_status_update_tg", "connector_push_attempt_evidence_tg")
        for trigger in triggers:
            await conn.execute(f"ALTER TABLE connector_push_attempt DISABLE TRIGGER {trigger}")
        await conn.execute(
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )
        for trigger in triggers:
            await conn.execute(f"ALTER TABLE connector_push_attempt ENABLE TRIGGER {trigger}")
        await refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'superseded' WHERE attempt_id = $1",
            attempt_id,
        )


async def test_supersede_after_a_definite_rejection_of_the_only_try(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await sent_attempt(conn, "answered", 422)
        for status in ("terminal_failed", "superseded"):
            await conn.execute(
                "UPDATE connector_push_attempt SET status = $2 WHERE attempt_id = $1",
                attempt_id,
                status,
            )


async def test_a_patch_rejected_after_a_try_that_may_have_landed_cannot_end_failed(
    db_pool: asyncpg.Pool,
) -> None:
    """SPEC §15 C-2, migration 0100: 0010 let a PATCH end failed when its last try was
    definitely rejected. A PATCH that may have landed is never re-sent (C-2), so a later
    refusal can only follow a forbidden re-send and proves nothing about the first try:
    failed is refused; ambiguous is the way to park it."""
    async with db_pool.acquire() as conn:
        link_key = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await insert_patch(conn, link_key=link_key)
        token = uuid.uuid4()
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'processing', claim_token = $2 "
            "WHERE patch_id = $1",
            patch_id,
            token,
        )
        first = await jq.checkpoint_patch(conn, patch_id, token)
        assert first is not None
        assert await jq.record_outcome(conn, first, "no_answer", None, None, None)
        claimed, second = await jq.claim_patch_for_send(conn, patch_id, token, checkpoint=True)
        assert claimed and second is not None
        assert await jq.record_outcome(conn, second, "answered", 400, None, None)
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET status = 'failed' WHERE patch_id = $1",
            patch_id,
        )
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'ambiguous_remote_effect' "
            "WHERE patch_id = $1",
            patch_id,
        )


async def test_an_effect_possible_patch_cannot_end_failed(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        link_key = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await insert_patch(conn, link_key=link_key)
        token = uuid.uuid4()
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'processing', claim_token = $2 "
            "WHERE patch_id = $1",
            patch_id,
            token,
        )
        journal_id = await jq.checkpoint_patch(conn, patch_id, token)
        assert journal_id is not None
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET remote_io_started_at = NULL WHERE patch_id = $1",
            patch_id,
        )
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET status = 'failed' WHERE patch_id = $1",
            patch_id,
        )
        # The frozen PATCH cannot change once a try passed its fence: a retry re-sends
        # exactly what may have landed.
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET body = '{\"x\": 1}'::jsonb WHERE patch_id = $1",
            patch_id,
        )
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET update_path = '/elsewhere' WHERE patch_id = $1",
            patch_id,
        )
        await refused(
            conn,
            "UPDATE connector_patch_dispatch SET status = 'pending' WHERE patch_id = $1",
            patch_id,
        )
        assert await jq.record_outcome(conn, journal_id, "answered", 412, None, None)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'failed' WHERE patch_id = $1", patch_id
        )
