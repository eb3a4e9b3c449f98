"""The link-key locks and the owner scope lock above them (REV-2, NF-7).

Every transaction that acts on a link (admission, dispatch, answers, operator actions,
backfill, batches of saves) takes its link key's advisory lock, and first, shared, the
scope lock of the link's owner key. A bulk revalidation takes the owner scope lock
exclusively, for its whole transaction: one lock per owner excludes every one of them,
whatever the manifest's size, where a lock per member filled Postgres's shared lock
table (max_locks_per_transaction x max_connections) past ~10,000 members. The
revalidation itself takes no link-key lock; its row locks (FOR UPDATE) live in the rows.

Those of the owner wait for the revalidation (no lock_timeout on any of these paths);
other owners' locks are other keys and never wait for it. Locks are taken owner scopes
first (in owner-key order), then link keys (in link-key order), everywhere, so no two of
these transactions deadlock. A key without a link row (a first create) has no owner
scope to take: a revalidation moves existing links only.
"""

from __future__ import annotations

from typing import Final

from db.records import Conn


def owner_scope_lock_key(owner_sql: str) -> str:
    """The advisory lock key of an owner's links, for the owner-key SQL expression given."""
    return f"hashtextextended('link-owner:' || {owner_sql}, 7)"


# One key: the aggregate in FROM runs to its end (the owner scope taken) before the
# outer select list takes the link key's lock.
LOCK_LINK_KEY: Final = f"""
SELECT pg_advisory_xact_lock(hashtextextended($1, 7))
FROM (SELECT count(pg_advisory_xact_lock_shared({owner_scope_lock_key("l.connector_owner_key")}))
      FROM connector_remote_link l WHERE l.link_key = $1) AS owner_scope
"""

# Many keys: the owners' scopes in owner-key order (the select list of an ordered subquery
# runs above its sort); the aggregate finishes before the link keys' sort reads its one
# row, so every owner scope is taken before any link key, and the link keys in order.
LOCK_LINK_KEYS: Final = f"""
SELECT pg_advisory_xact_lock(hashtextextended(k, 7))
FROM (SELECT count(locked) FROM (
          SELECT pg_advisory_xact_lock_shared({owner_scope_lock_key("o")}) AS locked
          FROM (SELECT DISTINCT connector_owner_key AS o FROM connector_remote_link
                WHERE link_key = ANY($1::text[])) AS owners
          ORDER BY o COLLATE "C") AS owner_locks) AS owner_scope,
     (SELECT DISTINCT k FROM unnest($1::text[]) AS k) AS keys
ORDER BY k COLLATE "C"
"""

# A revalidation's: each owner key's scope, exclusively, in owner-key order.
LOCK_OWNER_SCOPES: Final = f"""
SELECT pg_advisory_xact_lock({owner_scope_lock_key("o")})
FROM unnest($1::text[]) AS o ORDER BY o COLLATE "C"
"""


async def lock_link_key(conn: Conn, link_key: str) -> None:
    await conn.execute(LOCK_LINK_KEY, link_key)


async def lock_link_keys(conn: Conn, link_keys: list[str]) -> None:
    await conn.execute(LOCK_LINK_KEYS, link_keys)


async def lock_owner_scopes(conn: Conn, owner_keys: list[str]) -> None:
    await conn.execute(LOCK_OWNER_SCOPES, owner_keys)
