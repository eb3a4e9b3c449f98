"""`connector-push pack verify` and the claims gate of `pack apply` (SPEC §14.2 PROF-1..3,
§17 G-1: pack verify is the send gate's named exception), through the real CLI against
the sandbox remote in its generous and its HubSpot-exact modes, and real Postgres."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from typer.testing import CliRunner, Result

from cli.main import app
from sandbox.client import SandboxClient
from sandbox.server import BackgroundSandbox
from services.packs import ClaimsUnverified, apply_pack
from tests.e2e.conftest import demo_manifest
from tests.e2e.hubspot_support import TOKEN, hubspot_manifest, set_credential
from tests.e2e.hubspot_support import hubspot_remote as hubspot_remote  # the fixture
from tests.e2e.pack_cases import salesforce_manifest
from tests.e2e.pack_cases import salesforce_remote as salesforce_remote  # the fixture
from tests.e2e.pack_cases import set_credential as set_pack_credential

Doc = dict[str, Any]


async def cli(*args: str) -> Result:
    """The real CLI in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def write(tmp_path: Path, name: str, document: Doc) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def findings(result: Result) -> dict[str, str]:
    report = json.loads(result.stdout)
    return {r["claim"]: r["finding"] for r in report["results"]}


@pytest.fixture
async def hubspot_admin(hubspot_remote: BackgroundSandbox) -> AsyncIterator[SandboxClient]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        admin = SandboxClient(hubspot_remote.url, http)
        await admin.reset()
        yield admin


@pytest.fixture
async def generous(remote: BackgroundSandbox) -> AsyncIterator[SandboxClient]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        admin = SandboxClient(remote.url, http)
        await admin.reset()
        yield admin


