"""Named queries for the operator audit trail (SPEC OPS-2; migrations 0040, 0225).

Append and read only: the table refuses UPDATE, DELETE and TRUNCATE. The caller
appends inside the transaction of the action it records. S-5: Postgres records the
writer's role, login and client address itself; an entry without a host gets this
process's host name.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from asyncpg import Record

from db.records import Conn
from protocol.audit import AuditEntry, AuditRecord

# One statement for any number of entries (a bulk action appends a page at once,
# bench P4); audit ids follow the order of the entries.
INSERT_AUDIT: Final = """
INSERT INTO connector_operator_audit
    (operator, reason, command, link_key, arguments, state_before, state_after, outcome,
     host, temporal_identity)
SELECT operator, reason, command, link_key, arguments, state_before, state_after, outcome,
       host, temporal_identity
FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[], $7::jsonb[],
    $8::text[], $9::text[], $10::text[]
) WITH ORDINALITY
    AS e (operator, reason, command, link_key, arguments, state_before, state_after, outcome,
          host, temporal_identity, n)
ORDER BY n
RETURNING audit_id
"""

# A keyset page, newest first (NF-7): $4 is the audit id a page starts before.
SELECT_AUDIT: Final = """
SELECT audit_id, recorded_at, operator, reason, command, link_key, arguments::text AS arguments,
       state_before::text AS state_before, state_after::text AS state_after, outcome,
       host, temporal_identity, db_role, db_session_user,
       host(db_client_addr) AS db_client_addr
FROM connector_operator_audit
WHERE ($1::text IS NULL OR link_key = $1)
  AND ($2::timestamptz IS NULL OR recorded_at >= $2)
  AND audit_id < $4
ORDER BY audit_id DESC
LIMIT $3
"""
NO_AUDIT_ID: Final = 2**63 - 1  # above every audit id: the first page


def _json_or_null(value: object) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


async def append(conn: Conn, entry: AuditEntry) -> int:
    """Append one entry in the caller's transaction; its audit id."""
    [audit_id] = await append_many(conn, [entry])
    return audit_id


async def append_many(conn: Conn, entries: Sequence[AuditEntry]) -> list[int]:
    """Append `entries`, in order, in the caller's transaction: one statement; their ids."""
    here = socket.gethostname()
    rows = await conn.fetch(
        INSERT_AUDIT,
        [e.operator for e in entries],
        [e.reason for e in entries],
        [e.command.value for e in entries],
        [e.link_key for e in entries],
        [json.dumps(e.arguments, sort_keys=True) for e in entries],
        [_json_or_null(e.state_before) for e in entries],
        [_json_or_null(e.state_after) for e in entries],
        [e.outcome for e in entries],
        [e.host or here for e in entries],
        [e.temporal_identity for e in entries],
    )
    return sorted(int(row["audit_id"]) for row in rows)


def _record(row: Record) -> AuditRecord:
    loaded = {k: json.loads(row[k]) if row[k] is not None else None
              for k in ("arguments", "state_before", "state_after")}  # fmt: skip
    return AuditRecord.model_validate({**dict(row), **loaded})


async def entries(
    conn: Conn,
    link_key: str | None,
    since: datetime | None,
    limit: int,
    before: int | None = None,
) -> list[AuditRecord]:
    """The newest `limit` entries (newest first) older than audit id `before`, optionally
    of one link and since a time."""
    rows = await conn.fetch(SELECT_AUDIT, link_key, since, limit, before or NO_AUDIT_ID)
    return [_record(row) for row in rows]
