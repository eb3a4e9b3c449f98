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
# finished PATCH and whether one is queued: what `protocol.park.park_reason` reads. Keyset
# pages in link-key order (NF-7): $1 the row count, $2 the key a page starts
# after ('' for the first), $3 what is looked for; each branch walks an index from $2.
_FOUND: Final = """
WITH keys AS (
    {keys}
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


def _keys(*branches: tuple[str, str]) -> str:
    """The union of each (table, filter) branch's keys after $2, in key order, at most $1
    distinct ones from each (so a branch stops after a page instead of reading every
    match, and the union's first $1 are the first $1 overall)."""
    return "\n    UNION\n    ".join(
        f"(SELECT DISTINCT link_key FROM {table} WHERE ({where}) AND link_key > $2"
        " ORDER BY link_key LIMIT $1)"
        for table, where in branches
    )


LINK: Final = "connector_remote_link"
ATTEMPT: Final = "connector_push_attempt"
BY_RECORD_ID: Final = _FOUND.format(
    keys=_keys((LINK, "source_record_id = $3"), (ATTEMPT, "source_record_id = $3"))
)
BY_REMOTE_ID: Final = _FOUND.format(
    # an attempt's settled id (migration 0351): a moving one's is on its link already
    keys=_keys((LINK, "remote_id = $3"), (ATTEMPT, "settled_remote_id = $3"))
)
# Candidates only: the caller keeps those whose `park_reason` is the one asked for.
PARKED: Final = _FOUND.format(
    keys=_keys(
        (LINK, "status = 'suspended_drift'"),
        ("connector_patch_dispatch", "status IN ('ambiguous_remote_effect', 'failed')"),
        (ATTEMPT, "phase IN ('ambiguous_remote_effect', 'terminal_failed')"),
    )
)


async def links_by_record_id(conn: Conn, record_id: str, after: str, limit: int) -> list[Row]:
    return await conn.fetch(BY_RECORD_ID, limit, after, record_id)


async def links_by_remote_id(conn: Conn, remote_id: str, after: str, limit: int) -> list[Row]:
    return await conn.fetch(BY_REMOTE_ID, limit, after, remote_id)


async def parked_candidates(conn: Conn, after: str, limit: int) -> list[Row]:
    """Keys that may need an operator (a parked attempt, a suspended link, a PATCH whose
    outcome was unknown or that failed), the first `limit` after `after`."""
    return await conn.fetch(PARKED, limit, after)
