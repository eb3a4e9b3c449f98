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
        FROM connector_push_attempt WHERE link_key = $1 ORDER BY attempt_ordinal
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
    """Who acted on the key, when and why, as the link and attempt rows record it (the
    last action on each row). Hook for OPS-2: once the append-only audit table exists,
    read every action from it here instead."""
    return await conn.fetch(
        """
        SELECT 'link' AS row, NULL::integer AS attempt_ordinal, last_operator AS operator,
               last_operator_reason AS reason, last_operator_at AS at
        FROM connector_remote_link WHERE link_key = $1 AND last_operator IS NOT NULL
        UNION ALL
        SELECT 'attempt', attempt_ordinal, last_operator, last_operator_reason,
               last_operator_at
        FROM connector_push_attempt WHERE link_key = $1 AND last_operator IS NOT NULL
        ORDER BY at
        """,
        link_key,
    )
