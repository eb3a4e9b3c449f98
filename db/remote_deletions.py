"""Named queries for remote-deletion evidence (SPEC G-8; migration 0180).

Append and read only: the table refuses UPDATE, DELETE and TRUNCATE, and retention
never names it. The caller owns the transaction (recording goes with settling the event).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from asyncpg import Record

from db.records import Conn
from protocol.ingress_policy import InboundHandler
from protocol.remote_deletion import RemoteDeletion

# Copied from the event row, so the evidence outlives its pruning; a re-run adds nothing.
RECORD_FROM_EVENT: Final = """
INSERT INTO connector_remote_deletion
    (event_id, target_object, remote_scope, remote_id, event_type, endpoint)
SELECT event_id, target_object, remote_scope, remote_object_id, event_type, endpoint
FROM connector_event WHERE event_id = $1
ON CONFLICT (event_id) DO NOTHING
"""

OF_OBJECT: Final = """
SELECT event_id, target_object, remote_scope, remote_id, event_type, endpoint, recorded_at
FROM connector_remote_deletion
WHERE target_object = $1 AND remote_id = $2 AND remote_scope = $3
ORDER BY recorded_at, event_id
"""

# Which of these remote ids of one target object and scope have a recorded deletion.
DELETED_IDS: Final = """
SELECT DISTINCT remote_id FROM connector_remote_deletion
WHERE target_object = $1 AND remote_scope = $2 AND remote_id = ANY($3::text[])
"""

# The deletions of the object each link points at (links with no remote id name none).
OF_LINKS: Final = """
SELECT l.link_key, d.event_id, d.target_object, d.remote_scope, d.remote_id, d.event_type,
       d.endpoint, d.recorded_at
FROM connector_remote_link l
JOIN connector_remote_deletion d
  ON d.target_object = l.target_object AND d.remote_id = l.remote_id
 AND d.remote_scope = l.remote_scope
WHERE l.link_key = ANY($1::text[])
ORDER BY l.link_key, d.recorded_at, d.event_id
"""


# S-2: whether `event_id` is a stored deletion event of the object link `$1` points at:
# the event row (before settling, and until retention prunes it) or the deletion evidence
# recorded from it (after). An id nobody stored, or one of another object, names nothing.
LINK_OBJECT_DELETED_BY: Final = """
SELECT l.target_object, l.remote_id
FROM connector_remote_link l
WHERE l.link_key = $1 AND (
    EXISTS (
        SELECT 1 FROM connector_event e
        WHERE e.event_id = $2 AND e.handler = $3 AND e.target_object = l.target_object
          AND e.remote_object_id = l.remote_id AND e.remote_scope = l.remote_scope
    )
    OR EXISTS (
        SELECT 1 FROM connector_remote_deletion d
        WHERE d.event_id = $2 AND d.target_object = l.target_object
          AND d.remote_id = l.remote_id AND d.remote_scope = l.remote_scope
    )
)
"""


class DeletedObject(NamedTuple):
    """The remote object a link points at, which a stored deletion event names."""

    target_object: str
    remote_id: str


def _deletion(row: Record) -> RemoteDeletion:
    return RemoteDeletion.model_validate({k: row[k] for k in RemoteDeletion.model_fields})


async def record_from_event(conn: Conn, event_id: str) -> None:
    """Record the deletion `event_id` reports (idempotent)."""
    await conn.execute(RECORD_FROM_EVENT, event_id)


async def of_object(
    conn: Conn, target_object: str, remote_id: str, remote_scope: str
) -> list[RemoteDeletion]:
    """Every recorded deletion of one remote object, oldest first."""
    rows = await conn.fetch(OF_OBJECT, target_object, remote_id, remote_scope)
    return [_deletion(row) for row in rows]


async def deleted_ids(
    conn: Conn, target_object: str, remote_scope: str, remote_ids: list[str]
) -> frozenset[str]:
    """The ids among `remote_ids` (of one target object and scope) reported deleted."""
    if not remote_ids:
        return frozenset()
    rows = await conn.fetch(DELETED_IDS, target_object, remote_scope, remote_ids)
    return frozenset(row["remote_id"] for row in rows)


async def of_links(conn: Conn, link_keys: list[str]) -> dict[str, list[RemoteDeletion]]:
    """The recorded deletions of each link's remote object; links with none are absent."""
    found: dict[str, list[RemoteDeletion]] = {}
    for row in await conn.fetch(OF_LINKS, link_keys):
        found.setdefault(row["link_key"], []).append(_deletion(row))
    return found


async def link_object_deleted_by(
    conn: Conn, link_key: str, event_id: str, handler: InboundHandler
) -> DeletedObject | None:
    """The link's remote object when `event_id` is a stored `handler` event (or recorded
    deletion) of exactly that object; None otherwise."""
    row = await conn.fetchrow(LINK_OBJECT_DELETED_BY, link_key, event_id, handler.value)
    return None if row is None else DeletedObject(row["target_object"], row["remote_id"])
