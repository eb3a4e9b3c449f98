"""`connector-push revalidate plan|validate|apply`: bulk mapping revalidation (SPEC §9)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

from activities import revalidation as revalidation_activity
from activities.revalidation import (
    LockTableTooSmall,
    OnStep,
    OwnerOutcome,
    OwnerRequest,
    OwnerResult,
    Phase,
    PlanError,
    PlanRequest,
)
from cli.database import (
    AsJson,
    DatabaseUrl,
    bad_input,
    check_writable,
    connect,
    echo_json,
    read_document,
)
from cli.database import resolve_dsn as _dsn
from cli.errors import EXIT_REJECTED, EXIT_UNAVAILABLE, CliError, required_text
from db import packs as packs_q
from protocol.revalidation import RevalidationResult, RevalidationStatus
from protocol.revalidation_manifest import (
    Approval,
    ManifestRejected,
    RevalidationManifest,
    parse_manifest,
)
from services.packs import validate_create_paths

EXIT_ALREADY_APPLIED: Final = 4
# Progress bars only where they help; small manifests finish before one would draw.
PROGRESS_THRESHOLD: Final = 50

EXIT_CODES: Final = {
    RevalidationStatus.VALIDATED: 0,
    RevalidationStatus.APPLIED: 0,
    RevalidationStatus.ALREADY_APPLIED: EXIT_ALREADY_APPLIED,
    RevalidationStatus.REJECTED: EXIT_REJECTED,
}

_EPILOG: Final = (
    "Exit codes: 0 validated (would apply) or applied; 4 already applied (an exact "
    "retry: receipts and links verified, nothing written); 3 rejected (conflicts "
    "listed, nothing written; includes a member whose new fingerprints are not what "
    "its new_pack_install_id produces); 2 unreadable or bad input (not JSON, not "
    "canonical, digest mismatch, empty approval: rejected before any transaction); "
    "5 Postgres unreachable or unmigrated, or its lock table too small for the manifest "
    "(nothing written; the message names the max_locks_per_transaction to set)."
)

ManifestFile = Annotated[
    Path, typer.Argument(help="Revalidation manifest (JSON).", show_default=False)
]

_stdout = Console(highlight=False)
_stderr = Console(stderr=True)


def _load(path: Path) -> RevalidationManifest:
    """Invariant 1 before any connection: bad input exits 2 naming the reason."""
    try:
        return parse_manifest(read_document(path))
    except ManifestRejected as error:
        bad_input(f"{path}: {error}")


@contextmanager
def _progress(total: int, phases: tuple[Phase, ...]) -> Iterator[OnStep]:
    if total <= PROGRESS_THRESHOLD:
        yield lambda phase, key: None
        return
    with Progress(console=_stderr, transient=True) as bar:
        tasks: dict[Phase, TaskID] = {
            phase: bar.add_task(f"{phase.value} links", total=total) for phase in phases
        }

        def step(phase: Phase, link_key: str) -> None:
            del link_key
            bar.advance(tasks[phase])

        yield step


def _short(value: str | None) -> str:
    return "-" if value is None else value[:12]


def _print_result(result: RevalidationResult) -> None:
    if result.conflicts:
        table = Table(title="conflicts (nothing written)", title_justify="left")
        for column in ("link key", "reason", "detail"):
            table.add_column(column, overflow="fold")
        for c in result.conflicts:
            table.add_row(escape(c.link_key), c.reason.value, escape(c.detail))
        _stdout.print(table)
    if result.receipts:
        title = (
            "receipts" if result.status != RevalidationStatus.VALIDATED else "projected receipts"
        )
        table = Table(title=title, title_justify="left")
        columns = ("link key", "mapping", "body", "install", "previous op", "row digest")
        for column in columns:
            table.add_column(column, no_wrap=column == "link key")
        for r in result.receipts:
            table.add_row(
                escape(r.link_key),
                f"{_short(r.old_mapping_fingerprint)} -> {_short(r.new_mapping_fingerprint)}",
                f"{_short(r.old_body_fingerprint)} -> {_short(r.new_body_fingerprint)}",
                f"{_short(r.old_pack_install_id)} -> {_short(r.new_pack_install_id)}",
                escape(r.previous_operation_id or "-"),
                f"{_short(r.before_row_digest)} -> {_short(r.after_row_digest)}",
            )
        _stdout.print(table)
    _stdout.print(_status_line(result))


def _status_line(result: RevalidationResult) -> str:
    op, n = escape(result.operation_id), len(result.receipts)
    match result.status:
        case RevalidationStatus.VALIDATED:
            return f"[bold]validated[/]: {op} would move {n} link(s); nothing written"
        case RevalidationStatus.APPLIED:
            return f"[bold green]applied[/]: {op} moved {n} link(s), {n} receipt(s) written"
        case RevalidationStatus.ALREADY_APPLIED:
            return f"[bold]already applied[/]: {op} verified on {n} link(s); nothing written"
        case RevalidationStatus.REJECTED:
            k = len(result.conflicts)
            return f"[bold red]rejected[/]: {op}, {k} conflict(s); nothing written"


def _report(result: RevalidationResult, as_json: bool) -> None:
    if as_json:
        echo_json(result.model_dump(mode="json"))
    else:
        _print_result(result)
    raise typer.Exit(EXIT_CODES[result.status])


async def _run(dsn: str, manifest: RevalidationManifest, *, write: bool) -> RevalidationResult:
    phases = (Phase.LOCKED, Phase.WRITTEN) if write else (Phase.LOCKED,)
    entry = revalidation_activity.apply if write else revalidation_activity.validate
    with _progress(len(manifest.members), phases) as on_step:
        async with connect(dsn) as conn:
            try:
                return await entry(conn, manifest, on_step)
            except LockTableTooSmall as error:  # rolled back: a setting to change, not a bug
                raise CliError(str(error), EXIT_UNAVAILABLE) from error


def validate_command(
    manifest_file: ManifestFile, database_url: DatabaseUrl = None, as_json: AsJson = False
) -> None:
    """Dry run: take the apply's locks, run its checks, show projected receipts, write nothing."""
    manifest = _load(manifest_file)
    _report(asyncio.run(_run(_dsn(database_url), manifest, write=False)), as_json)


