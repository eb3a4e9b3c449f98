"""Named queries for `revalidate owner` (C-4): the links an install change alone suspended,
lifting that suspension, and the owner's finalized links page by page (NF-7).

One statement per function; the caller owns the transaction and the link locks.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from db.records import Conn
from db.revalidation import LINK_STATE_COLUMNS, link_states_of
from protocol.link_row import LinkRowState

# Links suspended only because the install changed: every fail-closed finding recorded at
# the suspension is an install surface ($3). Read for planning (no locks).
SELECT_INSTALL_SUSPENDED: Final = f"""
SELECT {LINK_STATE_COLUMNS} FROM connector_remote_link
WHERE connector_owner_key = $1 AND status = 'suspended_drift' AND suspend_reason = ANY($2::text[])
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements(
          CASE WHEN jsonb_typeof(drift_findings) = 'array' THEN drift_findings
               ELSE '[]'::jsonb END) AS f
      WHERE f->>'disposition' = 'fail_closed' AND NOT (f->>'surface' = ANY($3::text[])))
ORDER BY link_key COLLATE "C"
"""

# suspended_drift -> finalized for those links, each still suspended for the same reason
# (the caller holds their link locks, taken in link-key order, and the owner's pack lock).
# The install they were validated under does not move here: the receipts of the
# revalidation that follows do. G-4 (protocol.restore_rule, rule 1) again, in the statement:
# only while install $5 is active and the link's (action slot, destination slot) is one of
# its pairs ($6, $7, position by position). The reason returned is the one lifted (RETURNING
# alone gives the new, null, value).
RESTORE_INSTALL_SUSPENDED: Final = """
UPDATE connector_remote_link l
SET status = 'finalized', suspend_reason = NULL, drift_findings = '[]'::jsonb,
    last_operator = $3, last_operator_reason = $4, last_operator_at = now()
FROM (SELECT link_key, suspend_reason FROM connector_remote_link
      WHERE link_key = ANY($1::text[]) FOR UPDATE) AS before
WHERE l.link_key = before.link_key AND l.status = 'suspended_drift'
  AND l.suspend_reason = ANY($2::text[])
  AND EXISTS (SELECT 1 FROM pack_install i
              WHERE i.pack_install_id = $5::uuid AND i.active
                AND i.connector_owner_key = l.connector_owner_key)
  AND (l.action_slot_id, l.destination_slot_id) IN (
      SELECT a, d FROM unnest($6::text[], $7::text[]) AS kept(a, d))
RETURNING l.link_key, before.suspend_reason
"""


class RestoreGuard(NamedTuple):
    """What RESTORE_INSTALL_SUSPENDED checks: the install that must still be active and
    its (action slot, destination slot) pairs, as two lists of one length."""

    pack_install_id: str
    action_slots: list[str]
    destination_slots: list[str]


class RestoredLink(NamedTuple):
    """A link RESTORE_INSTALL_SUSPENDED moved back to finalized, and the reason lifted."""

    link_key: str
    suspend_reason: str


async def install_suspended_link_states(
    conn: Conn, owner_key: str, reasons: list[str], surfaces: list[str]
) -> list[LinkRowState]:
    """The owner's links suspended for an install change and nothing else, by link key."""
    rows = await conn.fetch(SELECT_INSTALL_SUSPENDED, owner_key, reasons, surfaces)
    return list(link_states_of(rows))


async def restore_install_suspended(
    conn: Conn,
    link_keys: list[str],
    reasons: list[str],
    operator: tuple[str, str],
    guard: RestoreGuard,
) -> list[RestoredLink]:
    """Move those of `link_keys` still suspended for `reasons`, under a slot pair `guard`'s
    active install has, back to finalized, stamping `operator` (who, why); each moved, in
    link-key order."""
    rows = await conn.fetch(RESTORE_INSTALL_SUSPENDED, link_keys, reasons, *operator, *guard)
    return sorted(RestoredLink(row["link_key"], row["suspend_reason"]) for row in rows)


# Page forms for `revalidate owner` (NF-7: bounded memory at any count): link-key order.
SELECT_FINALIZED_LINKS_PAGE: Final = f"""
SELECT {LINK_STATE_COLUMNS} FROM connector_remote_link
WHERE connector_owner_key = $1 AND status = 'finalized' AND link_key COLLATE "C" > $2
ORDER BY link_key COLLATE "C" LIMIT $3
"""


async def finalized_link_states_page(
    conn: Conn, owner_key: str, after_key: str, limit: int
) -> list[LinkRowState]:
    """The owner's finalized links after `after_key`, at most `limit`, in link-key order."""
    rows = await conn.fetch(SELECT_FINALIZED_LINKS_PAGE, owner_key, after_key, limit)
    return list(link_states_of(rows))
