"""Named query for the prune's audit entry (SPEC G-8, OPS-2): how many rows of each kind
retention prunes are held, read before and after a run. One statement; no lock taken."""

from __future__ import annotations

from typing import Final

from db.records import Conn

RETAINED_ROWS: Final = """
SELECT (SELECT count(*) FROM ingress_receipt) AS ingress_receipts,
       (SELECT count(*) FROM connector_event) AS events,
       (SELECT count(*) FROM connector_patch_dispatch) AS patches,
       (SELECT count(*) FROM connector_send_journal WHERE patch_id IS NOT NULL) AS patch_journal,
       (SELECT count(*) FROM workflow_action_execution) AS action_executions
"""


async def retained_rows(conn: Conn) -> dict[str, int]:
    """Rows held per kind, keyed as `PruneCounts` names them."""
    row = await conn.fetchrow(RETAINED_ROWS)
    assert row is not None
    return {name: int(n) for name, n in dict(row).items()}