def apply_command(
    manifest_file: ManifestFile, database_url: DatabaseUrl = None, as_json: AsJson = False
) -> None:
    """Move every member's fingerprints and write its receipt, all in one transaction."""
    manifest = _load(manifest_file)
    _report(asyncio.run(_run(_dsn(database_url), manifest, write=True)), as_json)


async def _plan(dsn: str, request: PlanRequest) -> RevalidationManifest:
    async with connect(dsn) as conn:
        return await revalidation_activity.plan(conn, request)


def _plan_request(
    operation_id: str,
    approval: tuple[str, str, str],
    new_pack_install: str,
    link_keys: list[str],
    all_finalized: bool,
) -> PlanRequest:
    if bool(link_keys) == all_finalized:
        bad_input("pass either --link-key (one or more) or --all-finalized")
    try:
        by, reference, reason = approval
        return PlanRequest(
            operation_id=operation_id,
            approval=Approval(approved_by=by, approval_reference=reference, reason=reason),
            new_pack_install_id=new_pack_install,
            link_keys=None if all_finalized else tuple(link_keys),
        )
    except ValidationError as error:
        first = error.errors()[0]
        bad_input(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")


def plan_command(
    operation_id: Annotated[str, typer.Option("--operation-id", help="Unique operation id.")],
    approved_by: Annotated[str, typer.Option("--approved-by", help="Who approved the move.")],
    approval_reference: Annotated[
        str, typer.Option("--approval-reference", help="Ticket or change record.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why the mapping move is safe.")],
    new_pack_install: Annotated[
        str, typer.Option("--new-pack-install", help="PackInstallId whose fingerprints to adopt.")
    ],
    link_key: Annotated[
        list[str] | None, typer.Option("--link-key", help="A link to move (repeatable).")
    ] = None,
    all_finalized: Annotated[
        bool, typer.Option("--all-finalized", help="Every finalized link of the owner that moves.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the manifest here (default: stdout).")
    ] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Build a canonical manifest from the current links and an install's fingerprints.

    Read-only: review the file, then `revalidate validate`, then `revalidate apply`.
    The manifest is JSON on stdout; with `--out` and `--json`, a JSON summary is.
    """
    approval = (approved_by, approval_reference, reason)
    request = _plan_request(operation_id, approval, new_pack_install, link_key or [], all_finalized)
    if out is not None:
        check_writable(out, "--out")  # before the plan, not after it
    try:
        manifest = asyncio.run(_plan(_dsn(database_url), request))
    except (PlanError, ManifestRejected) as error:
        bad_input(str(error))
    text = json.dumps(manifest.document(), indent=2, sort_keys=True) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    if as_json:  # the manifest went to the file: print what was planned
        summary = {"operation_id": manifest.operation_id, "members": len(manifest.members)}
        echo_json({**summary, "manifest_digest": manifest.manifest_digest, "out": str(out)})
        return
    _stderr.print(
        f"planned {escape(manifest.operation_id)}: {len(manifest.members)} link(s), "
        f"digest {manifest.manifest_digest[:12]} -> {escape(str(out))}",
        highlight=False,
    )


# -- one command for an owner after an install change (C-4) --------------------------

_OWNER_EPILOG: Final = (
    "Exit codes: 0 applied, or nothing waited; 3 rejected (conflicts listed; the links "
    "stay as they were and still fail closed); 2 bad input, no active pack, or links whose "
    "mapping would move without --include-mapping-changes (nothing written); 5 Postgres "
    "unreachable or its lock table too small."
)

_OWNER_EXIT: Final = {
    OwnerOutcome.APPLIED: 0,
    OwnerOutcome.NOTHING_TO_DO: 0,
    OwnerOutcome.REJECTED: EXIT_REJECTED,
    OwnerOutcome.MAPPING_CHANGES: 2,
}


async def _owner(dsn: str, request: OwnerRequest) -> OwnerResult:
    # The progress bar's total is not known before the plan: one step per link locked.
    with Progress(console=_stderr, transient=True) as bar:
        task = bar.add_task("revalidating links", total=None)

        def step(phase: Phase, link_key: str) -> None:
            del phase, link_key
            bar.advance(task)

        async with connect(dsn) as conn:
            try:
                return await revalidation_activity.revalidate_owner(
                    conn, request, step, now=datetime.now(UTC)
                )
            except LockTableTooSmall as error:
                raise CliError(str(error), EXIT_UNAVAILABLE) from error


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
        "skipped": list(result.skipped),
        "mapping_moves": result.mapping_moves,
        "rejected": None if rejected is None else rejected.model_dump(mode="json"),
    }


def _print_owner(result: OwnerResult) -> None:
    owner, install = escape(result.connector_owner_key), result.pack_install_id
    if result.outcome is OwnerOutcome.MAPPING_CHANGES:
        _stdout.print(
            f"[bold red]refused[/]: {result.mapping_moves} link(s) of {owner} would also move "
            f"their mapping fingerprints to install {install}; review them with `revalidate "
            "plan`/`validate`/`apply`, or pass --include-mapping-changes; nothing written"
        )
        return
    if result.rejected is not None:
        _print_result(result.rejected)
    if result.restored_count:
        _stdout.print(f"lifted the install-change suspension of {result.restored_count} link(s)")
    if result.skipped_count:
        shown = ", ".join(escape(k) for k in result.skipped)
        _stdout.print(
            f"skipped {result.skipped_count} link(s) whose action slot install {install} does "
            f"not have (retire or rebind them), e.g. {shown}"
        )
    ops = f" in {len(result.operations)} operation(s)" if result.operations else ""
    match result.outcome:
        case OwnerOutcome.APPLIED:
            _stdout.print(
                f"[bold green]revalidated[/]: {result.moved} link(s) of {owner} against "
                f"install {install}{ops}; their next saves PATCH"
            )
        case OwnerOutcome.NOTHING_TO_DO:
            _stdout.print(f"nothing waits: every link of {owner} is validated against {install}")
        case OwnerOutcome.REJECTED:
            _stdout.print(
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
    raise typer.Exit(_OWNER_EXIT[result.outcome])


# -- C-8: a changed create path, validated --------------------------------------------


async def _create_path(
    dsn: str, owner: str, slots: list[str] | None, operator: str, reason: str
) -> tuple[list[packs_q.CreatePathBlock], list[packs_q.CreatePathBlock]]:
    async with connect(dsn) as conn:
        validated = await validate_create_paths(conn, owner, slots, operator, reason)
        return validated, await packs_q.create_path_blocks(conn, owner)


def create_path_command(
    owner_key: Annotated[str, typer.Option("--owner-key", help="The ConnectorOwnerKey.")],
    reason: Annotated[str, typer.Option("--reason", help="Why the new create path is right.")],
    action_slot: Annotated[
        list[str] | None,
        typer.Option("--action-slot", help="Only this action slot (repeatable; default all)."),
    ] = None,
    operator: Annotated[
        str, typer.Option("--operator", help="Who validates (recorded in the audit trail).")
    ] = os.environ.get("USER", "operator"),
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Validate changed create paths, so creates for those action slots are admitted (C-8).

    A `pack apply` that changes an action slot's createPath blocks new creates for that
    slot (rejected `create_path_unvalidated`) until this command validates it; finalized
    links are not affected. One audit entry per slot.
    """
    required_text("--operator", operator)
    required_text("--reason", reason)
    validated, still = asyncio.run(
        _create_path(_dsn(database_url), owner_key, action_slot or None, operator, reason)
    )
    if as_json:
        echo_json(
            {
                "connector_owner_key": owner_key,
                "validated": [vars(b) for b in validated],
                "still_blocked": [b.action_slot_id for b in still],
            }
        )
        return
    if not validated:
        _stdout.print(f"nothing to validate: no changed create path of {escape(owner_key)} waits")
    for b in validated:
        _stdout.print(
            f"validated: action slot {escape(b.action_slot_id)} creates with "
            f"{escape(b.create_path_template)} (was {escape(b.previous_create_path)})"
        )
    if still:
        _stdout.print(f"still blocked: {', '.join(escape(b.action_slot_id) for b in still)}")


def register(app: typer.Typer) -> None:
    revalidate = typer.Typer(
        help=(
            "Bulk finalized-link revalidation: plan, validate, apply (SPEC §9); owner (all "
            "of an owner's links after an install change, one command); create-path."
        ),
        epilog=_EPILOG,
        no_args_is_help=True,
    )
    revalidate.command("plan")(plan_command)
    revalidate.command("validate", epilog=_EPILOG)(validate_command)
    revalidate.command("apply", epilog=_EPILOG)(apply_command)
    revalidate.command("owner", epilog=_OWNER_EPILOG)(owner_command)
    revalidate.command("create-path")(create_path_command)
    app.add_typer(revalidate, name="revalidate")
