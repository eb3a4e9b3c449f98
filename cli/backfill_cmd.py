"""`connector-push backfill plan|apply`: adopt legacy links from mirror fields (SPEC MIG-1).

Both stream (NF-7): records are read in keyset pages and each page's
decisions are printed as soon as they are made (a table per page, or with `--json` one
JSON object per record and a last line with the totals), so memory holds one page at
any number of records. Progress goes to stderr (`cli.backfill_progress`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, resolve_dsn
from cli.errors import EXIT_REJECTED, fail, required_text
from protocol.backfill_defaults import DEFAULT_BATCH_SIZE, DEFAULT_OPERATOR

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from cli.backfill_progress import BackfillProgress
    from db.records import Conn
    from protocol.backfill_facts import RecordDecision
    from services.backfill import BackfillRun, BackfillSummary, PageSink

KEY_PREFIX: Final = 12
# An apply page is one transaction holding an advisory lock per link key (and a
# savepoint per adopted link): bounded so a page fits a stock server's lock table.
MAX_APPLY_BATCH: Final = 1_000

_EPILOG: Final = (
    "Provenance accepted (exactly two formats): the runtime's own link key (lk1_...) or the "
    "legacy marker '{ConnectorOwnerKey}:{ActionSlotId}:{DestinationSlotId}'. A record is "
    "adopted only when the active slot's current mirror pair holds one remote id and one such "
    "provenance naming this owner, this slot (or a slot the pack rebinds into it) and this "
    "destination, and no link, attempt or other record contradicts it; every other record "
    "with evidence is rejected with a reason and nothing is written for it. "
    "Output streams page by page; --json writes one JSON object per record and a last line "
    "with the totals. An interrupted apply keeps its committed pages: re-run it to adopt the "
    "rest. "
    "Exit codes: 0 nothing rejected; 3 some records rejected (apply still adopts the "
    "unambiguous ones, so re-run after fixing the rejected); 2 bad input (no active pack, "
    "unknown action slot); 1 the pack changed mid-run; 5 database unreachable or unmigrated."
)

OwnerKey = Annotated[str, typer.Option("--owner-key", help="ConnectorOwnerKey of the pack.")]
ActionSlots = Annotated[
    list[str] | None,
    typer.Option("--action-slot", help="Only this action slot (repeatable; default: all)."),
]
BatchSize = Annotated[
    int, typer.Option("--batch-size", min=1, max=100_000, help="Records per page.")
]
ApplyBatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size", min=1, max=MAX_APPLY_BATCH, help="Records per page (one transaction)."
    ),
]
ShowSkipped = Annotated[
    bool, typer.Option("--show-skipped", help="List records without evidence too.")
]

if TYPE_CHECKING:
    Run = Callable[[Conn, PageSink, BackfillProgress], Awaitable[BackfillSummary]]


class _Tables:
    """`PageSink` printing each page's rows as a table under its slot's title."""

    def __init__(self, show_skipped: bool) -> None:
        self._show_skipped = show_skipped
        self._console = Console()
        self._titled: set[str] = set()

    def begin(self, run: BackfillRun) -> None:
        mode = "apply" if run.applied else "plan (dry run: nothing written)"
        self._console.print(f"backfill {mode}, install {run.pack_install_id}", highlight=False)

    def page(self, decisions: Sequence[RecordDecision]) -> None:
        from protocol.backfill_facts import Outcome

        rows = [d for d in decisions if self._show_skipped or d.outcome is not Outcome.SKIPPED]
        if rows:
            self._console.print(self._table(rows))
            self._console.file.flush()

    def _table(self, rows: list[RecordDecision]) -> Table:
        slot = rows[0].action_slot_id
        title = None if slot in self._titled else f"{slot} ({rows[0].source_object})"
        self._titled.add(slot)
        table = Table(title=escape(title) if title else None, title_justify="left")
        table.box = box.SIMPLE
        # What an operator greps for never wraps; the free-text detail gives way.
        for column in ("record", "link key", "outcome", "reason", "detail"):
            table.add_column(column, no_wrap=column != "detail", overflow="fold")
        for d in rows:
            key = f"{d.link_key[:KEY_PREFIX]}…" if d.link_key else ""
            reason = d.reason.value if d.reason else ""
            cells = (d.record_id, key, d.outcome.value, reason, d.detail)
            table.add_row(*(escape(c) for c in cells))
        return table

    def end(self, summary: BackfillSummary) -> None:
        counts = summary.totals.model_dump()
        self._console.print(", ".join(f"{n} {name}" for name, n in counts.items()), highlight=False)


class _JsonLines:
    """`PageSink` writing one JSON object per record, then one with the run and totals."""

    def begin(self, run: BackfillRun) -> None:
        pass

    def page(self, decisions: Sequence[RecordDecision]) -> None:
        from cli.paging import json_line

        for d in decisions:
            json_line(d.model_dump(mode="json"))

    def end(self, summary: BackfillSummary) -> None:
        from cli.paging import json_line

        json_line(
            {
                "connector_owner_key": summary.connector_owner_key,
                "pack_install_id": summary.pack_install_id,
                "mode": "apply" if summary.applied else "plan",
                "action_slots": list(summary.action_slots),
                "totals": summary.totals.model_dump(),
            }
        )


async def _with_connection(
    dsn: str, run: Run, sink: PageSink, progress: BackfillProgress
) -> BackfillSummary:
    try:
        async with connect(dsn) as conn:
            return await run(conn, sink, progress)
    finally:
        progress.stop()


def _execute(mode: str, dsn: str, run: Run, as_json: bool, show_skipped: bool) -> None:
    import asyncio

    from cli.backfill_progress import BackfillProgress
    from services.backfill import ActivePackChanged, BackfillUnavailable

    sink = _JsonLines() if as_json else _Tables(show_skipped)
    progress = BackfillProgress(mode)
    try:
        summary = asyncio.run(_with_connection(dsn, run, sink, progress))
    except BackfillUnavailable as exc:
        bad_input(str(exc))
    except ActivePackChanged as exc:
        fail(escape(f"{exc}; earlier pages stay adopted, re-run apply"))
    sink.end(summary)
    if summary.rejected:
        raise typer.Exit(EXIT_REJECTED)


def plan_command(
    owner_key: OwnerKey,
    action_slot: ActionSlots = None,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    show_skipped: ShowSkipped = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Dry run: decide every record of the selected slots and write nothing."""
    slots = tuple(action_slot or ())

    async def run(conn: Conn, sink: PageSink, bar: BackfillProgress) -> BackfillSummary:
        from services.backfill import stream_backfill

        return await stream_backfill(
            conn, owner_key, slots, sink, batch_size=batch_size, progress=bar
        )

    _execute("plan", resolve_dsn(database_url), run, as_json, show_skipped)


