"""`connector-push prune`: retention of finished rows (SPEC OPS-3)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json
from cli.database import resolve_dsn as _dsn
from protocol.retention_defaults import DEFAULT_BATCH_SIZE, DEFAULT_KEEP_PATCHES

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from protocol.retention import PruneInput, PruneReport

_stdout = Console(highlight=False)

_KINDS = (
    ("ingress_receipts", "ingress receipts (event finished or none)"),
    ("events", "events (processed, skipped, dead)"),
    ("patches", "PATCH rows beyond each link's newest N (succeeded, failed, superseded)"),
    ("patch_journal", "send-journal rows of those PATCHes"),
    ("action_executions", "workflow action executions (delivered, stopped)"),
    ("save_answers", "stored save API answers (idempotency records)"),
)


async def _run(dsn: str, request: PruneInput, operator: str, reason: str) -> PruneReport:
    from services.prune_audit import audited_prune

    async with connect(dsn) as conn:
        return await audited_prune(conn, request, datetime.now(UTC), operator, reason)


def _print(report: PruneReport, older_than: str) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    table = Table(title=f"finished rows older than {older_than}: {verb}", title_justify="left")
    table.add_column("rows", justify="right")
    table.add_column("kind")
    for field, label in _KINDS:
        table.add_row(str(getattr(report.counts, field)), label)
    _stdout.print(table)
    note = "dry run: nothing deleted" if report.dry_run else "done"
    _stdout.print(
        f"{note}; never pruned: links, attempts, unsettled PATCHes, unresolved journals, "
        "revalidation receipts, the audit trail"
    )


def prune_command(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Age of finished rows to delete: 30d, 12h, 2w.")
    ],
    keep_patches: Annotated[
        int,
        typer.Option("--keep-patches", min=0, max=1_000_000, help="PATCH rows each link keeps."),
    ] = DEFAULT_KEEP_PATCHES,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=100_000, help="Rows per kind per batch.")
    ] = DEFAULT_BATCH_SIZE,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only; delete nothing.")] = False,
    operator: Annotated[
        str, typer.Option("--operator", help="Who prunes (recorded in the audit trail).")
    ] = os.environ.get("USER", "operator"),
    reason: Annotated[
        str, typer.Option("--reason", help="Why (recorded in the audit trail).")
    ] = "",
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Delete finished ingress receipts, events, action executions and old PATCH rows; each
    run (not a dry run) appends an audit entry with the row counts before and after."""
    import asyncio

    from protocol.retention import AgeInvalid, PruneInput, parse_age

    try:
        age = parse_age(older_than)
    except AgeInvalid as error:
        bad_input(f"--older-than: {error}")
    request = PruneInput(
        older_than_seconds=int(age.total_seconds()),
        keep_patches_per_link=keep_patches,
        batch_size=batch_size,
        dry_run=dry_run,
    )
    if not operator.strip():
        bad_input("--operator: say who prunes (it is recorded in the audit trail)")
    report = asyncio.run(_run(_dsn(database_url), request, operator, reason))
    if as_json:
        echo_json(report.model_dump(mode="json"))
    else:
        _print(report, older_than)


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_command)
