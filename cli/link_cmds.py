"""`save`, `links list|show`, `attempts list|show`: the CRM's entry and the operator's view.
Lists page by keyset cursor (`cli.paging`, NF-7)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape

from cli import link_views, paging
from cli.database import AsJson, DatabaseUrl, connect_postgres, resolve_dsn
from cli.errors import EXIT_REJECTED, fail
from protocol.states import AttemptStatus, LinkStatus

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    import asyncpg

    from protocol.admission import SaveRequest
    from worker.crm import SaveOutcome

console = Console()
LIST_LIMIT: Final = 500
ListLimit = Annotated[
    int, typer.Option("--limit", min=1, max=100_000, help="rows per page, newest first")
]


async def _save(dsn: str, save: SaveRequest) -> SaveOutcome:
    """Admit first (API-2); then wake the workflow if Temporal answers in time."""
    from cli.entry import admission_pool, connect_best_effort, runtime_settings, warn_deferred
    from worker.crm import SaveOutcome, WakeStatus, report_save_outcome, wake_best_effort

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
    from db import journal as journal_q

    conn = await connect_postgres(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT * FROM connector_push_attempt JOIN connector_push_attempt_frozen"
            " USING (attempt_id) WHERE attempt_id::text = $1",
            attempt_id,
        )
        if row is None:
            return None
        tries = await journal_q.link_journal(conn, row["link_key"])
        mine = [r for r in tries if r["attempt_id"] == row["attempt_id"]]
        return dict(row), _journal(mine)
    finally:
        await conn.close()


async def _page(
    dsn: str,
    rows: Callable[[asyncpg.Connection], AsyncGenerator[dict[str, Any]]],
    limit: int,
    as_json: bool,
    title: str,
) -> dict[str, Any] | None:
    """Print one page (a table, or JSON Lines as the rows come); the last row shown when
    there are more, else None."""
    shown: list[dict[str, Any]] = []
    conn = await connect_postgres(dsn)
    try:
        last = await paging.take(rows(conn), limit, paging.json_line if as_json else shown.append)
    finally:
        await conn.close()
    if not as_json:
        link_views.print_rows(shown, title)
    return last


def _list(
    command: list[str],
    database_url: str | None,
    rows: Callable[[asyncpg.Connection], AsyncGenerator[asyncpg.Record]],
    cursor_of: Callable[[dict[str, Any]], str],
    limit: int,
    as_json: bool,
) -> None:
    """One page, newest first; a line on stderr names the next page when there is one."""
    import asyncio

    dsn = resolve_dsn(database_url)
    title = f"{command[0]} (newest first)"
    page = _page(dsn, lambda c: _as_dicts(rows(c)), limit, as_json, title)
    last = asyncio.run(page)
    if last is not None:
        if limit != LIST_LIMIT:
            command = [*command, "--limit", str(limit)]
        paging.say_more(command, cursor_of(last), as_json, database_url is not None)


async def _as_dicts(rows: AsyncGenerator[asyncpg.Record]) -> AsyncGenerator[dict[str, Any]]:
    async with aclosing(rows):
        async for row in rows:
            yield dict(row)


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
        from pydantic import TypeAdapter

        from cli.entry import run_closing_temporal
        from protocol.admission import AdmissionDecision, SaveRequest

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
        data = {
            **TypeAdapter(AdmissionDecision).dump_python(decision, mode="json"),
            "wake": outcome.wake.value,
        }
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
        after: paging.After = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """List links, newest first, a page at a time (stderr names the next page)."""
        from db import pages

        start = paging.time_key_cursor(after, "links")
        value = status and status.value
        _list(
            ["links", "list", *(["--status", value] if value else [])],
            database_url,
            lambda c: pages.links_page(c, value, start, limit),
            lambda r: paging.encode_cursor("links", r["created_at"].isoformat(), r["link_key"]),
            limit,
            as_json,
        )

    @attempts.command("list")
    def attempts_list(
        status: Annotated[AttemptStatus | None, typer.Option(help="filter by status")] = None,
        limit: ListLimit = LIST_LIMIT,
        after: paging.After = None,
        database_url: DatabaseUrl = None,
        as_json: AsJson = False,
    ) -> None:
        """List create attempts, newest first, a page at a time (stderr names the next)."""
        from db import pages

        start = paging.uuid_cursor(after, "attempts")
        value = status and status.value
        _list(
            ["attempts", "list", *(["--status", value] if value else [])],
            database_url,
            lambda c: pages.attempts_page(c, value, start, limit),
            lambda r: paging.encode_cursor(
                "attempts", r["created_at"].isoformat(), str(r["attempt_id"])
            ),
            limit,
            as_json,
        )

    @attempts.command("show")
    def attempts_show(
        attempt_id: str, database_url: DatabaseUrl = None, as_json: AsJson = False
    ) -> None:
        """One attempt row in full and its send journal (every try, JRN-1)."""
        import asyncio

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
