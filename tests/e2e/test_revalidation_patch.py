"""SPEC §9 end to end: plan -> validate -> apply moves a link's mapping, and PATCH follows it.

A pack upgrade that adds a mapping row is fail-closed drift for finalized links
(DRIFT-2); an approved revalidation moves the link's fingerprints (REV-1), so the
next save PATCHes through the unchanged finalized-link path with the new mapping.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from typer.testing import CliRunner

from cli.main import app
from protocol.admission import PatchQueued
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import Stack, contact_key, demo_manifest
from tests.e2e.support import eventually


async def _cli(*args: str) -> Any:
    # The command runs its own event loop: invoke it off this test's loop.
    return await asyncio.to_thread(CliRunner().invoke, app, ["revalidate", *args])


async def _patches(stack: Stack, key: str) -> list[asyncpg.Record]:
    return await stack.pool.fetch(
        "SELECT status, body FROM connector_patch_dispatch WHERE link_key = $1", key
    )


async def _add_title_mapping(pool: asyncpg.Pool, remote: BackgroundSandbox) -> str:
    """Upgrade the pack with one more contact mapping row; alice may read the field."""
    doc = demo_manifest(remote.url)
    doc["actionSlots"][0]["mappings"].append(  # type: ignore[index]
        {"sourceField": "Title", "remoteProperty": "jobtitle"}
    )
    await pool.execute(
        "INSERT INTO crm_field_permission (user_id, source_object, field_name, can_read)"
        " VALUES ('alice', 'Contact', 'Title', true)"
    )
    await pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"Title": "Countess"}\'::jsonb'
        " WHERE source_object = 'Contact' AND record_id = 'c-001'"
    )
    async with pool.acquire() as conn:
        return (await apply_pack(conn, doc)).pack_install_id


async def test_a_revalidated_link_patches_with_the_new_mapping(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str, tmp_path: Path
) -> None:
    key = contact_key("c-001")
    await stack.push("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    install = await _add_title_mapping(stack.pool, remote)
    manifest = tmp_path / "rev-1.json"
    planned = await _cli(
        "plan", "--operation-id", "rev-1", "--approved-by", "alice",
        "--approval-reference", "CHG-7", "--reason", "Title mapping added in pack v2",
        "--link-key", key, "--new-pack-install", install, "--out", str(manifest),
        "--database-url", db_dsn,
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    for command, status in (("validate", "validated"), ("apply", "applied")):
        result = await _cli(command, str(manifest), "--json", "--database-url", db_dsn)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["status"] == status

    decision = await stack.push("c-001")
    assert isinstance(decision, PatchQueued), decision
    rows = await eventually(
        lambda: _patches(stack, key),
        lambda rs: bool(rs) and all(r["status"] not in ("pending", "processing") for r in rs),
    )
    assert [r["status"] for r in rows] == ["succeeded"]
    assert json.loads(rows[0]["body"])["properties"]["jobtitle"] == "Countess"
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    assert link["last_mapping_revalidation_operation_id"] == "rev-1"
    assert str(link["last_validated_pack_install_id"]) == install
    async with httpx.AsyncClient(base_url=remote.url) as http:
        remote_object = (await http.get(f"/crm/v3/objects/contacts/{link['remote_id']}")).json()
    assert remote_object["properties"]["jobtitle"] == "Countess"
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="patch")) == 1
