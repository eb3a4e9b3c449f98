"""`connector-push backfill plan|apply`: adopt legacy links from mirror fields (SPEC MIG-1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json, resolve_dsn
from cli.errors import EXIT_REJECTED, fail, required_text
from protocol.backfill_defaults import DEFAULT_BATCH_SIZE, DEFAULT_OPERATOR

if TYPE_CHECKING:  # imported where used: the CLI starts without them (issue 31)
    from db.records import Conn
    from protocol.backfill_facts import RecordDecision
    from services.backfill import BackfillReport

# Runs looking at more records than this show a progress bar (on stderr).
PROGRESS_THRESHOLD: Final = 100
KEY_PREFIX: Final = 12

_EPILOG: Final = (
    "Provenance accepted (exactly two formats): the runtime's own link key (lk1_...) or the "
    "legacy marker '{ConnectorOwnerKey}:{ActionSlotId}:{DestinationSlotId}'. A record is "
    "adopted only when the active slot's current mirror pair holds one remote id and one such "
    "provenance naming this owner, this slot (or a slot the pack rebinds into it) and this "
    "destination, and no link, attempt or other record contradicts it; every other record "
    "with evidence is rejected with a reason and nothing is written for it. "
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
    int,
    typer.Option(
        "--batch-size", min=1, max=100_000, help="Records per page (apply: per transaction)."
    ),
]
ShowSkipped = Annotated[
    bool, typer.Option("--show-skipped", help="List records without evidence too.")
]

_stderr = Console(stderr=True)


class _Bar:
    """`ProgressSink` drawing a bar on stderr once a run is large enough to want one."""

    def __init__(self) -> None:
        self._progress = Progress(console=_stderr, transient=True)
        self._task: TaskID | None = None

    def start(self, total: int) -> None:
        if total > PROGRESS_THRESHOLD:
            self._progress.start()
            self._task = self._progress.add_task("records", total=total)

    def advance(self, records: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, records)

    def stop(self) -> None:
        if self._task is not None:
            self._progress.stop()


if TYPE_CHECKING:
    Run = Callable[[Conn, _Bar], Awaitable[BackfillReport]]


async def _with_connection(dsn: str, run: Run) -> BackfillReport:
    bar = _Bar()
    try:
        async with connect(dsn) as conn:
            return await run(conn, bar)
    finally:
        bar.stop()


def _execute(dsn: str, run: Run) -> BackfillReport:
    from services.backfill import ActivePackChanged, BackfillUnavailable

    try:
        return asyncio.run(_with_connection(dsn, run))
    except BackfillUnavailable as exc:
        bad_input(str(exc))
    except ActivePackChanged as exc:
        fail(escape(f"{exc}; earlier pages stay adopted, re-run apply"))


def _report_json(report: BackfillReport) -> dict[str, object]:
    return {
        "connector_owner_key": report.connector_owner_key,
        "pack_install_id": report.pack_install_id,
        "mode": "apply" if report.applied else "plan",
        "action_slots": list(report.action_slots),
        "totals": report.totals.model_dump(),
        "records": [d.model_dump(mode="json") for d in report.decisions],
    }


def _print_report(report: BackfillReport, show_skipped: bool) -> None:
    """One table per action slot: record, link key prefix, outcome, reason, detail."""
    from protocol.backfill_facts import Outcome

    console = Console()
    mode = "apply" if report.applied else "plan (dry run: nothing written)"
    console.print(f"backfill {mode}, install {report.pack_install_id}", highlight=False)
    for slot in report.action_slots:
        rows = [
            d
            for d in report.decisions
            if d.action_slot_id == slot and (show_skipped or d.outcome is not Outcome.SKIPPED)
        ]
        if rows:
            console.print(_slot_table(slot, rows))
    counts = report.totals.model_dump()
    console.print(", ".join(f"{n} {name}" for name, n in counts.items()), highlight=False)


def _slot_table(slot: str, rows: list[RecordDecision]) -> Table:
    title = f"{escape(slot)} ({escape(rows[0].source_object)})"
    table = Table(title=title, title_justify="left", box=box.SIMPLE)
    # What an operator greps for never wraps; the free-text detail gives way.
    for column in ("record", "link key", "outcome", "reason", "detail"):
        table.add_column(column, no_wrap=column != "detail", overflow="fold")
    for d in rows:
        key = f"{d.link_key[:KEY_PREFIX]}…" if d.link_key else ""
        reason = d.reason.value if d.reason else ""
        cells = (d.record_id, key, d.outcome.value, reason, d.detail)
        table.add_row(*(escape(c) for c in cells))
    return table


def _finish(report: BackfillReport, as_json: bool, show_skipped: bool) -> None:
    if as_json:
        echo_json(_report_json(report))
    else:
        _print_report(report, show_skipped)
    if report.rejected:
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

    async def run(conn: Conn, bar: _Bar) -> BackfillReport:
        from services.backfill import plan_backfill

        return await plan_backfill(conn, owner_key, slots, batch_size=batch_size, progress=bar)

    _finish(_execute(resolve_dsn(database_url), run), as_json, show_skipped)


def apply_command(
    owner_key: OwnerKey,
    action_slot: ActionSlots = None,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    operator: Annotated[
        str, typer.Option("--operator", help="Recorded as the adopted links' last operator.")
    ] = DEFAULT_OPERATOR,
    show_skipped: ShowSkipped = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Re-plan under locks and create a finalized link per adoptable record, one transaction
    per page. Never POSTs, never touches attempts or records; re-running adopts nothing new."""
    required_text("--operator", operator)
    slots = tuple(action_slot or ())

    async def run(conn: Conn, bar: _Bar) -> BackfillReport:
        from services.backfill import apply_backfill

        return await apply_backfill(
            conn,
            owner_key,
            slots,
            now=datetime.now(UTC),
            operator=operator,
            batch_size=batch_size,
            progress=bar,
        )

    _finish(_execute(resolve_dsn(database_url), run), as_json, show_skipped)


def register(app: typer.Typer) -> None:
    backfill = typer.Typer(
        help="Adopt legacy links from materialized remote-id/provenance fields (MIG-1).",
        epilog=_EPILOG,
        no_args_is_help=True,
    )
    backfill.command("plan", epilog=_EPILOG)(plan_command)
    backfill.command("apply", epilog=_EPILOG)(apply_command)
    app.add_typer(backfill, name="backfill")
