"""Named queries for the send journal and the checkpoints that append to it (SPEC JRN-1,
§17 G-1).

A checkpoint (RemoteIOStartedAt) and its journal row are written by ONE statement
(a data-modifying CTE), so no try can pass its fence without leaving evidence
and the journal costs no extra transaction. Migration 0010 guards the rest.

Every request has a row (G-1): `kind` 'send' for a create POST or a PATCH, 'lookup'
for the GET of a create's locator, 'readback' for the GET of a PATCHed object
(migration 0200). Only 'send' rows are tries that may have landed: the journals the
recovery decision reads (`attempt_journal`, `patch_journal`) hold those alone.
"""

from __future__ import annotations

import uuid
from typing import Final

import asyncpg

from db.links import CLAIMABLE_LANES
from db.records import Conn

Row = asyncpg.Record

# The frozen contract's "not applied" statuses, copied into the row (PROF-1); an
# attempt's from its frozen request (`f`, the view of migration 0350).
_ATTEMPT_NOT_APPLIED: Final = """ARRAY(SELECT jsonb_array_elements_text(
    f.request_snapshot -> 'profile' -> 'not_applied_statuses')::integer)"""
_ATTEMPT_METHOD: Final = "COALESCE(f.request_snapshot ->> 'method', 'POST')"
_PATCH_NOT_APPLIED: Final = """ARRAY(SELECT jsonb_array_elements_text(
    profile_snapshot -> 'not_applied_statuses')::integer)"""


async def claim_for_send(
    conn: Conn, attempt_id: str, token: uuid.UUID, *, checkpoint: bool, lookup: bool = False
) -> tuple[Row, int | None] | None:
    """Claim the attempt with a fresh fencing token (pending or processing -> processing);
    with `checkpoint`, RemoteIOStartedAt and this try's journal row in the same statement;
    with `lookup` (no checkpoint), the journal row of the locator lookup GET instead.
    The caller decided that the request is allowed (protocol.recovery, protocol.send_gate)."""
    row = await conn.fetchrow(
        f"""
        WITH claimed AS (
            UPDATE connector_push_attempt
            SET status = 'processing', claim_token = $2, claimed_at = now(),
                remote_io_started_at = CASE WHEN $4 THEN COALESCE(remote_io_started_at, now())
                                            ELSE remote_io_started_at END,
                retry_count = retry_count + CASE WHEN claim_token IS NULL THEN 0 ELSE 1 END
            WHERE attempt_id = $1 AND status IN ('pending', 'processing')
              AND dispatch_lane = ANY($3::text[])
            RETURNING *
        ), journal AS (
            INSERT INTO connector_send_journal
                (attempt_id, claim_token, method, not_applied_statuses)
            SELECT attempt_id, claim_token, {_ATTEMPT_METHOD}, {_ATTEMPT_NOT_APPLIED}
            FROM claimed JOIN connector_push_attempt_frozen f USING (attempt_id) WHERE $4
            RETURNING journal_id
        ), lookup AS (
            INSERT INTO connector_send_journal (attempt_id, claim_token, method, kind)
            SELECT attempt_id, claim_token, 'GET', 'lookup' FROM claimed WHERE $5 AND NOT $4
            RETURNING journal_id
        )
        SELECT claimed.*,
               COALESCE((SELECT journal_id FROM journal), (SELECT journal_id FROM lookup))
                   AS journal_id
        FROM claimed
        """,
        uuid.UUID(attempt_id),
        token,
        CLAIMABLE_LANES,
        checkpoint,
        lookup,
    )
    if row is None:
        return None
    return row, row["journal_id"]


async def checkpoint_attempt(conn: Conn, attempt_id: str, token: uuid.UUID) -> int | None:
    """REC-1: the checkpoint iff this claim still owns the row, with its journal row;
    None -> another try owns the attempt: send nothing."""
    journal_id: int | None = await conn.fetchval(
        f"""
        WITH fenced AS (
            UPDATE connector_push_attempt
            SET remote_io_started_at = COALESCE(remote_io_started_at, now())
            WHERE attempt_id = $1 AND claim_token = $2 AND status = 'processing'
            RETURNING *
        )
        INSERT INTO connector_send_journal (attempt_id, claim_token, method, not_applied_statuses)
        SELECT attempt_id, claim_token, {_ATTEMPT_METHOD}, {_ATTEMPT_NOT_APPLIED}
        FROM fenced JOIN connector_push_attempt_frozen f USING (attempt_id)
        RETURNING journal_id
        """,
        uuid.UUID(attempt_id),
        token,
    )
    return journal_id


