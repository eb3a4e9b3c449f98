"""Named queries of the relay sweep (SPEC WF-2): which links have work a workflow must do."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from db.links import CLAIMABLE_LANES
from db.records import Conn
from db.transition_sql import ATTEMPT_MOVING

# Create attempts a workflow must move on: dispatch (pending, or processing with no
# checkpoint), resolve after a crash (processing with a checkpoint, post_sent: the
# dispatch parks or resends them, never re-POSTs blindly) or finish (writeback_pending):
# the attempt's active phase (migration 0351), whose index the sweep reads.
CREATE_WORK: Final = tuple(status.value for status in ATTEMPT_MOVING)
# PATCH dispatches waiting for, or stranded in, their workflow (SPEC §5.5).
PATCH_WORK: Final = ("pending", "processing")

LINKS_WITH_PENDING_WORK: Final = """
SELECT link_key FROM (
    SELECT link_key FROM connector_push_attempt
    WHERE phase = 'active' AND status = ANY($3::text[]) AND dispatch_lane = ANY($5::text[])
      AND updated_at <= now() - $6::interval
    UNION
    SELECT link_key FROM connector_patch_dispatch
    WHERE status = ANY($4::text[]) AND dispatch_lane = ANY($5::text[])
      AND updated_at <= now() - $6::interval
    UNION
    -- suspended where no run was going (migration 0290): woken once, to be listed
    SELECT link_key FROM connector_remote_link WHERE wake_pending
) AS work
WHERE $1::text IS NULL OR link_key > $1
ORDER BY link_key
LIMIT $2
"""


# After their wake-up: the flag is cleared once the signal-with-start was accepted.
WOKEN: Final = """
UPDATE connector_remote_link SET wake_pending = false
WHERE link_key = ANY($1::text[]) AND wake_pending
"""


async def woken(conn: Conn, keys: list[str]) -> None:
    """Clear the wake flag of `keys` (their workflows were signalled)."""
    await conn.execute(WOKEN, keys)


async def links_with_pending_work(
    conn: Conn, after: str | None, limit: int, min_age: timedelta
) -> list[str]:
    """Up to `limit` link keys, in key order after `after`, whose rows are `min_age` old."""
    rows = await conn.fetch(
        LINKS_WITH_PENDING_WORK,
        after,
        limit,
        list(CREATE_WORK),
        list(PATCH_WORK),
        CLAIMABLE_LANES,
        min_age,
    )
    return [row["link_key"] for row in rows]
