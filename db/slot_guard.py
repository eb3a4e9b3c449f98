"""A link born under a slot the active install lacks (SPEC C-9, G-4): the create path's
finalization takes the owner's apply lock shared, so no `pack apply` commits between the
link's birth and its check, and suspends the link when the install lacks its slot pair,
as the apply suspends the finalized links it finds (db.packs.SUSPEND_REMOVED_SLOT_LINKS).
"""

from __future__ import annotations

from typing import Final

from db.packs import OWNER_APPLY_KEY
from db.records import Conn

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


async def lock_owner_key_shared(conn: Conn, owner_key: str) -> None:
    """The apply lock of one `ConnectorOwnerKey`, shared (for this transaction)."""
    await conn.execute(LOCK_OWNER_KEY_SHARED, owner_key)


async def suspend_if_slot_gone(conn: Conn, link_key: str, reason: str, surface: str) -> bool:
    """Suspend the finalized link `link_key` when the active install lacks its slot pair."""
    return await conn.fetchval(SUSPEND_IF_SLOT_GONE, link_key, reason, surface) is not None
