"""JRN-1 / JRN-2 / PROF-4: every forbidden write is tried against Postgres and refused.

The guards live in migration 0010; the status sets they use are checked here
against `protocol.recovery` for every HTTP status, so SQL and Python agree.
"""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from db import journal as jq
from db.errors import EvidenceGuardError, invariant_errors
from protocol.recovery import JournalEntry, SendKind, SendOutcome, definite_rejection
from protocol.recovery import proves_no_effect as py_proves_no_effect
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    insert_patch,
    new_link_key,
)

REQUEST = {"method": "POST", "profile": {"not_applied_statuses": [429]}}


async def _attempt(conn: asyncpg.Connection, status: str = "pending") -> uuid.UUID:
    install = await insert_pack_install(conn)
    attempt_id = await insert_attempt(conn, install, link_key=new_link_key())
    await conn.execute(
        "UPDATE connector_push_attempt SET request_snapshot = $2::jsonb WHERE attempt_id = $1",
        attempt_id,
        json.dumps(REQUEST),
    )
    return attempt_id


async def _sent_attempt(
    conn: asyncpg.Connection, outcome: str | None, status: int | None = None
) -> tuple[uuid.UUID, int]:
    """An attempt whose one try passed its fence (claim + checkpoint + journal row)."""
    attempt_id = await _attempt(conn)
    claimed = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
    assert claimed is not None and claimed[1] is not None
    journal_id = claimed[1]
    if outcome is not None:
        assert await jq.record_outcome(conn, journal_id, outcome, status, None, None)
    return attempt_id, journal_id


async def _refused(conn: asyncpg.Connection, sql: str, *args: object) -> None:
    with pytest.raises(EvidenceGuardError), invariant_errors():
        async with conn.transaction():
            await conn.execute(sql, *args)


# -- JRN-1: the journal row is written by the checkpoint statement ---------------------


