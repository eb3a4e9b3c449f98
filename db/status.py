"""Named queries for the status view (`connector-push status`): counts only, one statement each."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from db.records import Conn

# The per-state deltas the link triggers append (migration 0160), never the links.
LINKS_BY_STATE: Final = """
SELECT status AS label, sum(n) AS n FROM connector_link_state_count GROUP BY 1 HAVING sum(n) <> 0
"""

SUSPENDED_BY_SURFACE: Final = """
SELECT coalesce(suspend_reason, 'unknown') AS label, count(*) AS n FROM connector_remote_link
WHERE status = 'suspended_drift' GROUP BY 1
"""

# Parked work that waits for a person: the occupying attempt's status, or a PATCH whose
# outcome is unknown (the LinkWorkflow's `patch_outcome_unknown`). An attempt's indexes
# name its phase, which is its status once it settled (migration 0351).
PARKED_BY_REASON: Final = """
SELECT status AS label, count(*) AS n FROM connector_push_attempt
WHERE phase IN ('ambiguous_remote_effect', 'terminal_failed') GROUP BY 1
UNION ALL
SELECT 'patch_outcome_unknown', count(*) FROM connector_patch_dispatch
WHERE status = 'ambiguous_remote_effect' HAVING count(*) > 0
"""

QUEUE_DEPTH: Final = """
SELECT
  (SELECT count(*) FROM connector_push_attempt WHERE phase = 'active') AS attempts,
  (SELECT count(*) FROM connector_patch_dispatch WHERE status IN ('pending', 'processing'))
      AS patches
"""

# Finished work and admissions since $1.
RECENT: Final = """
SELECT
  (SELECT count(*) FROM connector_push_attempt WHERE finalized_at >= $1) AS creates,
  (SELECT count(*) FROM connector_patch_dispatch
   WHERE status = 'succeeded' AND updated_at >= $1) AS patches,
  (SELECT count(*) FROM ingress_receipt WHERE received_at >= $1) AS admissions
"""

OLDEST_PARKED: Final = """
SELECT link_key, reason, since FROM (
    SELECT link_key, status AS reason, updated_at AS since FROM connector_push_attempt
    WHERE phase IN ('ambiguous_remote_effect', 'terminal_failed')
    UNION ALL
    SELECT link_key, coalesce(suspend_reason, 'suspended'), updated_at FROM connector_remote_link
    WHERE status = 'suspended_drift'
    UNION ALL
    SELECT link_key, 'patch_outcome_unknown', updated_at FROM connector_patch_dispatch
    WHERE status = 'ambiguous_remote_effect'
) parked ORDER BY since, link_key LIMIT 1
"""


async def _by_label(conn: Conn, sql: str) -> dict[str, int]:
    return {row["label"]: int(row["n"]) for row in await conn.fetch(sql)}


async def links_by_state(conn: Conn) -> dict[str, int]:
    return await _by_label(conn, LINKS_BY_STATE)


async def suspended_by_surface(conn: Conn) -> dict[str, int]:
    return await _by_label(conn, SUSPENDED_BY_SURFACE)


async def parked_by_reason(conn: Conn) -> dict[str, int]:
    return await _by_label(conn, PARKED_BY_REASON)


async def queue_depth(conn: Conn) -> tuple[int, int]:
    """(pending or in-flight attempts, pending or in-flight PATCHes)."""
    row = await conn.fetchrow(QUEUE_DEPTH)
    assert row is not None
    return int(row["attempts"]), int(row["patches"])


async def recent(conn: Conn, since: datetime) -> tuple[int, int, int]:
    """(creates finalized, PATCHes succeeded, ingress receipts admitted) since `since`."""
    row = await conn.fetchrow(RECENT, since)
    assert row is not None
    return int(row["creates"]), int(row["patches"]), int(row["admissions"])


async def oldest_parked(conn: Conn) -> tuple[str, str, datetime] | None:
    row = await conn.fetchrow(OLDEST_PARKED)
    return None if row is None else (row["link_key"], row["reason"], row["since"])


async def fold_link_state_counts(conn: Conn) -> None:
    """Fold the per-state deltas into one row per state (migration 0160): every worker
    calls this every 30 s (worker/link_counts.py), so `links_by_state` reads a few rows."""
    await conn.execute("SELECT connector_fold_link_state_counts()")
