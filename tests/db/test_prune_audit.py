"""SPEC G-8 (`prune` writes an audit entry), against real Postgres: every prune run, by
the service or the CLI, appends one OPS-2 entry naming who, why, the cut-off and the rows
of each kind before and after; a dry run deletes nothing and appends nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from typer.testing import CliRunner

from cli.main import app
from db import audit as audit_q
from protocol.audit import AuditCommand, AuditRecord
from protocol.retention import PruneInput
from services.prune_audit import audited_prune
from tests.db.rows import insert_event, set_status

LATER = datetime.now(UTC) + timedelta(days=41)
THIRTY_DAYS = int(timedelta(days=30).total_seconds())


async def _prune_entries(conn: asyncpg.Connection) -> list[AuditRecord]:
    return [
        e for e in await audit_q.entries(conn, None, None, 100) if e.command is AuditCommand.PRUNE
    ]


async def test_g8_a_prune_appends_one_audit_entry_with_counts_before_and_after(
    conn: asyncpg.Connection,
) -> None:
    events = [await insert_event(conn) for _ in range(3)]
    for event_id in events[:2]:
        await set_status(conn, "event", event_id, "processed")
    request = PruneInput(older_than_seconds=THIRTY_DAYS, batch_size=1)

    dry = await audited_prune(conn, request.model_copy(update={"dry_run": True}), LATER, "o", "r")
    assert dry.counts.events == 2 and await _prune_entries(conn) == []

    report = await audited_prune(conn, request, LATER, "ops@example.com", "monthly retention")
    assert report.counts.events == 2
    [entry] = await _prune_entries(conn)
    assert (entry.operator, entry.reason, entry.link_key) == (
        "ops@example.com",
        "monthly retention",
        None,
    )
    assert entry.arguments["older_than_seconds"] == THIRTY_DAYS
    assert entry.arguments["cut_off"] == (LATER - timedelta(days=30)).isoformat()
    before: Any = entry.state_before
    after: Any = entry.state_after
    assert (before["rows"]["events"], after["rows"]["events"]) == (3, 1)
    assert entry.outcome.startswith("deleted 2 finished row(s)")

    # Nothing left to delete: still a prune, still an entry.
    await audited_prune(conn, request, LATER, "ops@example.com", "again")
    entries = await _prune_entries(conn)
    assert [e.reason for e in entries] == ["again", "monthly retention"]
    assert entries[0].outcome.startswith("deleted 0 finished row(s)")


def _prune(*args: str) -> Any:
    return asyncio.to_thread(CliRunner().invoke, app, ["prune", *args])


async def test_g8_the_prune_command_records_who_and_why(
    conn: asyncpg.Connection, db_dsn: str
) -> None:
    dry = await _prune("--older-than", "30d", "--dry-run", "--database-url", db_dsn)
    assert dry.exit_code == 0, dry.output
    assert await _prune_entries(conn) == []
    common = ("--older-than", "30d", "--database-url", db_dsn)
    done = await _prune(*common, "--operator", "ops", "--reason", "CHG-7 disk")
    assert done.exit_code == 0, done.output
    [entry] = await _prune_entries(conn)
    assert (entry.operator, entry.reason, entry.command) == ("ops", "CHG-7 disk", "prune")
    blank = await _prune(*common, "--operator", " ")
    assert blank.exit_code == 2 and "--operator" in blank.output
