"""Install changes fail closed, and the way out is one command (issue 30 item 4).

SPEC §15 C-4, C-8, C-9; seed rows P-10, D-06L (000:106-109, 114-116, 417), D-15L (000:426),
on the real stack (Postgres, Temporal, sandbox) and through the real CLI.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner, Result

from cli.main import app
from protocol.admission import CreateReserved, PatchQueued, Rejected
from protocol.errors import RejectReason
from protocol.messages import RevalidateInput
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import OWNER, Stack, contact_key, demo_manifest
from tests.e2e.patch_support import (
    Doc,
    apply_edit,
    contact_slot,
    finalized_contact,
    patches,
    retry_policy,
    settled,
    suspended,
)
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow


async def cli(*args: str) -> Result:
    """The real CLI, off this test's event loop (each command runs its own)."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def manifest_file(tmp_path: Path, remote: BackgroundSandbox, *edits: Any) -> Path:
    doc: Doc = demo_manifest(remote.url)
    for edit in edits:
        edit(doc)
    path = tmp_path / "pack.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def create_path(doc: Doc) -> None:
    # Renders the same route for contacts, but the template changed (C-8: it is validated
    # by an operator before a create uses it).
    contact_slot(doc)["createPath"] = "/crm/v3/objects/contacts"


async def table_counts(stack: Stack) -> tuple[Any, ...]:
    row = await stack.pool.fetchrow(
        """
        SELECT (SELECT count(*) FROM pack_install) AS installs,
               (SELECT count(*) FROM connector_operator_audit) AS audit,
               (SELECT count(*) FROM action_slot_create_path) AS create_paths,
               (SELECT count(*) FROM connector_link_revalidation_receipt) AS receipts,
               (SELECT count(*) FROM connector_patch_dispatch) AS patches,
               (SELECT count(*) FROM connector_push_attempt) AS attempts,
               (SELECT string_agg(l::text, ',' ORDER BY link_key)
                  FROM connector_remote_link l) AS links
        """
    )
    assert row is not None
    return tuple(row)


async def test_a_new_install_fails_closed_until_one_command_revalidates_the_owner(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str, tmp_path: Path
) -> None:
    """P-10, D-06L, C-4: `pack apply` of a new install of the same pack (same lineage, the
    mapping unchanged) says how many links wait and the command; the next save on a
    finalized link is rejected and the link suspended, with no PATCH in the ledger; one
    `revalidate owner` command revalidates every link of the owner (the suspended one and
    one nobody saved); then saves PATCH. Fails on the old main: `pack_upgraded` was benign
    and the first save after the apply PATCHed."""
    first = await finalized_contact(stack, "c-001")
    second = await finalized_contact(stack, "c-002")

    applied = await cli("pack", "apply", str(manifest_file(tmp_path, remote, retry_policy)),
                        "--database-url", db_dsn, "--json")  # fmt: skip
    assert applied.exit_code == 0, applied.output
    result = json.loads(applied.stdout)
    assert result["outcome"] == "installed" and result["replaced_pack_install_id"]
    assert result["links_awaiting_revalidation"] == 2
    command = (
        f"connector-push revalidate owner --owner-key {OWNER} --approved-by WHO "
        "--approval-reference REF --reason WHY"
    )
    assert result["revalidate_command"] == command

    decision = await stack.push("c-001")
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    row = await suspended(stack, first["link_key"])
    assert row is not None and row["suspend_reason"] == "drift:pack_upgraded"
    assert await patches(stack) == []

    revalidated = await cli(
        "revalidate", "owner", "--owner-key", OWNER, "--approved-by", "ops-lead",
        "--approval-reference", "CHG-30", "--reason", "retry policy only",
        "--database-url", db_dsn, "--json",
    )  # fmt: skip
    assert revalidated.exit_code == 0, revalidated.output
    report = json.loads(revalidated.stdout)
    assert report["outcome"] == "applied"
    assert report["restored"] == [first["link_key"]]
    assert report["links_revalidated"] == 2 and report["mapping_moves"] == 0
    for link in (first, second):
        row = await stack.link(link["link_key"])
        assert row is not None and row["status"] == "finalized"
        assert str(row["last_validated_pack_install_id"]) == result["pack_install_id"]
    audit = await stack.pool.fetch(
        "SELECT command, link_key FROM connector_operator_audit "
        "WHERE command IN ('revalidate-owner', 'revalidate-apply') ORDER BY audit_id"
    )
    applied_keys = sorted([first["link_key"], second["link_key"]])
    assert [(r["command"], r["link_key"]) for r in audit] == [
        ("revalidate-owner", first["link_key"]),
        *[("revalidate-apply", key) for key in applied_keys],
    ]

    again = await cli("revalidate", "owner", "--owner-key", OWNER, "--approved-by", "ops-lead",
                      "--approval-reference", "CHG-30", "--reason", "again",
                      "--database-url", db_dsn)  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "nothing waits" in again.stdout

    for record_id, link in (("c-001", first), ("c-002", second)):
        assert isinstance(await stack.push(record_id), PatchQueued)
        rows = await settled(stack, link["link_key"])
        assert [r["status"] for r in rows][-1] == "succeeded"
    assert len(await patches(stack)) == 2


