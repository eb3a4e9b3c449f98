"""Named query for remote budgets (SPEC PROF-3): which install and destination a link spends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from db.records import Conn


@dataclass(frozen=True)
class LinkBudgetRow:
    pack_install_id: str
    destination_slot_id: str


# The newest attempt's frozen install is the one its requests are sent under.
LINK_BUDGET_ROW: Final = """
SELECT r.pack_install_id::text AS pack_install_id, a.destination_slot_id
FROM connector_push_attempt a JOIN connector_push_attempt_request r USING (attempt_id)
WHERE a.link_key = $1
ORDER BY attempt_ordinal DESC LIMIT 1
"""


async def select_link_budget_row(conn: Conn, link_key: str) -> LinkBudgetRow | None:
    row = await conn.fetchrow(LINK_BUDGET_ROW, link_key)
    if row is None:
        return None
    return LinkBudgetRow(row["pack_install_id"], row["destination_slot_id"])
