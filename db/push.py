"""Named queries for the bulk initial sync (`connector-push push`, SPEC API-3).

Each function runs one statement; the caller owns the transaction (STYLE rule 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

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


async def database_now(conn: Conn) -> datetime:
    """The server's clock: a push counts the attempts created from this instant on."""
    now = await conn.fetchval("SELECT clock_timestamp()")
    assert isinstance(now, datetime)
    return now


async def slot_attempt_statuses(
    conn: Conn, owner_key: str, action_slot: str, since: datetime
) -> dict[str, int]:
    """How many of a slot's attempts created since `since` are in each status: a push's
    progress as counts, never a list of its keys (memory bounded at any size, NF-7).

    Read by the (created_at, attempt_id) index of 0120; another save's attempt of the same
    slot in that window is counted too (it only makes `--wait` wait for it as well)."""
    rows = await conn.fetch(
        "SELECT status, count(*) AS n FROM connector_push_attempt "
        "WHERE created_at >= $3 AND connector_owner_key = $1 AND action_slot_id = $2 "
        "GROUP BY status",
        owner_key,
        action_slot,
        since,
    )
    return {r["status"]: r["n"] for r in rows}


async def slot_in_flight(
    conn: Conn, owner_key: str, action_slot: str, since: datetime, statuses: list[str]
) -> int:
    """How many of a slot's attempts created since `since` are in `statuses` in the
    configured lane: a paced push's in-flight count (NF-8). An attempt waiting in the
    deferred association lane spends no request until its association is linked, which
    may take as long as the sync itself, so it never holds a push back."""
    count = await conn.fetchval(
        "SELECT count(*) FROM connector_push_attempt "
        "WHERE created_at >= $3 AND connector_owner_key = $1 AND action_slot_id = $2 "
        "AND status = ANY($4::text[]) AND dispatch_lane = 'configured'",
        owner_key,
        action_slot,
        since,
        statuses,
    )
    return int(count)