async def test_dry_run_reports_per_surface_and_writes_nothing(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str, tmp_path: Path
) -> None:
    """C-4: `pack apply --dry-run` prints, before anything is written, what the new install
    would do to existing links and active attempts per drift surface (benign / fail closed /
    blocks creates), with counts and example keys; every table is as it was."""
    link = await finalized_contact(stack, "c-001")
    before = await table_counts(stack)
    file = manifest_file(tmp_path, remote, retry_policy, create_path)
    shown = await cli("pack", "apply", str(file), "--dry-run", "--database-url", db_dsn, "--json")
    assert shown.exit_code == 0, shown.output
    preview = json.loads(shown.stdout)
    assert preview["unchanged"] is False and preview["links_examined"] == 1
    impacts = {(i["surface"], i["subject"]): i for i in preview["impacts"]}
    upgraded = impacts[("pack_upgraded", "links")]
    assert (upgraded["effect"], upgraded["count"]) == ("fail closed", 1)
    assert upgraded["examples"] == [link["link_key"]]
    retry = impacts[("retry_policy", "links")]
    assert (retry["effect"], retry["count"]) == ("benign", 1)
    creates = impacts[("create_path", "creates")]
    assert (creates["effect"], creates["examples"]) == ("blocks creates", ["push-contact"])
    assert preview["links_failing_closed"] == 1
    table = await cli("pack", "apply", str(file), "--dry-run", "--database-url", db_dsn)
    assert table.exit_code == 0, table.output
    assert "dry run" in table.output and "fail closed" in table.output
    assert "blocks creates" in table.output
    assert await table_counts(stack) == before


async def test_a_changed_create_path_blocks_new_creates_until_validated(
    stack: Stack, remote: BackgroundSandbox, db_dsn: str, tmp_path: Path
) -> None:
    """D-15L, C-8: after a createPath change, a new record's save is rejected (no attempt)
    until `revalidate create-path` validates the slot (an audit entry); then it creates.
    Fails on the old main: the create path row was benign and the save reserved a create."""
    await finalized_contact(stack, "c-001")
    applied = await cli("pack", "apply", str(manifest_file(tmp_path, remote, create_path)),
                        "--database-url", db_dsn)  # fmt: skip
    assert applied.exit_code == 0, applied.output
    # The person's form names both ways out: one link waits (C-4), one slot is blocked.
    assert "waiting: 1 link(s) wait for revalidation" in applied.stdout
    assert f"connector-push revalidate owner --owner-key {OWNER}" in applied.stdout
    assert "blocked: the create path of action slot(s) push-contact changed" in applied.stdout
    assert f"connector-push revalidate create-path --owner-key {OWNER}" in applied.stdout

    decision = await stack.push("c-003")
    assert isinstance(decision, Rejected), decision
    assert decision.reason is RejectReason.CREATE_PATH_UNVALIDATED
    attempts = "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1"
    assert await stack.pool.fetchval(attempts, contact_key("c-003")) == 0

    validated = await cli(
        "revalidate", "create-path", "--owner-key", OWNER, "--reason", "same route, literal",
        "--operator", "ops-lead", "--database-url", db_dsn, "--json",
    )  # fmt: skip
    assert validated.exit_code == 0, validated.output
    report = json.loads(validated.stdout)
    assert [v["action_slot_id"] for v in report["validated"]] == ["push-contact"]
    assert report["still_blocked"] == []
    entry = await stack.pool.fetchrow(
        "SELECT operator, arguments FROM connector_operator_audit "
        "WHERE command = 'revalidate-create-path'"
    )
    assert entry is not None and entry["operator"] == "ops-lead"

    assert isinstance(await stack.push("c-003"), CreateReserved)
    await eventually(
        lambda: stack.attempt(contact_key("c-003")), lambda r: r["status"] == "finalized"
    )


async def test_revalidate_link_clears_the_install_change_suspension(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    """P-10 (000:106-109): `revalidate-link` of one link suspended by a new install moves it
    onto the active install; its next save PATCHes (no owner-wide command needed)."""
    link = await finalized_contact(stack, "c-001")
    await apply_edit(stack.pool, remote, retry_policy)
    assert isinstance(await stack.push("c-001"), Rejected)
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == "drift:pack_upgraded"
    handle = stack.handle(link["link_key"])
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.revalidate, RevalidateInput(operator="op", reason="new install checked")
    )
    assert result.view.link_status == "finalized"
    active = await stack.pool.fetchval("SELECT pack_install_id FROM pack_install WHERE active")
    row = await stack.link(link["link_key"])
    assert row is not None and row["last_validated_pack_install_id"] == active
    assert isinstance(await stack.push("c-001"), PatchQueued)
    assert [r["status"] for r in await settled(stack, link["link_key"])] == ["succeeded"]
    assert len(await patches(stack)) == 1
