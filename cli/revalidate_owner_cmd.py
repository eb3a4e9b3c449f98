"""`connector-push revalidate owner`: every link of an owner revalidated against its active
install, in one command, after a pack install change (C-4)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.markup import escape
from rich.progress import Progress

from cli.database import (
    AsJson,
    DatabaseUrl,
    bad_input,
    connect,
    echo_json,
)
from cli.database import resolve_dsn as _dsn
from cli.errors import EXIT_REJECTED, required_text
from cli.revalidate_views import print_result, stderr, stdout

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from services.revalidation import Phase
    from services.revalidation_owner import OwnerOutcome, OwnerRequest, OwnerResult

OWNER_EPILOG: Final = (
    "Exit codes: 0 applied, or nothing waited (links G-4 skips, listed with their remedy, "
    "do not change it: they stay as they are); 3 rejected (conflicts listed; the links "
    "stay as they were and still fail closed); 2 bad input, no active pack, or links whose "
    "mapping would move without --include-mapping-changes (nothing written); 5 Postgres "
    "unreachable."
)


def _owner_exit(outcome: OwnerOutcome) -> int:
    from services.revalidation_owner import OwnerOutcome

    return {
        OwnerOutcome.APPLIED: 0,
        OwnerOutcome.NOTHING_TO_DO: 0,
        OwnerOutcome.REJECTED: EXIT_REJECTED,
        OwnerOutcome.MAPPING_CHANGES: 2,
    }[outcome]


async def _owner(dsn: str, request: OwnerRequest) -> OwnerResult:
    # The progress bar's total is not known before the plan: one step per link locked.
    from services.revalidation_owner import revalidate_owner

    with Progress(console=stderr, transient=True) as bar:
        task = bar.add_task("revalidating links", total=None)

        def step(phase: Phase, link_key: str) -> None:
            del phase, link_key
            bar.advance(task)

        async with connect(dsn) as conn:
            return await revalidate_owner(conn, request, step, now=datetime.now(UTC))


def _owner_json(result: OwnerResult) -> dict[str, object]:
    rejected = result.rejected
    return {
        "outcome": result.outcome.value,
        "connector_owner_key": result.connector_owner_key,
        "pack_install_id": result.pack_install_id,
        "links_revalidated": result.moved,
        "operations": list(result.operations),
        "restored_count": result.restored_count,
        "restored": list(result.restored),
        "skipped_count": result.skipped_count,
        # G-4: each skipped link once, with why it stays as it is and what to do.
        "skipped": [
            {
                "link_key": r.link_key,
                "reason": r.blocker.value,
                "detail": r.detail,
                "remedy": r.remedy.replace("KEY", r.link_key),
            }
            for r in result.skipped
        ],
        "mapping_moves": result.mapping_moves,
        "rejected": None if rejected is None else rejected.model_dump(mode="json"),
    }


def _print_owner(result: OwnerResult) -> None:
    from services.revalidation_owner import OwnerOutcome

    owner, install = escape(result.connector_owner_key), result.pack_install_id
    if result.outcome is OwnerOutcome.MAPPING_CHANGES:
        stdout.print(
            f"[bold red]refused[/]: {result.mapping_moves} link(s) of {owner} would also move "
            f"their mapping fingerprints to install {install}; review them with `revalidate "
            "plan`/`validate`/`apply`, or pass --include-mapping-changes; nothing written"
        )
        return
    if result.rejected is not None:
        print_result(result.rejected)
    if result.restored_count:
        stdout.print(f"lifted the install-change suspension of {result.restored_count} link(s)")
    if result.skipped_count:
        stdout.print(
            f"[bold yellow]skipped[/] {result.skipped_count} link(s) G-4 leaves as they are "
            f"(not restored, not revalidated; the first {len(result.skipped)}):"
        )
        for refused in result.skipped:
            stdout.print(f"  {escape(refused.link_key)}: {escape(refused.message())}")
    ops = f" in {len(result.operations)} operation(s)" if result.operations else ""
    match result.outcome:
        case OwnerOutcome.APPLIED:
            stdout.print(
                f"[bold green]revalidated[/]: {result.moved} link(s) of {owner} against "
                f"install {install}{ops}; their next saves PATCH"
            )
        case OwnerOutcome.NOTHING_TO_DO if result.skipped_count:
            stdout.print(f"nothing else waits: no other link of {owner} moves to {install}")
        case OwnerOutcome.NOTHING_TO_DO:
            stdout.print(f"nothing waits: every link of {owner} is validated against {install}")
        case OwnerOutcome.REJECTED:
            stdout.print(
                f"[bold red]rejected[/]: {result.moved} link(s) revalidated{ops} before the "
                f"conflicts above; the others of {owner} still fail closed (re-run to continue)"
            )


def owner_command(
    owner_key: Annotated[str, typer.Option("--owner-key", help="The ConnectorOwnerKey.")],
    approved_by: Annotated[str, typer.Option("--approved-by", help="Who approved it.")],
    approval_reference: Annotated[
        str, typer.Option("--approval-reference", help="Ticket or change record.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why the install change is safe.")],
    operation_id: Annotated[
        str | None,
        typer.Option("--operation-id", help="Operation id (default: from install and time)."),
    ] = None,
    include_mapping_changes: Annotated[
        bool,
        typer.Option(
            "--include-mapping-changes",
            help="Also move links whose mapping fingerprints the install changes.",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Revalidate every link of an owner against its active install, in one command (C-4).

    After `pack apply` makes a new install, the owner's links fail closed (no PATCH) until
    revalidated. This plans, validates and applies the §9 revalidation of every finalized
    link under one approval (receipts and audit entries written), and first lifts the
    suspension of links suspended for the install change alone. Progress on stderr.
    """
    import asyncio

    from pydantic import ValidationError

    from protocol.revalidation_manifest import Approval, ManifestRejected
    from services.revalidation_owner import OwnerRequest
    from services.revalidation_plan import PlanError

    try:
        approval = Approval(
            approved_by=required_text("--approved-by", approved_by),
            approval_reference=required_text("--approval-reference", approval_reference),
            reason=required_text("--reason", reason),
        )
        request = OwnerRequest(
            connector_owner_key=owner_key,
            operation_id=operation_id,
            approval=approval,
            include_mapping_changes=include_mapping_changes,
        )
    except ValidationError as error:
        first = error.errors()[0]
        bad_input(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    try:
        result = asyncio.run(_owner(_dsn(database_url), request))
    except (PlanError, ManifestRejected) as error:
        bad_input(str(error))
    if as_json:
        echo_json(_owner_json(result))
    else:
        _print_owner(result)
    raise typer.Exit(_owner_exit(result.outcome))
