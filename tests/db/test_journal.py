"""JRN-1: the journal row is written by the checkpoint statement, and the SQL's status sets
are `protocol.recovery`'s for every HTTP status (the guards live in migration 0010).

(JRN-2 is in test_evidence_only_grows.py; deletions, identities and PROF-4 in
test_row_guards.py.)
"""

from __future__ import annotations

import uuid

import asyncpg

from db import journal as jq
from protocol.recovery import JournalEntry, SendKind, SendOutcome, definite_rejection
from protocol.recovery import proves_no_effect as py_proves_no_effect
from tests.db.journal_support import new_attempt, refused, sent_attempt
from tests.db.rows import (
    insert_link,
    insert_pack_install,
    insert_patch,
)

# -- JRN-1: the journal row is written by the checkpoint statement ---------------------


async def test_checkpoint_and_journal_row_are_one_statement(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        attempt_id = await new_attempt(conn)
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
        _, journal_id = await sent_attempt(conn, None)
        await refused(
            conn,
            "UPDATE connector_send_journal SET claim_token = gen_random_uuid() "
            "WHERE journal_id = $1",
            journal_id,
        )
        await refused(
            conn,
            "UPDATE connector_send_journal SET sending_at = now() - interval '1 hour', "
            "outcome = 'not_sent', outcome_at = now() WHERE journal_id = $1",
            journal_id,
        )
        assert await jq.record_outcome(conn, journal_id, "no_answer", None, None, None)
        await refused(
            conn,
            "UPDATE connector_send_journal SET outcome = 'not_sent' WHERE journal_id = $1",
            journal_id,
        )
        assert not await jq.record_outcome(conn, journal_id, "not_sent", None, None, None)


async def test_journal_rows_of_unfinished_work_cannot_be_deleted(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        _, journal_id = await sent_attempt(conn, "no_answer")
        await refused(conn, "DELETE FROM connector_send_journal WHERE journal_id = $1", journal_id)
        await refused(conn, "TRUNCATE connector_send_journal CASCADE")


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
        await refused(conn, "DELETE FROM connector_patch_dispatch WHERE patch_id = $1", patch_id)
        await refused(conn, "DELETE FROM connector_send_journal WHERE journal_id = $1", journal_id)
        assert await jq.record_outcome(conn, journal_id, "answered", 200, None, None)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET status = 'succeeded' WHERE patch_id = $1",
            patch_id,
        )
        await conn.execute("DELETE FROM connector_patch_dispatch WHERE patch_id = $1", patch_id)
        assert await conn.fetchval("SELECT count(*) FROM connector_send_journal") == 0


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
