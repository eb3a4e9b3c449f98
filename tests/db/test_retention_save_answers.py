"""SPEC S-7, OPS-3: retention covers stored save answers (idempotency records past the
cut-off go; newer ones stay, so a repeat within the window still gets its answer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from protocol.retention import PruneCounts, PruneInput
from services.retention import prune

DAY = 86_400


async def test_s7_prune_deletes_stored_save_answers_past_the_cut_off(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute(
        "INSERT INTO save_api_request (client_id, idempotency_key, request_hash, answer, "
        "created_at) VALUES ('crm', 'old-1', 'h', '{}', now() - interval '40 days'), "
        "('crm', 'old-2', 'h', '{}', now() - interval '31 days'), "
        "('crm', 'new', 'h', '{}', now() - interval '29 days')"
    )
    request = PruneInput(older_than_seconds=30 * DAY, batch_size=1, dry_run=True)
    dry = await prune(conn, request, datetime.now(UTC))
    assert dry.counts.save_answers == 2
    assert await conn.fetchval("SELECT count(*) FROM save_api_request") == 3
    report = await prune(conn, request.model_copy(update={"dry_run": False}), datetime.now(UTC))
    assert report.counts.save_answers == 2
    kept = await conn.fetch("SELECT idempotency_key FROM save_api_request")
    assert [r["idempotency_key"] for r in kept] == ["new"]
    later = datetime.now(UTC) + timedelta(days=2)
    again = await prune(conn, request.model_copy(update={"dry_run": False}), later)
    assert again.counts == PruneCounts(save_answers=1)
