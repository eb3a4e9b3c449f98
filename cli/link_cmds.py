"""`save`, `links list|show`, `attempts list|show`: the CRM's entry and the operator's view."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Final

import asyncpg
import typer
from pydantic import TypeAdapter
from rich.console import Console
from rich.markup import escape

from cli import link_views
from cli.database import AsJson, DatabaseUrl, connect_postgres, resolve_dsn
from cli.entry import (
    admission_pool,
    connect_best_effort,
    run_closing_temporal,
    runtime_settings,
    warn_deferred,
)
from cli.errors import EXIT_REJECTED, fail
from db import journal as journal_q
from protocol.admission import AdmissionDecision, SaveRequest
from protocol.states import AttemptStatus, LinkStatus
from worker.crm import SaveOutcome, WakeStatus, report_save_outcome, wake_best_effort

console = Console()
_stderr = Console(stderr=True)
_DECISION = TypeAdapter(AdmissionDecision)
LIST_LIMIT: Final = 500
ListLimit = Annotated[
    int, typer.Option("--limit", min=1, max=100_000, help="show at most N rows, newest first")
]

LINK_COLUMNS = "link_key, source_object, source_record_id, action_slot_id, status, remote_id"
ATTEMPT_COLUMNS = (
    "attempt_id, link_key, source_record_id, attempt_ordinal, status, dispatch_lane, last_error"
)


async def _save(dsn: str, save: SaveRequest) -> SaveOutcome:
    """Admit first (API-2); then wake the workflow if Temporal answers in time."""
    settings = runtime_settings()
    async with admission_pool(dsn) as pool:
        outcome = await report_save_outcome(pool, None, settings.task_queue, save)
        if outcome.wake is WakeStatus.NOT_NEEDED:
            return outcome
        client = await connect_best_effort(settings)
        if client is None:
            return outcome
        wake = await wake_best_effort(
            client, settings.task_queue, outcome.decision, pool=pool, save=save
        )
        if wake is WakeStatus.DEFERRED:
            warn_deferred()
        return SaveOutcome(outcome.decision, wake)


async def _rows(dsn: str, sql: str, *args: object) -> list[dict[str, Any]]:
    conn = await connect_postgres(dsn)
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


JOURNAL_COLUMNS = (
    "journal_id",
    "attempt_ordinal",
    "patch_id",
    "method",
    "sending_at",
    "outcome",
    "status",
    "remote_id",
    "retry_after_seconds",
    "may_have_landed",
)


def _journal(rows: list[asyncpg.Record]) -> list[dict[str, Any]]:
    """JRN-1: one line per try that passed its fence, and whether it may have landed."""
    return [{column: r[column] for column in JOURNAL_COLUMNS} for r in rows]


async def _attempt_and_journal(
    dsn: str, attempt_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    conn = await connect_postgres(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT * FROM connector_push_attempt WHERE attempt_id::text = $1", attempt_id
        )
        if row is None:
            return None
        tries = await journal_q.link_journal(conn, row["link_key"])
        mine = [r for r in tries if r["attempt_id"] == row["attempt_id"]]
        return dict(row), _journal(mine)
    finally:
        await conn.close()


def _list(dsn: str, sql: str, status: str | None, limit: int, as_json: bool, title: str) -> None:
    """The newest `limit` rows (`sql` takes the status and a row count); one row more is
    read so that a cut list says so on stderr, whatever the output format."""
    rows = asyncio.run(_rows(dsn, sql, status, limit + 1))
    _print(rows[:limit], as_json, title)
    if len(rows) > limit:
        _stderr.print(
            f"note: showing the newest {limit} {title}; there are more "
            "(pass --limit N, or --status to narrow)",
            highlight=False,
            soft_wrap=True,
        )


def _print(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    link_views.print_rows(rows, title)


def register(app: typer.Typer) -> None:
    @app.command("save")
    def save_command(
        owner_key: Annotated[str, typer.Option("--owner-key", help="ConnectorOwnerKey")],
        action_slot: Annotated[str, typer.Option("--action-slot", help="ActionSlotId")],
        destination_slot: Annotated[str, typer.Option("--destination-slot")],
        source_object: Annotated[str, typer.Option("--source-object")],
        record_id: Annotated[str, typer.Option("--record-id")],
        user: Annotated[str, typer.Option("--user", help="originating user id")],
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """Report a record save as the CRM would (WF-2): admit in Postgres, then wake the
        workflow (best effort: with Temporal down the save still stands, exit 0)."""
        save = SaveRequest(
            connector_owner_key=owner_key,
            action_slot_id=action_slot,
            destination_slot_id=destination_slot,
            source_object=source_object,
            source_record_id=record_id,
            originating_user_id=user,
        )
        outcome = run_closing_temporal(_save(resolve_dsn(database_url), save))
        decision = outcome.decision
        data = {**_DECISION.dump_python(decision, mode="json"), "wake": outcome.wake.value}
        if as_json:
            console.print_json(json.dumps(data))
        else:
            console.print(f"[bold]{decision.kind}[/] {data.get('reason', '')}".rstrip())
        if decision.kind == "rejected":
            raise typer.Exit(EXIT_REJECTED)

    links = typer.Typer(help="Remote links (the finalized remote-id SSoT).")
    attempts = typer.Typer(help="Create attempts (the pending-create SSoT).")

    @links.command("list")
    def links_list(
        status: Annotated[LinkStatus | None, typer.Option(help="filter by status")] = None,
        limit: ListLimit = LIST_LIMIT,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """List links, newest first (a line on stderr says when more exist)."""
        sql = (
            f"SELECT {LINK_COLUMNS} FROM connector_remote_link "
            "WHERE $1::text IS NULL OR status = $1 ORDER BY created_at DESC LIMIT $2"
        )
        _list(resolve_dsn(database_url), sql, status and status.value, limit, as_json, "links")

    @attempts.command("list")
    def attempts_list(
        status: Annotated[AttemptStatus | None, typer.Option(help="filter by status")] = None,
        limit: ListLimit = LIST_LIMIT,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """List create attempts, newest first (a line on stderr says when more exist)."""
        sql = (
            f"SELECT {ATTEMPT_COLUMNS} FROM connector_push_attempt "
            "WHERE $1::text IS NULL OR status = $1 ORDER BY created_at DESC LIMIT $2"
        )
        _list(resolve_dsn(database_url), sql, status and status.value, limit, as_json, "attempts")

    @attempts.command("show")
    def attempts_show(
        attempt_id: str, database_url: DatabaseUrl = None, as_json: AsJson = False
    ) -> None:
        """One attempt row in full and its send journal (every try, JRN-1)."""
        found = asyncio.run(_attempt_and_journal(resolve_dsn(database_url), attempt_id))
        if found is None:
            fail(escape(f"no attempt {attempt_id!r}"), code=2)
        attempt, journal = found
        landed = sum(1 for t in journal if t["may_have_landed"])
        if as_json:
            data = {"attempt": attempt, "send_journal": journal, "tries_may_have_landed": landed}
            console.print_json(json.dumps(data, default=str))
            return
        fields = [{"field": k, "value": v} for k, v in attempt.items()]
        link_views.print_rows(fields, f"attempt #{attempt['attempt_ordinal']}")
        link_views.print_rows(journal, "send journal")
        console.print(f"tries that may have landed: {landed} of {len(journal)}")

    link_views.register(links)
    app.add_typer(links, name="links")
    app.add_typer(attempts, name="attempts")
