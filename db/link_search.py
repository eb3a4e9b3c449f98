"""Named queries for finding links by what an operator knows (SPEC OPS-1) and for the
facts a workflow starter names in the summary.

Each function runs one statement on a connection the caller owns. A link key's
rows are its link (once finalized) and its attempts (from the reservation on),
so every query reads both: a parked create has no link row yet.
"""

from __future__ import annotations

from typing import Final

import asyncpg

from db.records import Conn

Row = asyncpg.Record

FACT_COLUMNS: Final = (
    "link_key, connector_owner_key, action_slot_id, destination_slot_id, source_object, "
    "source_record_id"
)


async def link_facts(conn: Conn, link_keys: list[str]) -> list[Row]:
    """The ID-2 facts of each key that has rows (from its link, else its newest attempt)."""
    return await conn.fetch(
        f"""
        SELECT DISTINCT ON (link_key) {FACT_COLUMNS} FROM (
            SELECT {FACT_COLUMNS}, 0 AS rank FROM connector_remote_link
            WHERE link_key = ANY($1::text[])
            UNION ALL
            SELECT {FACT_COLUMNS}, 1 FROM connector_push_attempt
            WHERE link_key = ANY($1::text[])
        ) AS rows
        ORDER BY link_key, rank
        """,
        link_keys,
    )


# One row per link key: its facts, the link's state and the newest attempt's, the last
# finished PATCH and whether one is queued: what `protocol.park.park_reason` reads.
_FOUND: Final = """
WITH keys AS (
    SELECT link_key FROM connector_remote_link WHERE {link_filter}
    UNION
    SELECT link_key FROM connector_push_attempt WHERE {attempt_filter}
)
SELECT k.link_key,
       COALESCE(l.connector_owner_key, a.connector_owner_key) AS connector_owner_key,
       COALESCE(l.action_slot_id, a.action_slot_id) AS action_slot_id,
       COALESCE(l.destination_slot_id, a.destination_slot_id) AS destination_slot_id,
       COALESCE(l.source_object, a.source_object) AS source_object,
       COALESCE(l.source_record_id, a.source_record_id) AS source_record_id,
       l.status AS link_status, l.suspend_reason,
       COALESCE(l.remote_id, a.remote_id) AS remote_id,
       a.attempt_id, a.attempt_ordinal, a.status AS attempt_status, a.last_error,
       (SELECT status FROM connector_patch_dispatch p
        WHERE p.link_key = k.link_key AND status NOT IN ('pending', 'superseded')
        ORDER BY updated_at DESC LIMIT 1) AS last_patch_status,
       EXISTS (SELECT 1 FROM connector_patch_dispatch p
               WHERE p.link_key = k.link_key AND status IN ('pending', 'processing'))
           AS patch_queued
FROM keys k
LEFT JOIN connector_remote_link l ON l.link_key = k.link_key
LEFT JOIN LATERAL (
    SELECT * FROM connector_push_attempt x WHERE x.link_key = k.link_key
    ORDER BY attempt_ordinal DESC LIMIT 1
) a ON true
ORDER BY k.link_key
LIMIT $1
"""

BY_RECORD_ID: Final = _FOUND.format(
    link_filter="source_record_id = $2", attempt_filter="source_record_id = $2"
)
BY_REMOTE_ID: Final = _FOUND.format(link_filter="remote_id = $2", attempt_filter="remote_id = $2")
# Candidates only: the caller keeps those whose `park_reason` is the one asked for.
PARKED: Final = _FOUND.format(
    link_filter="status = 'suspended_drift' OR link_key IN (SELECT link_key FROM"
    " connector_patch_dispatch WHERE status = 'ambiguous_remote_effect')",
    attempt_filter="status IN ('ambiguous_remote_effect', 'terminal_failed')",
)


async def links_by_record_id(conn: Conn, record_id: str, limit: int) -> list[Row]:
    return await conn.fetch(BY_RECORD_ID, limit, record_id)


async def links_by_remote_id(conn: Conn, remote_id: str, limit: int) -> list[Row]:
    return await conn.fetch(BY_REMOTE_ID, limit, remote_id)


async def parked_candidates(conn: Conn, limit: int) -> list[Row]:
    """Every key that may need an operator (a parked attempt, a suspended link, a PATCH
    whose outcome was unknown)."""
    return await conn.fetch(PARKED, limit)
