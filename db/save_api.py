"""Named queries for the HTTP save API's idempotency records (SPEC API-1).

Each function runs one statement; the caller owns the transaction (STYLE rule 7).
"""

from __future__ import annotations

from dataclasses import dataclass

from db.records import Conn


@dataclass(frozen=True)
class IdempotencyClaim:
    """One client's `Idempotency-Key` and the hash of the request it came with."""

    client_id: str
    key: str
    request_hash: str


@dataclass(frozen=True)
class StoredAnswer:
    request_hash: str
    body: str  # the first answer's JSON text


async def stored_answer(conn: Conn, claim: IdempotencyClaim) -> StoredAnswer | None:
    row = await conn.fetchrow(
        "SELECT request_hash, answer::text AS body FROM save_api_request "
        "WHERE client_id = $1 AND idempotency_key = $2",
        claim.client_id,
        claim.key,
    )
    return None if row is None else StoredAnswer(row["request_hash"], row["body"])


async def store_answer(conn: Conn, claim: IdempotencyClaim, body: str) -> bool:
    """Store the first answer; False when a concurrent request stored one first (it waits
    for that transaction, so the caller rolls back and replays the winner's answer)."""
    inserted = await conn.fetchval(
        "INSERT INTO save_api_request (client_id, idempotency_key, request_hash, answer) "
        "VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT DO NOTHING RETURNING true",
        claim.client_id,
        claim.key,
        claim.request_hash,
        body,
    )
    return inserted is True
