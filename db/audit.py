"""Named queries for the operator audit trail (SPEC OPS-2; migration 0040).

Append and read only: the table refuses UPDATE, DELETE and TRUNCATE. The caller
appends inside the transaction of the action it records.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Final

from asyncpg import Record

from db.records import Conn
from protocol.audit import AuditEntry, AuditRecord

INSERT_AUDIT: Final = """
INSERT INTO connector_operator_audit
    (operator, reason, command, link_key, arguments, state_before, state_after, outcome)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7::jsonb, $8)
"""

SELECT_AUDIT: Final = """
SELECT audit_id, recorded_at, operator, reason, command, link_key, arguments::text AS arguments,
       state_before::text AS state_before, state_after::text AS state_after, outcome
FROM connector_operator_audit
WHERE ($1::text IS NULL OR link_key = $1)
  AND ($2::timestamptz IS NULL OR recorded_at >= $2)
ORDER BY audit_id DESC
LIMIT $3
"""


def _json_or_null(value: object) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


async def append(conn: Conn, entry: AuditEntry) -> None:
    """Append one entry in the caller's transaction."""
    await conn.execute(
        INSERT_AUDIT,
        entry.operator,
        entry.reason,
        entry.command.value,
        entry.link_key,
        json.dumps(entry.arguments, sort_keys=True),
        _json_or_null(entry.state_before),
        _json_or_null(entry.state_after),
        entry.outcome,
    )


def _record(row: Record) -> AuditRecord:
    loaded = {k: json.loads(row[k]) if row[k] is not None else None
              for k in ("arguments", "state_before", "state_after")}  # fmt: skip
    return AuditRecord.model_validate({**dict(row), **loaded})


async def entries(
    conn: Conn, link_key: str | None, since: datetime | None, limit: int
) -> list[AuditRecord]:
    """The newest `limit` entries (newest first), optionally of one link and since a time."""
    return [_record(row) for row in await conn.fetch(SELECT_AUDIT, link_key, since, limit)]
