"""`connector-push pack verify PACK --profile NAME`: a profile's claims probed on a test
account, the findings kept with the pack's digest for `pack apply` (SPEC §14.2, G-1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.database import AsJson, DatabaseUrl, bad_input, connect, echo_json
from cli.database import resolve_dsn as _dsn
from cli.errors import EXIT_FAILED, required_text

if TYPE_CHECKING:
    from db.records import Conn
    from protocol.manifest import PackManifest
    from services.pack_preview import ApplyPreview
    from services.pack_verify import VerifyReport
    from services.packs import ApplyPackResult
    from worker.settings import RuntimeSettings

# `pack apply`'s explicit, audited override of what `pack verify` found (or never found).
AcceptUnverified = Annotated[
    bool,
    typer.Option(
        "--accept-unverified-claims",
        help="Install although `pack verify` found a profile's idempotency.post or "
        "precondition claim not holding (or, in production, never verified); needs "
        "--reason; audited with the claims accepted.",
    ),
]


def claim_options(settings: RuntimeSettings, accept: bool, reason: str) -> dict[str, bool]:
    """`apply_pack`'s claim arguments: production from the deployment's settings, and the
    override, which needs a reason (it is audited)."""
    if accept:
        required_text("--reason (with --accept-unverified-claims)", reason)
    production = settings.deployment_profile == "production"
    return {"production": production, "accept_unverified_claims": accept}


def refuse_plain_http_profiles(settings: RuntimeSettings, manifest: PackManifest) -> None:
    """S-3: where the deployment refuses plain http, a pack whose profiles name an
    `http://` base URL is not applied (exit 2 naming each, nothing written): the worker
    would refuse every request they send."""
    from protocol.installable import plain_http_problems

    refused = list(plain_http_problems(manifest)) if settings.refuses_plain_http() else []
    if refused:
        bad_input("pack not applied (nothing written): " + "; ".join(refused))


async def apply_checked(conn: Conn, manifest: PackManifest, **options: Any) -> ApplyPackResult:
    """`apply_pack`; a profile refused for its claims exits 2 naming them (nothing written)."""
    from services.packs import ClaimsUnverified, apply_pack

    try:
        return await apply_pack(conn, manifest, **options)
    except ClaimsUnverified as exc:
        bad_input(f"pack not applied (nothing written): {exc}")


def end_as_apply_would(preview: ApplyPreview) -> None:
    """`pack apply --dry-run` ends as the apply would: exit 2 naming the unverified claims
    it would refuse; accepted ones are named (the apply audits them)."""
    if preview.claims_refusal is not None:
        bad_input(f"dry run: pack apply would refuse this pack: {preview.claims_refusal}")
    if preview.unverified_claims:
        accepted = "\n  ".join(preview.unverified_claims)
        typer.echo(f"dry run: pack apply would accept, audited:\n  {accepted}", err=True)


def _credential(credential_ref: str, base_url: str) -> str:
    """The reference's secret, where the worker's transport reads it, and only for a host
    bound to it (S-3); a clear error naming the variable otherwise (nothing sent)."""
    import httpx

    from protocol.credential_hosts import hosts_variable, refusal, secret_variable, target_of

    secret = os.environ.get(secret_variable(credential_ref))
    if not secret:
        bad_input(
            f"credential {credential_ref}: set {secret_variable(credential_ref)} (nothing sent)"
        )
    url = httpx.URL(base_url)
    target = target_of(url.scheme, url.host, url.port)
    refused = refusal(
        credential_ref, url.scheme, target, os.environ.get(hosts_variable(credential_ref))
    )
    if refused is not None:
        bad_input(refused)
    return secret


async def _verify(
    dsn: str, manifest: PackManifest, profile: str, credential: str, operator: str
) -> VerifyReport:
    import httpx

    from services.pack_verify import store_report, verify_profile
    from worker.runtime import tls_context

    async with (
        httpx.AsyncClient(timeout=10.0, verify=tls_context()) as http,
        connect(dsn) as conn,  # reachable before any object is created
    ):
        report = await verify_profile(http, manifest, profile, credential)
        await store_report(conn, report, operator)
    return report


def _print(report: VerifyReport) -> None:
    console = Console(highlight=False)
    console.print(
        f"profile {escape(report.profile)} of pack {report.manifest_digest[:12]}: probed "
        f"{escape(report.target_object)} (action slot {escape(report.action_slot)}) at "
        f"{escape(report.base_url)}"
    )
    table = Table(title="claims", title_justify="left")
    for column in ("claim", "finding", "evidence"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        table.add_row(escape(r.claim.value), escape(r.finding.value), escape(r.evidence))
    console.print(table)
    console.print(f"cleaned up: {len(report.deleted)} throw-away object(s) deleted")
    if report.not_deleted:
        kept = escape(", ".join(report.not_deleted))
        console.print(f"NOT deleted (delete them by hand): {kept}")


def verify_command(
    file: Annotated[Path, typer.Argument(help="Pack manifest (YAML or JSON).", show_default=False)],
    profile: Annotated[
        str,
        typer.Option("--profile", help="The profile whose claims to probe.", show_default=False),
    ],
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
    operator: Annotated[
        str, typer.Option("--operator", help="Who verifies (stored with the findings).")
    ] = os.environ.get("USER", "operator"),
) -> None:
    """Probe a profile's claims on a TEST account with throw-away objects (deleted after).

    Sends to the profile's baseUrl with the secret of its credentialRef
    (CONNECTOR_PUSH_CREDENTIAL_<REF>): point them at a test account, never production
    data. Each claim is reported holds / does_not_hold / not_tested with its evidence,
    and kept with the pack's digest: `pack apply` refuses a profile whose idempotency.post
    or precondition claim does not hold. Exit 1 when a claim does not hold.
    """
    import asyncio

    from cli.pack_cmd import validate_manifest_file
    from protocol.pack_claims import Finding
    from services.pack_verify import VerifyError, target_of

    required_text("--operator", operator)
    manifest = validate_manifest_file(file)
    try:
        target = target_of(manifest, profile)
    except VerifyError as exc:
        bad_input(f"{file}: {exc}")
    credential = _credential(target.profile.credential_ref, target.profile.base_url)
    report = asyncio.run(_verify(_dsn(database_url), manifest, profile, credential, operator))
    if as_json:
        echo_json(report.model_dump(mode="json"))
    else:
        _print(report)
    if any(r.finding is Finding.DOES_NOT_HOLD for r in report.results):
        raise typer.Exit(EXIT_FAILED)
