"""Named queries for one view of a link key (`links show`, SPEC OPS-1, JRN-1).

Each function runs one statement on a connection the caller owns. A key's rows
are its link (once finalized), its attempts (from the reservation on), its
PATCHes and their send journal; a parked create has attempts and no link.
"""

from __future__ import annotations

import asyncpg

from db.records import Conn

Row = asyncpg.Record


async def link_row(conn: Conn, link_key: str) -> Row | None:
    return await conn.fetchrow("SELECT * FROM connector_remote_link WHERE link_key = $1", link_key)


async def attempts(conn: Conn, link_key: str) -> list[Row]:
    """Every attempt of the key, oldest first, with its frozen request summarised."""
    return await conn.fetch(
        """
        SELECT attempt_id, attempt_ordinal, status, dispatch_lane, remote_id, last_error,
               retry_count, request_idempotency_key, remote_io_started_at, mirror_status,
               superseded_by, created_at, updated_at,
               request_snapshot ->> 'method' AS request_method,
               request_snapshot ->> 'relative_path' AS request_path,
               request_snapshot ->> 'target_object' AS request_target,
               request_snapshot ->> 'body_hash' AS request_body_hash,
               request_snapshot -> 'profile' ->> 'profile_name' AS request_profile,
               response_snapshot ->> 'status' AS response_status
        FROM connector_push_attempt JOIN connector_push_attempt_frozen USING (attempt_id)
        WHERE link_key = $1 ORDER BY attempt_ordinal
        """,
        link_key,
    )


async def patches(conn: Conn, link_key: str, limit: int | None) -> list[Row]:
    """The newest `limit` PATCHes (all when None), oldest of them first."""
    return await conn.fetch(
        """
        SELECT * FROM (
            SELECT patch_id, status, originating_user_id, update_path, body_fingerprint,
                   remote_io_started_at, last_error, created_at, updated_at
            FROM connector_patch_dispatch WHERE link_key = $1
            ORDER BY created_at DESC LIMIT $2
        ) newest ORDER BY created_at
        """,
        link_key,
        limit,
    )


async def patch_count(conn: Conn, link_key: str) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM connector_patch_dispatch WHERE link_key = $1", link_key
    )
    return count


async def operator_actions(conn: Conn, link_key: str) -> list[Row]:
    """Every operator action on the key, oldest first, from the append-only audit trail
    (OPS-2): who, when, why, the command, its outcome and the states around it."""
    return await conn.fetch(
        """
        SELECT recorded_at AS at, operator, command, reason, outcome,
               state_before->>'attempt_status' AS attempt_before,
               state_after->>'attempt_status' AS attempt_after
        FROM connector_operator_audit WHERE link_key = $1
        ORDER BY audit_id
        """,
        link_key,
    )