async def claim_patch_for_send(
    conn: Conn, patch_id: uuid.UUID, token: uuid.UUID, *, checkpoint: bool, readback: bool = False
) -> tuple[bool, int | None]:
    """A fresh token on the in-flight PATCH (its frozen body is re-sent); with
    `checkpoint`, its journal row in the same statement; with `readback` (no checkpoint),
    the journal row of the read-back GET instead."""
    row = await conn.fetchrow(
        f"""
        WITH claimed AS (
            UPDATE connector_patch_dispatch
            SET claim_token = $2, claimed_at = now(), retry_count = retry_count + 1,
                remote_io_started_at = CASE WHEN $3 THEN COALESCE(remote_io_started_at, now())
                                            ELSE remote_io_started_at END
            WHERE patch_id = $1 AND status = 'processing'
            RETURNING *
        ), journal AS (
            INSERT INTO connector_send_journal
                (patch_id, claim_token, method, not_applied_statuses)
            SELECT patch_id, claim_token, 'PATCH', {_PATCH_NOT_APPLIED}
            FROM claimed WHERE $3
            RETURNING journal_id
        ), readback AS (
            INSERT INTO connector_send_journal (patch_id, claim_token, method, kind)
            SELECT patch_id, claim_token, 'GET', 'readback' FROM claimed WHERE $4 AND NOT $3
            RETURNING journal_id
        )
        SELECT (SELECT count(*) FROM claimed) AS claimed,
               COALESCE((SELECT journal_id FROM journal), (SELECT journal_id FROM readback))
                   AS journal_id
        """,
        patch_id,
        token,
        checkpoint,
        readback,
    )
    assert row is not None
    return row["claimed"] == 1, row["journal_id"]


async def checkpoint_patch(conn: Conn, patch_id: uuid.UUID, token: uuid.UUID) -> int | None:
    """The PATCH's checkpoint under its claim, with its journal row; None -> send nothing."""
    journal_id: int | None = await conn.fetchval(
        f"""
        WITH fenced AS (
            UPDATE connector_patch_dispatch
            SET remote_io_started_at = COALESCE(remote_io_started_at, now())
            WHERE patch_id = $1 AND claim_token = $2 AND status = 'processing'
            RETURNING *
        )
        INSERT INTO connector_send_journal (patch_id, claim_token, method, not_applied_statuses)
        SELECT patch_id, claim_token, 'PATCH', {_PATCH_NOT_APPLIED}
        FROM fenced
        RETURNING journal_id
        """,
        patch_id,
        token,
    )
    return journal_id


async def checkpoint_read_back(conn: Conn, patch_id: uuid.UUID, token: uuid.UUID) -> int | None:
    """The journal row of a read-back GET under the PATCH's claim (G-1); None -> another
    claim owns the PATCH: read nothing."""
    journal_id: int | None = await conn.fetchval(
        """
        INSERT INTO connector_send_journal (patch_id, claim_token, method, kind)
        SELECT patch_id, claim_token, 'GET', 'readback' FROM connector_patch_dispatch
        WHERE patch_id = $1 AND claim_token = $2 AND status = 'processing'
        RETURNING journal_id
        """,
        patch_id,
        token,
    )
    return journal_id


async def record_outcome(
    conn: Conn,
    journal_id: int,
    outcome: str,
    status: int | None,
    response_hash: str | None,
    retry_after_seconds: float | None,
    remote_id: str | None = None,
    daily_refusal: bool = False,
) -> bool:
    """Fill a try's transport outcome (and the remote id a create's answer named), once:
    the guard refuses a second write."""
    row = await conn.fetchval(
        """
        UPDATE connector_send_journal
        SET outcome = $2, status = $3, response_hash = $4, retry_after_seconds = $5,
            remote_id = $6, daily_refusal = $7, outcome_at = now()
        WHERE journal_id = $1 AND outcome IS NULL
        RETURNING 1
        """,
        journal_id,
        outcome,
        status,
        response_hash,
        retry_after_seconds,
        remote_id,
        daily_refusal,
    )
    return row is not None


async def attempt_journal(conn: Conn, attempt_id: str) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM connector_send_journal WHERE attempt_id = $1 AND kind = 'send' "
        "ORDER BY journal_id",
        uuid.UUID(attempt_id),
    )


async def patch_journal(conn: Conn, patch_id: uuid.UUID) -> list[Row]:
    return await conn.fetch(
        "SELECT * FROM connector_send_journal WHERE patch_id = $1 AND kind = 'send' "
        "ORDER BY journal_id",
        patch_id,
    )


async def link_journal(conn: Conn, link_key: str) -> list[Row]:
    """Every request of the link's attempts and PATCHes (GETs too), oldest first (for
    `links show`); a GET never may have landed."""
    return await conn.fetch(
        """
        SELECT j.*, a.attempt_ordinal,
               j.kind = 'send'
                 AND send_try_may_have_landed(CASE WHEN j.attempt_id IS NULL THEN 'patch'
                                                   ELSE 'create' END,
                                              j.outcome, j.status, j.not_applied_statuses)
                   AS may_have_landed
        FROM connector_send_journal j
        LEFT JOIN connector_push_attempt a ON a.attempt_id = j.attempt_id
        LEFT JOIN connector_patch_dispatch p ON p.patch_id = j.patch_id
        WHERE a.link_key = $1 OR p.link_key = $1
        ORDER BY j.journal_id
        """,
        link_key,
    )