def apply_command(
    owner_key: OwnerKey,
    action_slot: ActionSlots = None,
    batch_size: ApplyBatchSize = DEFAULT_BATCH_SIZE,
    operator: Annotated[
        str, typer.Option("--operator", help="Recorded as the adopted links' last operator.")
    ] = DEFAULT_OPERATOR,
    show_skipped: ShowSkipped = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Re-plan under locks and create a finalized link per adoptable record, one transaction
    per page. Never POSTs, never touches attempts or records; re-running adopts nothing new
    (and finishes an interrupted run)."""
    required_text("--operator", operator)
    slots = tuple(action_slot or ())

    async def run(conn: Conn, sink: PageSink, bar: BackfillProgress) -> BackfillSummary:
        from services.backfill import stream_backfill

        return await stream_backfill(
            conn,
            owner_key,
            slots,
            sink,
            batch_size=batch_size,
            progress=bar,
            apply_at=(datetime.now(UTC), operator),
        )

    _execute("apply", resolve_dsn(database_url), run, as_json, show_skipped)


def register(app: typer.Typer) -> None:
    backfill = typer.Typer(
        help="Adopt legacy links from materialized remote-id/provenance fields (MIG-1).",
        epilog=_EPILOG,
        no_args_is_help=True,
    )
    backfill.command("plan", epilog=_EPILOG)(plan_command)
    backfill.command("apply", epilog=_EPILOG)(apply_command)
    app.add_typer(backfill, name="backfill")
