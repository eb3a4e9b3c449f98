"""Named queries for the bulk initial sync (`connector-push push`, SPEC API-3).

Each function runs one statement; the caller owns the transaction (STYLE rule 7).
"""

from __future__ import annotations

from collections.abc import Sequence

from db.records import Conn


async def record_ids_after(conn: Conn, source_object: str, after: str, limit: int) -> list[str]:
    """One keyset page of live record ids of an object, in id order."""
    rows = await conn.fetch(
        "SELECT record_id FROM crm_record WHERE source_object = $1 AND NOT deleted "
        "AND record_id > $2 ORDER BY record_id LIMIT $3",
        source_object,
        after,
        limit,
    )
    return [r["record_id"] for r in rows]


async def count_live_records(conn: Conn, source_object: str) -> int:
    """How many live records an object has (a push's scope, for its time left)."""
    n = await conn.fetchval(
        "SELECT count(*) FROM crm_record WHERE source_object = $1 AND NOT deleted",
        source_object,
    )
    return int(n)


async def live_record_ids(conn: Conn, source_object: str, ids: Sequence[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT record_id FROM crm_record WHERE source_object = $1 AND NOT deleted "
        "AND record_id = ANY($2::text[])",
        source_object,
        list(ids),
    )
    return {r["record_id"] for r in rows}


async def linked_keys(conn: Conn, keys: Sequence[str]) -> set[str]:
    rows = await conn.fetch(
        "SELECT link_key FROM connector_remote_link WHERE link_key = ANY($1::text[])", list(keys)
    )
    return {r["link_key"] for r in rows}


async def occupied_keys(conn: Conn, keys: Sequence[str], released: Sequence[str]) -> set[str]:
    """Keys with an attempt in a status other than `released` (it holds the create slot)."""
    rows = await conn.fetch(
        "SELECT DISTINCT link_key FROM connector_push_attempt "
        "WHERE link_key = ANY($1::text[]) AND NOT (status = ANY($2::text[]))",
        list(keys),
        list(released),
    )
    return {r["link_key"] for r in rows}


async def latest_attempt_statuses(conn: Conn, keys: Sequence[str]) -> dict[str, int]:
    """How many of these keys' newest attempts are in each status."""
    rows = await conn.fetch(
        "SELECT status, count(*) AS n FROM ("
        "  SELECT DISTINCT ON (link_key) status FROM connector_push_attempt"
        "  WHERE link_key = ANY($1::text[]) ORDER BY link_key, attempt_ordinal DESC"
        ") latest GROUP BY status",
        list(keys),
    )
    return {r["status"]: r["n"] for r in rows}
