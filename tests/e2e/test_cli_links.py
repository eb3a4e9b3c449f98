"""`links show` shows the drift findings and PATCH history of a link (issue 6 item 6)."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from cli.main import app
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack
from tests.e2e.patch_support import (
    apply_edit,
    finalized_contact,
    flow_version,
    revalidate_owner_now,
    settled,
)


async def test_links_show_prints_findings_and_patch_history(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str
) -> None:
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, flow_version)
    await revalidate_owner_now(stack.pool)  # C-4: a new install is revalidated first
    await stack.push("c-001")
    await settled(stack, link["link_key"])
    # The command runs its own event loop: invoke it off this test's loop.
    args = ["links", "show", link["link_key"], "--json", "--database-url", db_dsn]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["link"]["status"] == "finalized"
    assert [f["surface"] for f in data["drift_findings"]] == ["flow_version"]
    assert [p["status"] for p in data["patches"]] == ["succeeded"]
    # JRN-1: the create's try and the PATCH's try, each answered.
    tries = data["send_journal"]
    assert [(t["method"], t["outcome"], t["may_have_landed"]) for t in tries] == [
        ("POST", "answered", True),
        ("PATCH", "answered", True),
    ]
    attempt_id = (await stack.attempt(link["link_key"]))["attempt_id"]
    args = ["attempts", "show", str(attempt_id), "--database-url", db_dsn]
    shown = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.output)
    assert detail["attempt"]["status"] == "finalized"
    # The remote id the create's answer named, kept on its try (JRN-1).
    assert [(t["status"], t["remote_id"]) for t in detail["send_journal"]] == [
        (201, link["remote_id"])
    ]
    assert detail["tries_may_have_landed"] == 1
    # Without --json: the same facts as tables for a person.
    table = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert table.exit_code == 0, table.output
    assert "attempt #1" in table.output and "send journal" in table.output
    assert "finalized" in table.output
    assert "tries that may have landed: 1 of 1" in table.output


def test_links_show_unknown_key_is_a_clear_error(db_dsn: str) -> None:
    result = CliRunner().invoke(app, ["links", "show", "lk1_" + "0" * 64, "--database-url", db_dsn])
    assert result.exit_code == 2
    assert "no link" in result.output
