"""A link born under a slot the active install lacks (SPEC C-9, G-4): the create path's
finalization takes the owner's apply lock shared, so no `pack apply` commits between the
link's birth and its check, and suspends the link when the install lacks its slot pair,
as the apply suspends the finalized links it finds (db.packs.SUSPEND_REMOVED_SLOT_LINKS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from db.packs import OWNER_APPLY_KEY, owner_apply_lock_key
from db.records import Conn
from db.revalidation_scope import LOCK_LINK_KEY

# The same lock, shared: a create's finalization holds it so no apply commits between
# the link's birth and its check against the active install (C-9, G-4).
LOCK_OWNER_KEY_SHARED: Final = f"SELECT pg_advisory_xact_lock_shared({OWNER_APPLY_KEY})"

# C-9 for a link born after the apply that removed its action slot (a create already sent
# when the slot went): suspended at birth, as the apply suspended the links it found.
SUSPEND_IF_SLOT_GONE: Final = """
UPDATE connector_remote_link l
SET status = 'suspended_drift', suspend_reason = $2,
    drift_findings = jsonb_build_array(jsonb_build_object(
        'surface', $3::text, 'disposition', 'fail_closed',
        'detail', 'action slot ' || quote_literal(l.action_slot_id)
                  || ' is not in install ' || p.pack_install_id::text))
FROM pack_install p
WHERE l.link_key = $1 AND l.status = 'finalized'
  AND p.connector_owner_key = l.connector_owner_key AND p.active
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements(p.manifest -> 'actionSlots') s
      WHERE s ->> 'id' = l.action_slot_id AND s ->> 'destinationSlot' = l.destination_slot_id)
RETURNING l.link_key
"""


# The create path's finalization takes both of its locks in its first statement: the link
# key's (with the owner scope above it, LOCK_LINK_KEY), then the apply lock of the
# attempt's owner, shared; one round trip, not two. Each subquery's select list runs
# before the query around it reads its row (volatile functions are neither flattened nor
# pruned), so the order is the link key's first, as when they were two statements, and
# every later statement of the transaction reads with a snapshot taken after both.
LOCK_LINK_KEY_AND_OWNER_SHARED: Final = f"""
SELECT pg_advisory_xact_lock_shared({owner_apply_lock_key("owner.key")})
FROM (SELECT (SELECT a.connector_owner_key FROM connector_push_attempt a
              WHERE a.attempt_id = $2) AS key
      FROM ({LOCK_LINK_KEY}) AS link_locked) AS owner
"""


@dataclass(frozen=True)
class OwnerApplyShared:
    """This transaction holds the apply lock of `attempt_id`'s owner, shared; made only by
    `lock_link_key_and_owner_shared`, so the finalization it is passed to need not take
    the lock again."""

    attempt_id: str


async def lock_owner_key_shared(conn: Conn, owner_key: str) -> None:
    """The apply lock of one `ConnectorOwnerKey`, shared (for this transaction)."""
    await conn.execute(LOCK_OWNER_KEY_SHARED, owner_key)


async def lock_link_key_and_owner_shared(
    conn: Conn, link_key: str, attempt_id: str
) -> OwnerApplyShared:
    """The link key's lock (`db.links.lock_link_key`), then the apply lock of the owner of
    `attempt_id`, shared, in one statement (for this transaction)."""
    await conn.execute(LOCK_LINK_KEY_AND_OWNER_SHARED, link_key, attempt_id)
    return OwnerApplyShared(attempt_id)


async def suspend_if_slot_gone(conn: Conn, link_key: str, reason: str, surface: str) -> bool:
    """Suspend the finalized link `link_key` when the active install lacks its slot pair."""
    return await conn.fetchval(SUSPEND_IF_SLOT_GONE, link_key, reason, surface) is not None
