"""Retention (SPEC OPS-3, S-7): delete finished rows older than a cut-off, in batches,
and stored save answers of the same age.

Never links, attempts, a PATCH that is not settled (`ambiguous_remote_effect`
included), the journal of such a PATCH or of an unfinished attempt, revalidation
receipts or the audit trail: no query here selects them, so a run skips them rather
than failing on them, and Postgres refuses their delete anyway (G-3: migrations 0001,
0010, 0040, 0041, 0170). Each batch is its own transaction so a long
prune holds no lock for long; a dry run deletes inside one transaction and rolls
it back, so its figures are exactly what a real run would delete now.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from db import retention as q
from db.records import Conn
from protocol.retention import PruneCounts, PruneInput, PruneReport


async def _batch(conn: Conn, before: datetime, request: PruneInput) -> PruneCounts:
    """One batch of every kind, in foreign-key order."""
    size = request.batch_size
    executions = await q.delete_action_executions(conn, before, size)
    receipts = await q.delete_ingress_receipts(conn, before, size)
    events = await q.delete_events(conn, before, size)
    patches, journal = await q.delete_patches(conn, before, size, request.keep_patches_per_link)
    save_answers = await q.delete_save_answers(conn, before, size)
    return PruneCounts(
        ingress_receipts=receipts,
        events=events,
        patches=patches,
        patch_journal=journal,
        action_executions=executions,
        save_answers=save_answers,
    )


def _add(a: PruneCounts, b: PruneCounts) -> PruneCounts:
    return PruneCounts.model_validate(
        {name: getattr(a, name) + getattr(b, name) for name in PruneCounts.model_fields}
    )


def _empty(counts: PruneCounts) -> bool:
    return not any(getattr(counts, name) for name in PruneCounts.model_fields)


async def prune(conn: Conn, request: PruneInput, now: datetime) -> PruneReport:
    """Delete (or, dry run, count) every finished row older than `now - older_than`."""
    before = now - timedelta(seconds=request.older_than_seconds)
    if request.dry_run:
        tx = conn.transaction()
        await tx.start()
        try:
            total = await _drain(conn, before, request, in_transaction=True)
        finally:
            await tx.rollback()
    else:
        total = await _drain(conn, before, request, in_transaction=False)
    return PruneReport(
        dry_run=request.dry_run,
        older_than_seconds=request.older_than_seconds,
        keep_patches_per_link=request.keep_patches_per_link,
        counts=total,
    )


async def _drain(
    conn: Conn, before: datetime, request: PruneInput, *, in_transaction: bool
) -> PruneCounts:
    total = PruneCounts()
    while True:
        if in_transaction:
            counts = await _batch(conn, before, request)
        else:
            async with conn.transaction():
                counts = await _batch(conn, before, request)
        if _empty(counts):
            return total
        total = _add(total, counts)
