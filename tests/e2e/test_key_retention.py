"""SPEC §17 G-5 end to end: a create whose try may have landed is re-sent under its
idempotency key only while the frozen `keyRetention` lasts, counted from the first try's
send; past it the unique locator is looked up, or the attempt parks for an operator.

A retention shorter than one remote activity's start-to-close is past already at the
first re-send (the re-send must reach the remote before the key lapses), so no clock is
moved: the demo's 24 h is the counterpart within it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import yaml
from typer.testing import CliRunner

from cli.main import app
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from services.packs import apply_pack
from tests.e2e.conftest import Stack, contact_key, deal_key, demo_manifest
from tests.e2e.support import eventually
from tests.unit.factories import demo_document

CONTACTS = "/crm/v3/objects/contacts"
DEALS = "/crm/v3/objects/deals"


async def _apply(pool: asyncpg.Pool, remote: BackgroundSandbox, profile: str, post: Any) -> None:
    manifest: Any = demo_manifest(remote.url)
    (edited,) = [p for p in manifest["profiles"] if p["name"] == profile]
    edited.setdefault("idempotency", {})["post"] = post
    async with pool.acquire() as conn:
        await apply_pack(conn, manifest)


async def _status(stack: Stack, key: str, status: str) -> asyncpg.Record:
    return await eventually(lambda: stack.attempt(key), lambda r: r["status"] == status)


async def test_g5_a_re_send_within_the_key_retention_replays_the_key(stack: Stack) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, nth=1, action="reset_after_effect")
    )
    await stack.push("c-001")
    attempt = await _status(stack, contact_key("c-001"), "finalized")
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.replayed for e in creates] == [False, True]
    assert {e.object_id for e in creates} == {attempt["remote_id"]}


async def test_g5_a_re_send_past_the_key_retention_parks_without_a_locator(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """The contacts' profile keeps keys 1 s: try 1 lands, its answer is lost; a re-send
    could meet a remote that forgot the key and create a second contact."""
    await _apply(
        stack.pool,
        remote,
        "sandbox-idempotent",
        {"header": "Idempotency-Key", "keyRetention": "1s"},
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, nth=1, action="reset_after_effect")
    )
    await stack.push("c-001")
    parked = await _status(stack, contact_key("c-001"), "ambiguous_remote_effect")
    assert "keyRetention 1 s" in parked["last_error"] and "G-5" in parked["last_error"]
    creates = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.replayed for e in creates] == [False], "never re-sent"


async def test_g5_a_re_send_past_the_key_retention_looks_the_locator_up(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """The deals' profile declares both an idempotency key (kept 1 s) and a unique locator:
    past the retention the locator finds the object try 1 created; nothing is re-sent."""
    await _apply(
        stack.pool, remote, "sandbox-locator", {"header": "Idempotency-Key", "keyRetention": 1}
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=DEALS, nth=1, action="reset_after_effect")
    )
    await stack.push("o-001", slot="push-deal", obj="Opportunity", dest="remote-deals")
    attempt = await _status(stack, deal_key("o-001"), "finalized")
    creates = await stack.sandbox.ledger(object_type="deals", kind="create")
    assert [e.object_id for e in creates] == [attempt["remote_id"]]


def test_g5_pack_apply_and_its_dry_run_refuse_idempotency_post_without_key_retention(
    db_dsn: str, tmp_path: Path
) -> None:
    document = demo_document()
    del document["profiles"][0]["idempotency"]["post"]["keyRetention"]
    pack = tmp_path / "pack.yaml"
    pack.write_text(yaml.safe_dump(document), encoding="utf-8")
    for dry_run in (["--dry-run"], []):
        result = CliRunner().invoke(
            app, ["pack", "apply", str(pack), "--database-url", db_dsn, *dry_run]
        )
        assert result.exit_code == 2, result.output
        assert (
            "profiles[0].idempotency.post.keyRetention: required with idempotency.post"
            in result.stderr
        )
        assert result.stdout == ""
