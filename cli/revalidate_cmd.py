"""`connector-push revalidate plan|validate|apply`: bulk mapping revalidation (SPEC §9)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.markup import escape
from rich.progress import Progress, TaskID

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
from cli.revalidate_views import print_result, stderr, stdout

if TYPE_CHECKING:  # imported where used: the CLI starts without them (issue 31)
    from db import packs as packs_q
    from protocol.revalidation import RevalidationResult, RevalidationStatus
    from protocol.revalidation_manifest import RevalidationManifest
    from services.revalidation import OnStep, Phase
    from services.revalidation_plan import PlanRequest

EXIT_ALREADY_APPLIED: Final = 4
# Progress bars only where they help; small manifests finish before one would draw.
PROGRESS_THRESHOLD: Final = 50


def exit_code(status: RevalidationStatus) -> int:
    from protocol.revalidation import RevalidationStatus

    return {
        RevalidationStatus.VALIDATED: 0,
        RevalidationStatus.APPLIED: 0,
        RevalidationStatus.ALREADY_APPLIED: EXIT_ALREADY_APPLIED,
        RevalidationStatus.REJECTED: EXIT_REJECTED,
    }[status]


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


def _load(path: Path) -> RevalidationManifest:
    """Invariant 1 before any connection: bad input exits 2 naming the reason."""
    from protocol.revalidation_manifest import ManifestRejected, parse_manifest

    try:
        return parse_manifest(read_document(path))
    except ManifestRejected as error:
        bad_input(f"{path}: {error}")


@contextmanager
def _progress(total: int, phases: tuple[Phase, ...]) -> Iterator[OnStep]:
    if total <= PROGRESS_THRESHOLD:
        yield lambda phase, key: None
        return
    with Progress(console=stderr, transient=True) as bar:
        tasks: dict[Phase, TaskID] = {
            phase: bar.add_task(f"{phase.value} links", total=total) for phase in phases
        }

        def step(phase: Phase, link_key: str) -> None:
            del link_key
            bar.advance(tasks[phase])

        yield step


def _report(result: RevalidationResult, as_json: bool) -> None:
    if as_json:
        echo_json(result.model_dump(mode="json"))
    else:
        print_result(result)
    raise typer.Exit(exit_code(result.status))


async def _run(dsn: str, manifest: RevalidationManifest, *, write: bool) -> RevalidationResult:
    from services import revalidation as revalidation_activity
    from services.revalidation import LockTableTooSmall, Phase

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
    import asyncio

    manifest = _load(manifest_file)
    _report(asyncio.run(_run(_dsn(database_url), manifest, write=False)), as_json)


def apply_command(
    manifest_file: ManifestFile, database_url: DatabaseUrl = None, as_json: AsJson = False
) -> None:
    """Move every member's fingerprints and write its receipt, all in one transaction."""
    import asyncio

    manifest = _load(manifest_file)
    _report(asyncio.run(_run(_dsn(database_url), manifest, write=True)), as_json)


async def _plan(dsn: str, request: PlanRequest) -> RevalidationManifest:
    from services.revalidation_plan import plan

    async with connect(dsn) as conn:
        return await plan(conn, request)


def _plan_request(
    operation_id: str,
    approval: tuple[str, str, str],
    new_pack_install: str,
    link_keys: list[str],
    all_finalized: bool,
) -> PlanRequest:
    from pydantic import ValidationError

    from protocol.revalidation_manifest import Approval
    from services.revalidation_plan import PlanRequest

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
    import asyncio

    from protocol.revalidation_manifest import ManifestRejected
    from services.revalidation_plan import PlanError

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
    stderr.print(
        f"planned {escape(manifest.operation_id)}: {len(manifest.members)} link(s), "
        f"digest {manifest.manifest_digest[:12]} -> {escape(str(out))}",
        highlight=False,
    )


# -- C-8: a changed create path, validated --------------------------------------------


async def _create_path(
    dsn: str, owner: str, slots: list[str] | None, operator: str, reason: str
) -> tuple[list[packs_q.CreatePathBlock], list[packs_q.CreatePathBlock]]:
    from db import packs as packs_q
    from services.packs import validate_create_paths

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
    import asyncio

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
        stdout.print(f"nothing to validate: no changed create path of {escape(owner_key)} waits")
    for b in validated:
        stdout.print(
            f"validated: action slot {escape(b.action_slot_id)} creates with "
            f"{escape(b.create_path_template)} (was {escape(b.previous_create_path)})"
        )
    if still:
        stdout.print(f"still blocked: {', '.join(escape(b.action_slot_id) for b in still)}")


def register(app: typer.Typer) -> None:
    from cli.revalidate_owner_cmd import OWNER_EPILOG, owner_command

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
    revalidate.command("owner", epilog=OWNER_EPILOG)(owner_command)
    revalidate.command("create-path")(create_path_command)
    app.add_typer(revalidate, name="revalidate")
