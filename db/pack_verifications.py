"""Named queries for `pack verify` results (migration 0270): one statement each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from pydantic import JsonValue

from db.records import Conn

INSERT: Final = """
INSERT INTO connector_pack_verification
    (manifest_digest, profile_name, base_url, results, operator)
VALUES ($1, $2, $3, $4::jsonb, $5)
RETURNING verification_id
"""

# The newest result of each profile verified for one digest.
SELECT_LATEST: Final = """
SELECT DISTINCT ON (profile_name) profile_name, results::text AS results
FROM connector_pack_verification
WHERE manifest_digest = $1
ORDER BY profile_name, verification_id DESC
"""


async def insert_verification(
    conn: Conn,
    manifest_digest: str,
    profile_name: str,
    base_url: str,
    results: Sequence[JsonValue],
    operator: str,
) -> int:
    """Append one run's results; its id."""
    value = await conn.fetchval(
        INSERT, manifest_digest, profile_name, base_url, json.dumps(list(results)), operator
    )
    return int(value)


async def select_latest(conn: Conn, manifest_digest: str) -> dict[str, JsonValue]:
    """The newest results (a JSON array) of each profile verified for `manifest_digest`."""
    rows = await conn.fetch(SELECT_LATEST, manifest_digest)
    return {row["profile_name"]: json.loads(row["results"]) for row in rows}