async def test_checkpoint_and_journal_row_are_one_statement(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await _attempt(conn)
        token = uuid.uuid4()
        claimed = await jq.claim_for_send(conn, str(attempt_id), token, checkpoint=False)
        assert claimed is not None and claimed[1] is None
        assert await jq.attempt_journal(conn, str(attempt_id)) == []
        # A try whose claim was taken over sends nothing and leaves no row.
        assert await jq.checkpoint_attempt(conn, str(attempt_id), uuid.uuid4()) is None
        journal_id = await jq.checkpoint_attempt(conn, str(attempt_id), token)
        [row] = await jq.attempt_journal(conn, str(attempt_id))
        assert row["journal_id"] == journal_id and row["claim_token"] == token
        assert row["outcome"] is None and list(row["not_applied_statuses"]) == [429]
        started = await conn.fetchval(
            "SELECT remote_io_started_at FROM connector_push_attempt WHERE attempt_id = $1",
            attempt_id,
        )
        assert started is not None


async def test_an_outcome_is_written_once_and_nothing_else_changes(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        _, journal_id = await _sent_attempt(conn, None)
        await _refused(
            conn,
            "UPDATE connector_send_journal SET claim_token = gen_random_uuid() "
            "WHERE journal_id = $1",
            journal_id,
        )
        await _refused(
            conn,
            "UPDATE connector_send_journal SET sending_at = now() - interval '1 hour', "
            "outcome = 'not_sent', outcome_at = now() WHERE journal_id = $1",
            journal_id,
        )
        assert await jq.record_outcome(conn, journal_id, "no_answer", None, None, None)
        await _refused(
            conn,
            "UPDATE connector_send_journal SET outcome = 'not_sent' WHERE journal_id = $1",
            journal_id,
        )
        assert not await jq.record_outcome(conn, journal_id, "not_sent", None, None, None)


async def test_journal_rows_of_unfinished_work_cannot_be_deleted(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        _, journal_id = await _sent_attempt(conn, "no_answer")
        await _refused(conn, "DELETE FROM connector_send_journal WHERE journal_id = $1", journal_id)
        await _refused(conn, "TRUNCATE connector_send_journal CASCADE")


async def test_finished_patches_and_their_journal_may_be_pruned(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        link_key = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await insert_patch(conn, link_key=link_key)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'processing', claim_token = $2, "
            "profile_snapshot = '{}'::jsonb WHERE patch_id = $1",
            patch_id,
            token := uuid.uuid4(),
        )
        journal_id = await jq.checkpoint_patch(conn, patch_id, token)
        assert journal_id is not None
        await _refused(conn, "DELETE FROM connector_patch_dispatch WHERE patch_id = $1", patch_id)
        await _refused(conn, "DELETE FROM connector_send_journal WHERE journal_id = $1", journal_id)
        assert await jq.record_outcome(conn, journal_id, "answered", 200, None, None)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'succeeded' WHERE patch_id = $1",
            patch_id,
        )
        await conn.execute("DELETE FROM connector_patch_dispatch WHERE patch_id = $1", patch_id)
        assert await conn.fetchval("SELECT count(*) FROM connector_send_journal") == 0


# -- JRN-2: evidence only grows --------------------------------------------------------


async def test_the_checkpoint_is_never_cleared(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await _sent_attempt(conn, "not_sent")
        await _refused(
            conn,
            "UPDATE connector_push_attempt SET remote_io_started_at = NULL WHERE attempt_id = $1",
            attempt_id,
        )
        await _refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'pending' WHERE attempt_id = $1",
            attempt_id,
        )
        await _refused(
            conn,
            'UPDATE connector_push_attempt SET request_snapshot = \'{"method": "POST"}\' '
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
        attempt_id, _ = await _sent_attempt(conn, outcome, status)
        await _refused(
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
        attempt_id, _ = await _sent_attempt(conn, outcome, status)
        await conn.execute(
            "UPDATE connector_push_attempt SET status = 'terminal_failed' WHERE attempt_id = $1",
            attempt_id,
        )


async def test_a_definite_rejection_must_be_the_last_try(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await _sent_attempt(conn, "answered", 400)
        second = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
        assert second is not None and second[1] is not None
        assert await jq.record_outcome(conn, second[1], "no_answer", None, None, None)
        await _refused(
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
        attempt_id, _ = await _sent_attempt(conn, "no_answer")
        second = await jq.claim_for_send(conn, str(attempt_id), uuid.uuid4(), checkpoint=True)
        assert second is not None and second[1] is not None
        assert await jq.record_outcome(conn, second[1], "answered", rejection, None, None)
        await _refused(
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
        await _refused(
            conn,
            "UPDATE connector_push_attempt SET status = 'superseded' WHERE attempt_id = $1",
            attempt_id,
        )


async def test_supersede_after_a_definite_rejection_of_the_only_try(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        attempt_id, _ = await _sent_attempt(conn, "answered", 422)
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
        await _refused(
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
        await _refused(
            conn,
            "UPDATE connector_patch_dispatch SET remote_io_started_at = NULL WHERE patch_id = $1",
            patch_id,
        )
        await _refused(
            conn,
            "UPDATE connector_patch_dispatch SET status = 'failed' WHERE patch_id = $1",
            patch_id,
        )
        # The frozen PATCH cannot change once a try passed its fence: a retry re-sends
        # exactly what may have landed.
        await _refused(
            conn,
            "UPDATE connector_patch_dispatch SET body = '{\"x\": 1}'::jsonb WHERE patch_id = $1",
            patch_id,
        )
        await _refused(
            conn,
            "UPDATE connector_patch_dispatch SET update_path = '/elsewhere' WHERE patch_id = $1",
            patch_id,
        )
        await _refused(
            conn,
            "UPDATE connector_patch_dispatch SET status = 'pending' WHERE patch_id = $1",
            patch_id,
        )
        assert await jq.record_outcome(conn, journal_id, "answered", 412, None, None)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'failed' WHERE patch_id = $1", patch_id
        )


# -- links and attempts are never deleted, identities never change ----------------------


async def test_links_and_attempts_cannot_be_deleted(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await _attempt(conn)
        link_key = await insert_link(conn, await insert_pack_install(conn))
        await _refused(conn, "DELETE FROM connector_push_attempt WHERE attempt_id = $1", attempt_id)
        await _refused(conn, "DELETE FROM connector_remote_link WHERE link_key = $1", link_key)
        await _refused(conn, "TRUNCATE connector_push_attempt CASCADE")
        await _refused(conn, "TRUNCATE connector_remote_link CASCADE")
        await _refused(conn, "TRUNCATE connector_patch_dispatch CASCADE")


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
        await _refused(
            conn, f"UPDATE connector_remote_link SET {assignment} WHERE link_key = $1", link_key
        )


@pytest.mark.parametrize(
    "assignment",
    [
        "link_key = 'lk1_' || repeat('0', 64)",
        "attempt_ordinal = 7",
        "request_idempotency_key = 'other'",
        "source_record_id = 'other'",
    ],
)
async def test_attempt_identity_is_immutable(db_pool: asyncpg.Pool, assignment: str) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await _attempt(conn)
        await _refused(
            conn,
            f"UPDATE connector_push_attempt SET {assignment} WHERE attempt_id = $1",
            attempt_id,
        )


# -- PROF-4: canonical remote ids ----------------------------------------------------------


@pytest.mark.parametrize("remote_id", [" 1002", "1002 ", "10\t02", "1002\n"])
async def test_a_non_canonical_remote_id_is_refused(db_pool: asyncpg.Pool, remote_id: str) -> None:
    async with db_pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError):
            await insert_link(conn, await insert_pack_install(conn), remote_id=remote_id)


# -- the SQL's status sets are protocol.recovery's --------------------------------------------


async def test_sql_and_protocol_agree_on_every_status(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        rows = await conn.fetch(
            """
            SELECT k.kind, s.status,
                   send_definitely_rejected(k.kind, s.status) AS definite,
                   send_try_may_have_landed(k.kind, 'answered', s.status, ARRAY[429]) AS landed
            FROM (VALUES ('create'), ('patch')) k(kind), generate_series(100, 599) s(status)
            """
        )
        for outcome in ("not_sent", "no_answer", None):
            landed = await conn.fetchval(
                "SELECT send_try_may_have_landed('create', $1, NULL, '{}')", outcome
            )
            entry = JournalEntry(journal_id=1, outcome=SendOutcome(outcome) if outcome else None)
            assert landed is not py_proves_no_effect(entry, SendKind.CREATE)
    assert len(rows) == 1000
    for row in rows:
        kind = SendKind(row["kind"])
        entry = JournalEntry(
            journal_id=1,
            outcome=SendOutcome.ANSWERED,
            status=row["status"],
            not_applied_statuses=(429,),
        )
        assert row["definite"] is definite_rejection(kind, row["status"]), row
        assert row["landed"] is not py_proves_no_effect(entry, kind), row
