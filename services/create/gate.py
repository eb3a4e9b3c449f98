"""Attempt-side drift before every POST (GATE-2; seed drift matrix, "Active create attempt").

Under its claim, before the checkpoint, a create re-classifies the attempt's frozen
snapshot against the live pack: before the first try, every retry, and the re-send
after a locator lookup that found nothing (SPEC C-5). A try whose remote id is durable
(writeback_pending, or a locator lookup that found the object) is never gated.

The active install id comes with the attempt row (`db.links.occupying_attempt`) and
the install's parsed manifest from the process cache, so the common path costs no
statement and no transaction of its own.
"""

from __future__ import annotations

import asyncpg

from db import links as q
from db.records import Conn
from protocol.active import resolve_active
from protocol.drift import Disposition, Finding, classify, fails_closed
from services.packs import install_cached
from services.rows import attempt_snapshot, jsonb


async def attempt_findings(conn: Conn, attempt: asyncpg.Record) -> list[Finding]:
    """Every finding between what the attempt froze and the owner's active install."""
    install_id = attempt["active_pack_install_id"]
    pack = None if install_id is None else await install_cached(conn, install_id)
    active = (
        None
        if pack is None
        else resolve_active(
            pack.manifest,
            pack.pack_install_id,
            attempt["action_slot_id"],
            attempt["destination_slot_id"],
            install_ancestors=frozenset(pack.ancestors),
        )
    )
    return classify(attempt_snapshot(attempt), active)


async def drift_refusal(conn: Conn, attempt: asyncpg.Record) -> str | None:
    """Record the findings (a statement only when they changed); the refusal detail when
    one fails closed. The caller parks the attempt; nothing is sent."""
    findings = await attempt_findings(conn, attempt)
    if not findings:
        return None
    dumped = [f.model_dump(mode="json") for f in findings]
    if jsonb(attempt["drift_findings"]) != dumped:  # a retried try rewrites nothing
        await q.record_attempt_drift(conn, str(attempt["attempt_id"]), dumped)
    if not fails_closed(findings):
        return None
    closed = [f for f in findings if f.disposition is Disposition.FAIL_CLOSED]
    return "drift before POST: " + "; ".join(f"{f.surface.value}: {f.detail}" for f in closed)
