"""`connector-push backfill plan|apply` against a real database: exit codes, the per-record
report, paging through every record, and progress."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import asyncpg
from typer.testing import CliRunner, Result

from cli.backfill_progress import BackfillProgress
from cli.main import app
from db import records as records_q
from services.backfill import plan_backfill
from services.packs import apply_pack
from tests.db.backfill_support import (
    MARKER,
    OWNER,
    PROV,
    RID,
    SLOT,
    Fields,
    demo,
    key_of,
    put,
)

# -- the command -------------------------------------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["backfill", *args])


def prepare(dsn: str, records: dict[str, Fields]) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await apply_pack(conn, demo())
            for record_id, fields in records.items():
                await put(conn, record_id, fields)
        finally:
            await conn.close()

    asyncio.run(go())


def json_lines(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`--json` output: one object per record, then the run's totals."""
    *records, summary = [json.loads(line) for line in stdout.splitlines()]
    return records, summary


def link_rows(dsn: str) -> list[tuple[str, str]]:
    async def go() -> list[tuple[str, str]]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch("SELECT link_key, remote_id FROM connector_remote_link")
            return [(r["link_key"], r["remote_id"]) for r in rows]
        finally:
            await conn.close()

    return asyncio.run(go())


def test_cli_plan_then_apply_exit_zero_and_report_per_record(db_dsn: str) -> None:
    prepare(db_dsn, {"c-1": {RID: "r-1", PROV: MARKER}})

    planned = run("plan", "--owner-key", OWNER, "--database-url", db_dsn)
    assert planned.exit_code == 0, planned.output
    assert "push-contact (Contact)" in planned.stdout and "adoptable" in planned.stdout
    assert f"{key_of('c-1')[:12]}…" in planned.stdout and "c-1" in planned.stdout
    assert link_rows(db_dsn) == []

    applied = run("apply", "--owner-key", OWNER, "--json", "--database-url", db_dsn)
    assert applied.exit_code == 0, applied.output
    records, summary = json_lines(applied.stdout)
    assert summary["mode"] == "apply" and summary["totals"]["adopted"] == 1
    [record] = [r for r in records if r["record_id"] == "c-1"]
    assert (record["outcome"], record["link_key"]) == ("adopted", key_of("c-1"))
    assert link_rows(db_dsn) == [(key_of("c-1"), "r-1")]


def test_cli_exits_3_when_any_record_is_rejected_but_still_adopts_the_rest(db_dsn: str) -> None:
    prepare(db_dsn, {"c-1": {RID: "r-1", PROV: MARKER}, "c-2": {PROV: MARKER}})

    result = run("apply", "--owner-key", OWNER, "--action-slot", SLOT, "--database-url", db_dsn)

    assert result.exit_code == 3, result.output
    assert "provenance_without_remote_id" in result.stdout
    assert link_rows(db_dsn) == [(key_of("c-1"), "r-1")]


def test_cli_rejects_an_unknown_slot_or_owner_before_reading(db_dsn: str) -> None:
    prepare(db_dsn, {})
    unknown_slot = run(
        "plan", "--owner-key", OWNER, "--action-slot", "nope", "--database-url", db_dsn
    )
    no_pack = run("plan", "--owner-key", "nobody", "--database-url", db_dsn)
    assert (unknown_slot.exit_code, no_pack.exit_code) == (2, 2)
    assert "nope" in unknown_slot.output and "nobody" in no_pack.output


def test_cli_large_runs_page_through_every_record(db_dsn: str) -> None:
    records = {f"c-{i:03d}": {RID: f"r-{i}", PROV: MARKER} for i in range(120)}
    prepare(db_dsn, records)

    result = run(
        "apply", "--owner-key", OWNER, "--batch-size", "50", "--json", "--database-url", db_dsn
    )

    assert result.exit_code == 0, result.output
    rows, summary = json_lines(result.stdout)
    contacts = [r for r in rows if r["action_slot_id"] == SLOT]
    assert len(contacts) == 120 and summary["totals"]["adopted"] == 120
    assert len(link_rows(db_dsn)) == 120
    # A page of apply is one transaction holding a lock per key: bounded for a stock server.
    too_big = run("apply", "--owner-key", OWNER, "--batch-size", "1001", "--database-url", db_dsn)
    assert too_big.exit_code == 2, too_big.output


class RecordingProgress:
    def __init__(self) -> None:
        self.total: int | None = None
        self.advanced: list[int] = []

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, records: int) -> None:
        self.advanced.append(records)


async def test_progress_counts_every_record_of_the_selected_slots_page_by_page(
    db_pool: asyncpg.Pool,
) -> None:
    progress = RecordingProgress()
    async with db_pool.acquire() as conn:
        await apply_pack(conn, demo())
        for i in range(7):
            await put(conn, f"c-{i}", {})
        await records_q.upsert_record(conn, "Account", "a-1", {"Name": "Engines"})
        await plan_backfill(conn, OWNER, [SLOT], batch_size=3, progress=progress)
    assert (progress.total, progress.advanced) == (7, [3, 3, 1])


def test_without_a_terminal_progress_is_a_plain_line_at_most_every_interval() -> None:
    out = io.StringIO()
    now = [0.0]
    progress = BackfillProgress(
        "apply", interval_s=5.0, stream=lambda: out, clock=lambda: now[0], live=False
    )
    progress.start(1_000)
    for _ in range(10):  # a page of 100 records every 2 s
        now[0] += 2.0
        progress.advance(100)
    lines = out.getvalue().splitlines()
    # The first page at once, then every third page (6 s apart): 100, 400, 700, 1000.
    assert [line.split(" of ")[0] for line in lines] == [
        f"backfill apply: {n}" for n in (100, 400, 700, 1000)
    ]
    assert lines[0] == "backfill apply: 100 of 1000 records (10.0%), 50 records/s, time left ~18s"
