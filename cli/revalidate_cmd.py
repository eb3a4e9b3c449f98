"""`connector-push revalidate plan|validate|apply`: bulk mapping revalidation (SPEC §9)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, BinaryIO, Final

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
from cli.errors import EXIT_REJECTED, CliError, required_text
from cli.revalidate_views import print_result, stderr, stdout

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from db import packs as packs_q
    from protocol.revalidation import RevalidationResult, RevalidationStatus
    from protocol.revalidation_manifest import ManifestHead
    from services.revalidation import OnStep, Phase
    from services.revalidation_plan import PlanRequest
    from services.revalidation_source import ManifestSource

EXIT_ALREADY_APPLIED: Final = 4
# Progress bars only where they help; small manifests finish before one would draw.
PROGRESS_THRESHOLD: Final = 50
# Members between two redraws of a progress bar (a redraw per member costs more than
# the member at a million).
PROGRESS_EVERY: Final = 1000


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
    "5 Postgres unreachable or unmigrated."
)

ManifestFile = Annotated[
    Path,
    typer.Argument(
        help="Revalidation manifest: JSON Lines, as `revalidate plan` writes (or the older "
        "single JSON document).",
        show_default=False,
    ),
]


def _load(path: Path) -> ManifestSource:
    """Invariant 1 before any connection, over the whole file in bounded memory: bad input
    exits 2 naming the reason. A JSON Lines manifest is read again, page by page, inside
    the transaction; the older one-document form (small by nature) is held in memory."""
    from protocol.revalidation_lines import is_lines_header
    from protocol.revalidation_manifest import ManifestRejected, parse_manifest
    from services.revalidation_source import ManifestFile, ManifestInMemory

    first = _first_line(path)
    try:
        if is_lines_header(first):
            return ManifestFile.open(path)
        return ManifestInMemory(parse_manifest(read_document(path)))
    except ManifestRejected as error:
        bad_input(f"{path}: {error}")


def _first_line(path: Path) -> bytes:
    """The file's first line (up to 1 MiB); empty when it is not a regular file one can
    read, for `read_document` to say why."""
    if not path.is_file():
        return b""
    try:
        with path.open("rb") as stream:
            return stream.readline(1 << 20)
    except OSError:
        return b""


@contextmanager
def _progress(total: int, phases: tuple[Phase, ...]) -> Iterator[OnStep]:
    if total <= PROGRESS_THRESHOLD:
        yield lambda phase, key: None
        return
    with Progress(console=stderr, transient=True) as bar:
        tasks: dict[Phase, TaskID] = {
            phase: bar.add_task(f"{phase.value} links", total=total) for phase in phases
        }

        counts = dict.fromkeys(phases, 0)

        def step(phase: Phase, link_key: str) -> None:
            del link_key
            counts[phase] += 1
            if counts[phase] % PROGRESS_EVERY == 0 or counts[phase] == total:
                bar.update(tasks[phase], completed=counts[phase])

        yield step


def _report(result: RevalidationResult, as_json: bool) -> None:
    if as_json:
        echo_json(result.model_dump(mode="json"))
    else:
        print_result(result)
    raise typer.Exit(exit_code(result.status))


async def _run(dsn: str, manifest: ManifestSource, *, write: bool) -> RevalidationResult:
    from protocol.revalidation_manifest import ManifestRejected
    from services import revalidation as revalidation_activity
    from services.revalidation import Phase

    phases = (Phase.LOCKED, Phase.WRITTEN) if write else (Phase.LOCKED,)
    entry = revalidation_activity.apply if write else revalidation_activity.validate
    with _progress(manifest.head.member_count, phases) as on_step:
        async with connect(dsn) as conn:
            try:
                return await entry(conn, manifest, on_step)
            except ManifestRejected as error:  # the file changed after it was checked
                raise CliError(f"{error}; nothing was written", 2) from error


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


async def _plan(dsn: str, request: PlanRequest, out: BinaryIO) -> ManifestHead:
    from services.revalidation_plan import write_plan

    async with connect(dsn) as conn:
        return await write_plan(conn, request, out)


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
    The manifest is JSON Lines (a header line, one line per link, a digest line), written
    a page at a time, on stdout; with `--out` and `--json`, a JSON summary is.
    """
    import asyncio

    from protocol.revalidation_manifest import ManifestRejected
    from services.revalidation_plan import PlanError

    approval = (approved_by, approval_reference, reason)
    request = _plan_request(operation_id, approval, new_pack_install, link_key or [], all_finalized)
    if out is not None:
        check_writable(out, "--out")  # before the plan, not after it
    try:
        with _plan_output(out) as stream:
            head = asyncio.run(_plan(_dsn(database_url), request, stream))
    except (PlanError, ManifestRejected) as error:
        bad_input(str(error))
    if out is None:
        return
    if as_json:  # the manifest went to the file: print what was planned
        summary = {"operation_id": head.operation_id, "members": head.member_count}
        echo_json({**summary, "manifest_digest": head.manifest_digest, "out": str(out)})
        return
    stderr.print(
        f"planned {escape(head.operation_id)}: {head.member_count} link(s), "
        f"digest {head.manifest_digest[:12]} -> {escape(str(out))}",
        highlight=False,
    )


@contextmanager
def _plan_output(out: Path | None) -> Iterator[BinaryIO]:
    """stdout, or a file beside `out` renamed onto it only once the plan is complete."""
    if out is None:
        stream = typer.get_binary_stream("stdout")
        yield stream
        stream.flush()
        return
    partial = out.with_name(f".{out.name}.partial")
    try:
        with partial.open("wb") as stream:
            yield stream
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)


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
