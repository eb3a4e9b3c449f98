"""Whether a link key has any rows: the operator commands ask before waking a workflow."""

from __future__ import annotations

import asyncpg

_KNOWN = """
SELECT EXISTS (SELECT 1 FROM connector_remote_link WHERE link_key = $1)
    OR EXISTS (SELECT 1 FROM connector_push_attempt WHERE link_key = $1)
"""


async def link_key_known(conn: asyncpg.Connection, link_key: str) -> bool:
    """True when a link or an attempt row carries `link_key`."""
    return bool(await conn.fetchval(_KNOWN, link_key))
