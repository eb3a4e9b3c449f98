"""`connector-push pack apply|show|list`: pack manifests installed in Postgres (PACK-1)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json, read_document
from cli.database import resolve_dsn as _dsn
from cli.errors import fail, load_settings, required_text
from cli.pack_verify import AcceptUnverified, apply_checked, claim_options, verify_command

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    from db import packs as q
    from db.records import Conn
    from protocol.manifest import PackManifest
    from services.pack_preview import ApplyPreview
    from services.packs import ActivePack, ApplyPackResult
    from worker.settings import RuntimeSettings

# Setting the limits on Temporal is best effort: the worker sets them at start too.
RATE_LIMIT_SYNC_TIMEOUT_S = 10.0

OwnerKey = Annotated[
    str | None,
    typer.Option(
        "--owner-key",
        help="ConnectorOwnerKey (default: the only owner key with an active pack)",
        show_default=False,
    ),
]


def validate_manifest_file(path: Path) -> PackManifest:
    """Read and validate a manifest file; invalid input exits non-zero naming the field."""
    return validate_manifest_document(path, read_document(path))


def validate_manifest_document(path: Path, document: object) -> PackManifest:
    """Validate a manifest read from `path`; invalid input exits non-zero naming the field."""
    from protocol.installable import parse_installable
    from protocol.manifest import ManifestInvalid

    if not isinstance(document, Mapping):
        bad_input(f"{path}: a pack manifest is a mapping of manifest fields")
    try:
        return parse_installable(document)
    except ManifestInvalid as exc:
        bad_input(f"{path}: {exc}")


def _short(digest: str) -> str:
    return digest[:12]


def _print_apply(result: ApplyPackResult) -> None:
    from services.packs import ApplyOutcome

    owner, install = result.connector_owner_key, result.pack_install_id
    if result.outcome is ApplyOutcome.UNCHANGED:
        typer.echo(
            f"unchanged: {owner} is already active as install {install} "
            f"(digest {_short(result.manifest_digest)}); nothing written"
        )
        return
    replaced = result.replaced_pack_install_id
    typer.echo(
        f"installed: {owner} install {install} (digest {_short(result.manifest_digest)}) "
        f"is active; {f'replaced {replaced}' if replaced else 'first install'}; "
        f"{result.lineage_entries} lineage entr{'y' if result.lineage_entries == 1 else 'ies'}"
    )
    if result.links_suspended_slot_removed:
        shown = ", ".join(result.suspended_examples)
        typer.echo(
            f"suspended: {result.links_suspended_slot_removed} link(s) whose action slot this "
            f"install removed (suspend_reason drift:action_recreated; rebind, revalidate or "
            f"retire them), e.g. {shown}"
        )
    if result.revalidate_command:
        typer.echo(
            f"waiting: {result.links_awaiting_revalidation} link(s) wait for revalidation "
            f"against install {install}: no PATCH until then (C-4). Revalidate them all "
            f"with:\n  {result.revalidate_command}"
        )
    if result.validate_create_path_command:
        slots = ", ".join(result.create_paths_awaiting_validation)
        typer.echo(
            f"blocked: the create path of action slot(s) {slots} changed: new creates for "
            f"them are rejected until validated with:\n  {result.validate_create_path_command}"
        )


async def _apply(
    dsn: str, manifest: PackManifest, *, reinstall: bool, operator: str, reason: str, **claims: bool
) -> tuple[ApplyPackResult, dict[str, float]]:
    from protocol.rate_limit import budget_rates
    from services.packs import active_manifests

    async with connect(dsn) as conn:
        result = await apply_checked(
            conn, manifest, reinstall=reinstall, operator=operator, reason=reason, **claims
        )
        return result, budget_rates(await active_manifests(conn))


_REINSTALL_CONSEQUENCE = (
    "--reinstall starts a new install incarnation with no lineage: every existing link "
    "of the owner key fails closed on its next save (suspend_reason drift:pack_install) "
    "and attempts frozen under the old install stay frozen, until each link is "
    "revalidated (revalidate-link or revalidate plan/apply)"
)


async def _set_rate_limits(rates: dict[str, float], settings: RuntimeSettings) -> str:
    """Set the remote rate limits (PROF-3) on the task queue; a note on what happened."""
    import asyncio

    from cli.entry import cli_runtime
    from services.rate_limit import ensure_fairness_limit
    from worker.client import connect_temporal

    if not rates:
        return "rate limits: no profile declares rateLimit"
    if settings.temporal_address is None:
        return "rate limits: TEMPORAL_ADDRESS is not set; the worker sets them at start"
    try:
        async with asyncio.timeout(RATE_LIMIT_SYNC_TIMEOUT_S):
            client = await connect_temporal(settings, cli_runtime())
            await ensure_fairness_limit(client, settings.task_queue)
    except Exception as exc:  # any failure leaves the apply standing: the worker retries
        reason = f"{type(exc).__name__}: {exc}"
        return f"warning: rate limits not set on Temporal ({reason}); the worker sets them at start"
    return f"rate limits: {len(rates)} limited budget(s) set on task queue {settings.task_queue}"


async def _preview(dsn: str, manifest: PackManifest, **options: bool) -> ApplyPreview:
    from services.pack_preview import preview_apply

    async with connect(dsn) as conn:
        return await preview_apply(conn, manifest, **options)


def _print_preview(preview: ApplyPreview) -> None:
    owner = escape(preview.connector_owner_key)
    console = Console(highlight=False)
    if preview.unchanged:
        console.print(
            f"dry run: {owner} is already active with this manifest; nothing would change"
        )
        return
    current = preview.current_pack_install_id or "none (first install)"
    console.print(
        f"dry run: applying would make a new install of {owner} (active now: {current}); "
        f"examined {preview.links_examined} finalized link(s) and "
        f"{preview.attempts_examined} active attempt(s); nothing written"
    )
    if preview.impacts:
        table = _table("per drift surface", "surface", "on", "effect", "count", "examples")
        for i in preview.impacts:
            _add(table, i.surface, i.subject, i.effect.value, str(i.count), ", ".join(i.examples))
        console.print(table)
    console.print(
        f"{preview.links_failing_closed} link(s) would fail closed (no PATCH) until "
        "revalidated; active attempts keep their frozen requests"
    )


def apply_command(
    file: Annotated[Path, typer.Argument(help="Pack manifest (YAML or JSON).", show_default=False)],
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Show what the new install would do to links, attempts and creates, per "
            "drift surface, and exit 2 if its unverified claims would refuse it; write nothing.",
        ),
    ] = False,
    reinstall: Annotated[
        bool,
        typer.Option(
            "--reinstall",
            help="A new incarnation even if unchanged: existing links fail closed (drift).",
        ),
    ] = False,
    confirm_reinstall: Annotated[
        bool,
        typer.Option(
            "--confirm-reinstall", help="Required with --reinstall: you accept the suspensions."
        ),
    ] = False,
    operator: Annotated[
        str, typer.Option("--operator", help="Who applies (recorded in the audit trail).")
    ] = os.environ.get("USER", "operator"),
    reason: Annotated[
        str, typer.Option("--reason", help="Why (recorded in the audit trail).")
    ] = "",
    accept_unverified: AcceptUnverified = False,
) -> None:
    """Validate a manifest and make it the active install for its ConnectorOwnerKey."""
    import asyncio

    from cli.entry import run_closing_temporal
    from cli.pack_verify import end_as_apply_would, refuse_plain_http_profiles
    from worker.settings import RuntimeSettings

    manifest = validate_manifest_file(file)
    if reinstall and not confirm_reinstall and not dry_run:
        bad_input(f"{_REINSTALL_CONSEQUENCE}; pass --confirm-reinstall to proceed")
    if confirm_reinstall and not reinstall:
        bad_input("--confirm-reinstall confirms --reinstall, which was not given")
    settings = load_settings(RuntimeSettings)  # before the install: exit 5, nothing written
    refuse_plain_http_profiles(settings, manifest)
    claims, dsn = claim_options(settings, accept_unverified, reason), _dsn(database_url)
    if dry_run:
        preview = asyncio.run(_preview(dsn, manifest, reinstall=reinstall, **claims))
        if as_json:
            echo_json(preview.model_dump(mode="json"))
        else:
            _print_preview(preview)
        end_as_apply_would(preview)  # exit 2 where the apply would refuse
        return
    required_text("--operator", operator)
    applied = _apply(dsn, manifest, reinstall=reinstall, operator=operator, reason=reason, **claims)
    result, rates = asyncio.run(applied)
    note = run_closing_temporal(_set_rate_limits(rates, settings))
    if as_json:
        echo_json(result.model_dump(mode="json"))
    else:
        _print_apply(result)
    typer.echo(note, err=True)


async def _resolve_owner(conn: Conn, owner_key: str | None) -> str:
    from db import packs as q

    if owner_key is not None:
        return owner_key
    owners = await q.select_active_owner_keys(conn)
    if not owners:
        fail("no active pack: run `connector-push pack apply FILE` first")
    if len(owners) > 1:
        fail(
            escape(f"several owner keys have active packs ({', '.join(owners)}): pass --owner-key")
        )
    return owners[0]


async def _show(dsn: str, owner_key: str | None) -> ActivePack:
    from services.packs import get_active_pack

    async with connect(dsn) as conn:
        owner = await _resolve_owner(conn, owner_key)
        active = await get_active_pack(conn, owner)
    if active is None:
        fail(escape(f"no active pack for owner key {owner!r}"))
    return active


def _show_json(pack: ActivePack) -> dict[str, object]:
    return {
        "pack_install_id": pack.pack_install_id,
        "connector_owner_key": pack.connector_owner_key,
        "manifest_digest": pack.manifest_digest,
        "activated_at": pack.activated_at.isoformat() if pack.activated_at else None,
        "manifest": pack.manifest.model_dump(mode="json", by_alias=True),
        "lineage": [
            {
                "slot_type": r.slot_type,
                "kind": r.kind,
                "from_slot": r.from_slot,
                "to_slot": r.to_slot,
            }
            for r in pack.lineage
        ],
    }


# Ids are copied into other commands, so they are never wrapped; other columns give way.
_NO_WRAP = frozenset({"install id", "digest", "id"})


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column in _NO_WRAP, overflow="fold")
    return table


def _add(table: Table, *cells: str) -> None:
    """Cells are data, never markup."""
    table.add_row(*(escape(cell) for cell in cells))


def _print_pack(pack: ActivePack) -> None:
    m = pack.manifest
    console = Console()
    since = f"{pack.activated_at:%Y-%m-%d %H:%M:%S %Z}" if pack.activated_at else "?"
    console.print(
        f"[bold]{escape(m.connector_owner_key)}[/] (namespace {escape(m.namespace)}) "
        f"install {pack.pack_install_id}, digest {_short(pack.manifest_digest)}, "
        f"active since {since}",
        highlight=False,
    )
    slots = _table("action slots", "id", "source object", "destination", "flow", "mapped fields")
    for s in m.action_slots:
        fields = ", ".join(r.source_field + ("*" if r.required else "") for r in s.mappings)
        flow = f"{s.flow_developer_name}/{s.flow_action_name} v{s.flow_version}"
        _add(slots, s.id, s.source_object, s.destination_slot, flow, fields)
    dests = _table("destination slots", "id", "target object", "remote scope", "profile")
    for d in m.destination_slots:
        _add(dests, d.id, d.target_object, d.remote_scope, d.profile)
    profiles = _table("profiles", "name", "credentialRef", "base URL", "POST idempotency")
    for p in m.profiles:
        post = p.idempotency.post.header if p.idempotency.post else "-"
        _add(profiles, p.name, p.credential_ref, p.base_url, post)
    lineage = _table("lineage", "kind", "from slot", "to slot")
    for r in pack.lineage:
        _add(lineage, r.kind, r.from_slot, r.to_slot or "-")
    for table in (slots, dests, profiles, lineage):
        console.print(table)


def show_command(
    owner_key: OwnerKey = None, database_url: DatabaseUrl = None, as_json: AsJson = False
) -> None:
    """Show the active pack of one ConnectorOwnerKey: slots, profiles and lineage."""
    import asyncio

    pack = asyncio.run(_show(_dsn(database_url), owner_key))
    if as_json:
        echo_json(_show_json(pack))
    else:
        _print_pack(pack)


async def _list(dsn: str, owner_key: str | None) -> list[q.PackInstallRow]:
    from db import packs as q

    async with connect(dsn) as conn:
        return await q.select_installs(conn, owner_key)


def _list_json(row: q.PackInstallRow) -> dict[str, object]:
    return {
        "pack_install_id": row.pack_install_id,
        "connector_owner_key": row.connector_owner_key,
        "connector_namespace": row.connector_namespace,
        "manifest_digest": row.manifest_digest,
        "active": row.active,
        "created_at": row.created_at.isoformat(),
        "deactivated_at": row.deactivated_at.isoformat() if row.deactivated_at else None,
    }


def list_command(
    owner_key: Annotated[
        str | None, typer.Option("--owner-key", help="Only this ConnectorOwnerKey.")
    ] = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """List every pack install incarnation, oldest first, marking the active one."""
    import asyncio

    rows = asyncio.run(_list(_dsn(database_url), owner_key))
    if as_json:
        echo_json([_list_json(row) for row in rows])
        return
    table = _table("pack installs", "owner key", "install id", "digest", "active", "created")
    for row in rows:
        created = f"{row.created_at:%Y-%m-%d %H:%M}"
        active = "yes" if row.active else "-"
        _add(
            table,
            row.connector_owner_key,
            row.pack_install_id,
            _short(row.manifest_digest),
            active,
            created,
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    pack = typer.Typer(help="Pack manifests: apply, verify, show, list.", no_args_is_help=True)
    pack.command("apply")(apply_command)
    pack.command("verify")(verify_command)
    pack.command("show")(show_command)
    pack.command("list")(list_command)
    app.add_typer(pack, name="pack")