def bind_sandbox_token(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The demo pack's credential (env:SANDBOX_TOKEN) and the sandbox host it may reach."""
    monkeypatch.setenv("CONNECTOR_PUSH_CREDENTIAL_ENV_SANDBOX_TOKEN", TOKEN)
    monkeypatch.setenv("CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_SANDBOX_TOKEN", url.split("//")[1])


async def verify(dsn: str, pack: Path, profile: str) -> Result:
    return await cli(
        "pack", "verify", str(pack), "--profile", profile, "--json", "--database-url", dsn
    )


async def test_the_demo_packs_idempotency_claim_does_not_hold_on_the_hubspot_mode(
    db_dsn: str,
    hubspot_remote: BackgroundSandbox,
    hubspot_admin: SandboxClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HubSpot documents no idempotency key: the same POST twice is two answers, not one
    object; the finding is stored and `pack apply` refuses the pack until overridden."""
    bind_sandbox_token(monkeypatch, hubspot_remote.url)
    pack = write(tmp_path, "demo.yaml", demo_manifest(hubspot_remote.url))
    result = await verify(db_dsn, pack, "sandbox-idempotent")
    assert result.exit_code == 1, result.output
    assert findings(result)["idempotency.post"] == "does_not_hold"
    assert findings(result)["responseIdPath"] == "holds"
    assert findings(result)["notAppliedStatuses"] == "not_tested"
    assert TOKEN not in result.output
    report = json.loads(result.stdout)
    assert report["not_deleted"] == [] and report["deleted"]
    assert await hubspot_admin.objects("contacts") == []  # every throw-away object deleted
    # The precondition claim: HubSpot answers no ETag.
    locator = await verify(db_dsn, pack, "sandbox-locator")
    assert findings(locator)["precondition"] == "does_not_hold", locator.output
    assert findings(locator)["locatorRecovery"] == "holds"

    refused = await cli("pack", "apply", str(pack), "--database-url", db_dsn)
    assert refused.exit_code == 2, refused.output
    assert "idempotency.post was found not holding" in refused.output
    conn = await asyncpg.connect(db_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 0
        blank = await cli(
            "pack", "apply", str(pack), "--database-url", db_dsn, "--accept-unverified-claims"
        )
        assert blank.exit_code == 2 and "--reason" in blank.output
        accepted = await cli(
            "pack", "apply", str(pack), "--database-url", db_dsn, "--accept-unverified-claims",
            "--reason", "demo only", "--operator", "ops",
        )  # fmt: skip
        assert accepted.exit_code == 0, accepted.output
        audit = await conn.fetchrow(
            "SELECT arguments, outcome FROM connector_operator_audit WHERE command = 'pack-apply'"
        )
        assert audit is not None and "unverified claim(s) accepted" in audit["outcome"]
        assert len(json.loads(audit["arguments"])["accepted_unverified_claims"]) == 2
    finally:
        await conn.close()


async def test_the_demo_packs_claims_hold_on_the_generous_sandbox(
    db_dsn: str,
    remote: BackgroundSandbox,
    generous: SandboxClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bind_sandbox_token(monkeypatch, remote.url)
    pack = write(tmp_path, "demo.yaml", demo_manifest(remote.url))
    idempotent = await verify(db_dsn, pack, "sandbox-idempotent")
    assert idempotent.exit_code == 0, idempotent.output
    assert findings(idempotent)["idempotency.post"] == "holds"
    locator = await verify(db_dsn, pack, "sandbox-locator")
    assert locator.exit_code == 0, locator.output
    assert findings(locator) == {
        "precondition": "holds",
        "locatorRecovery": "holds",
        "notAppliedStatuses": "not_tested",
        "responseIdPath": "holds",
    }
    assert await generous.objects("contacts") == [] and await generous.objects("deals") == []
    # Verified for this digest: a production deployment applies it.
    conn = await asyncpg.connect(db_dsn)
    try:
        result = await apply_pack(conn, demo_manifest(remote.url), production=True)
        assert result.outcome == "installed"
    finally:
        await conn.close()


async def test_production_refuses_claims_never_verified(db_pool: asyncpg.Pool) -> None:
    """In production a replay-safety or precondition claim must have been found holding
    for the very digest applied; elsewhere it is trusted until found not holding."""
    async with db_pool.acquire() as conn:
        with pytest.raises(ClaimsUnverified, match="never verified"):
            await apply_pack(conn, demo_manifest("http://127.0.0.1:9"), production=True)
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 0
        # The HubSpot pack claims neither: production installs it unverified.
        await apply_pack(conn, hubspot_manifest("https://api.hubapi.com"), production=True)


async def test_the_hubspot_pack_passes_verify(
    db_dsn: str,
    hubspot_remote: BackgroundSandbox,
    hubspot_admin: SandboxClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_credential(monkeypatch, hubspot_remote.url)
    pack = write(tmp_path, "hubspot.yaml", hubspot_manifest(hubspot_remote.url))
    result = await verify(db_dsn, pack, "hubspot-objects")
    assert result.exit_code == 0, result.output
    assert findings(result) == {
        "locatorRecovery": "holds",
        "notAppliedStatuses": "not_tested",
        "responseIdPath": "holds",
    }
    assert await hubspot_admin.objects("contacts") == []
    table = await cli(
        "pack", "verify", str(pack), "--profile", "hubspot-objects", "--database-url", db_dsn
    )
    assert table.exit_code == 0 and "locatorRecovery" in table.output and "holds" in table.output


async def test_verify_errors_are_clear_and_send_nothing(
    db_dsn: str,
    hubspot_remote: BackgroundSandbox,
    hubspot_admin: SandboxClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONNECTOR_PUSH_CREDENTIAL_ENV_HUBSPOT_TOKEN", raising=False)
    pack = write(tmp_path, "hubspot.yaml", hubspot_manifest(hubspot_remote.url))
    missing = await verify(db_dsn, pack, "hubspot-objects")
    assert missing.exit_code == 2
    assert "CONNECTOR_PUSH_CREDENTIAL_ENV_HUBSPOT_TOKEN" in missing.output
    set_credential(monkeypatch, "http://127.0.0.1:9")  # bound to another host: not sent
    unbound = await verify(db_dsn, pack, "hubspot-objects")
    assert unbound.exit_code == 2 and "not bound to host" in unbound.output
    unknown = await verify(db_dsn, pack, "no-such-profile")
    assert unknown.exit_code == 2 and "hubspot-objects" in unknown.output
    assert (await hubspot_admin.limits()).admitted == []
    help_text = await cli("pack", "verify", "--help")
    assert help_text.exit_code == 0 and "TEST account" in help_text.output


async def test_the_salesforce_pack_passes_verify_and_an_idempotency_claim_is_refused(
    db_dsn: str,
    salesforce_remote: BackgroundSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 52 item 5: the look-up by external-id field answers the record itself (its id
    at the locator's own responseIdPath, `$.Id`); the pack claims no idempotency key, and
    one claimed anyway is found not holding: the remote ignores the key."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        admin = SandboxClient(salesforce_remote.url, http)
        await admin.reset()
        manifest = salesforce_manifest(salesforce_remote.url)
        set_pack_credential(monkeypatch, manifest, salesforce_remote.url)
        pack = write(tmp_path, "salesforce.yaml", manifest)
        result = await verify(db_dsn, pack, "sf-rest")
        assert result.exit_code == 0, result.output
        assert findings(result) == {
            "locatorRecovery": "holds",
            "notAppliedStatuses": "not_tested",
            "responseIdPath": "holds",
        }
        assert await admin.objects("Contact") == []  # every throw-away record deleted

        manifest["profiles"][0]["idempotency"] = {
            "post": {"header": "Idempotency-Key", "keyRetention": "24h"}
        }
        claimed = write(tmp_path, "claimed.yaml", manifest)
        refused = await verify(db_dsn, claimed, "sf-rest")
        assert refused.exit_code == 1, refused.output
        assert findings(refused)["idempotency.post"] == "does_not_hold"
        assert await admin.objects("Contact") == []
    applied = await cli("pack", "apply", str(claimed), "--database-url", db_dsn)
    assert applied.exit_code == 2 and "idempotency.post was found not holding" in applied.output
    await _dry_run_previews_the_refusal(db_dsn, claimed)


async def _dry_run_previews_the_refusal(dsn: str, pack: Path) -> None:
    """`pack apply --dry-run` ends as the apply would: exit 2 naming the claim (nothing
    written), and with the audited override it names the claims it would accept."""
    table = await cli("pack", "apply", str(pack), "--dry-run", "--database-url", dsn)
    assert table.exit_code == 2, table.output
    assert "dry run: pack apply would refuse this pack" in table.stderr
    assert "idempotency.post was found not holding" in table.stderr
    assert "would make a new install" in table.stdout
    shown = await cli("pack", "apply", str(pack), "--dry-run", "--json", "--database-url", dsn)
    preview = json.loads(shown.stdout)
    assert shown.exit_code == 2 and len(preview["unverified_claims"]) == 1
    assert "idempotency.post was found not holding" in preview["claims_refusal"]
    accepted = await cli(
        "pack", "apply", str(pack), "--dry-run", "--database-url", dsn,
        "--accept-unverified-claims", "--reason", "test remote",
    )  # fmt: skip
    assert accepted.exit_code == 0, accepted.output
    assert "would accept, audited" in accepted.stderr and "idempotency.post" in accepted.stderr
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pack_install") == 0
    finally:
        await conn.close()
