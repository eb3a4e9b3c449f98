"""`revalidate-link` and `reconcile` follow the per-link rules (SPEC §17 G-4, C-9), on the
real stack (Postgres, Temporal, sandbox) through the real CLI: a link whose slot the active
pack lacks, or with a fail-closed finding revalidation does not settle, is refused with
the reason and the remedy, and nothing is written."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cli.main import app
from cli.stack.temporal import TemporalDevServer
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.patch_support import (
    Doc,
    apply_edit,
    finalized_contact,
    remote_scope,
    suspended,
)
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow

WHO = ["--operator", "ops@example.com", "--reason", "incident 47"]


@pytest.fixture
def cli_env(stack: Stack, temporal_server: TemporalDevServer, db_dsn: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_dsn,
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": temporal_server.config.namespace,
        "CONNECTOR_PUSH_TASK_QUEUE": stack.task_queue,
    }


async def _cli(env: dict[str, str], *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


def company_slot_recreated(doc: Doc) -> None:
    """The company action slot recreated under a new id, no lineage declared (C-9)."""
    slots: list[dict[str, Any]] = doc["actionSlots"]
    company = next(s for s in slots if s["id"] == "push-company")
    company["id"] = "push-company-v2"


async def ambiguous_company(stack: Stack) -> tuple[str, str]:
    """Company a-002's create landed at the remote and lost its answer: parked
    `ambiguous_remote_effect`, listed for an operator. Its link key and the object's id."""
    await stack.push("c-002")  # the company's primary contact (LANE-2)
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect")
    await eventually(
        lambda: stack.handle(key).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    [entry] = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert entry.object_id is not None
    return key, entry.object_id


async def test_g4_revalidate_link_refuses_a_fail_closed_finding_it_does_not_settle(
    stack: Stack, cli_env: dict[str, str], remote: BackgroundSandbox
) -> None:
    """G-4: the destination now addresses another remote scope (the link's remote id
    belongs to the old one). `revalidate-link` takes the active names and profile, not the
    scope: it is refused (exit 1) naming `remote_scope` and the remedy, and the link stays
    suspended, unstamped. Fails on the old main: the link came back `finalized`."""
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, remote_scope)
    await stack.push("c-001")
    before = await suspended(stack, link["link_key"])
    assert before is not None and before["suspend_reason"] == "drift:remote_scope"
    result = await _cli(cli_env, "revalidate-link", link["link_key"], *WHO)
    assert result.exit_code == 1, result.output
    assert "revalidate-link does not apply (G-4)" in result.output
    assert "remote_scope" in result.output and f"retire {link['link_key']}" in result.output
    after = await stack.link(link["link_key"])
    assert after is not None and dict(after) == dict(before)
    audit = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_operator_audit WHERE link_key = $1", link["link_key"]
    )
    assert audit == 0


async def test_g4_reconcile_refuses_an_attempt_whose_slot_the_pack_removed(
    stack: Stack, cli_env: dict[str, str], remote: BackgroundSandbox
) -> None:
    """G-4, C-9: an ambiguous company create, then a pack apply that recreates the company
    action slot under a new id. `reconcile` would finalize a link under a slot the active
    pack lacks: refused (exit 1) with the reason and the remedy; the attempt stays
    ambiguous with its evidence, no link, no mirror, no audit entry. Fails on the old main:
    a finalized link under `push-company` appeared."""
    key, object_id = await ambiguous_company(stack)
    await apply_edit(stack.pool, remote, company_slot_recreated)
    before = await stack.attempt(key)
    record = await stack.pool.fetchval(
        "SELECT fields FROM crm_record WHERE source_object = 'Account' AND record_id = 'a-002'"
    )
    args = ["reconcile", key, "--remote-id", object_id, "--evidence", "ledger", *WHO]
    result = await _cli(cli_env, *args)
    assert result.exit_code == 1, result.output
    assert "not reconciled: reconcile does not apply (G-4)" in result.output
    assert "'push-company' is not in the active install" in result.output
    assert "nothing changed" in result.output
    assert dict(await stack.attempt(key)) == dict(before)
    assert await stack.link(key) is None
    assert record == await stack.pool.fetchval(
        "SELECT fields FROM crm_record WHERE source_object = 'Account' AND record_id = 'a-002'"
    )
    audit = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_operator_audit WHERE link_key = $1", key
    )
    assert audit == 0


def company_scope_changed(doc: Doc) -> None:
    """The company destination now addresses another remote scope (fail closed)."""
    destinations: list[dict[str, Any]] = doc["destinationSlots"]
    company = next(d for d in destinations if d["id"] == "remote-companies")
    company["remoteScope"] = "other-portal"


async def test_g4_reconcile_under_a_fail_closed_finding_leaves_the_link_suspended(
    stack: Stack, cli_env: dict[str, str], remote: BackgroundSandbox
) -> None:
    """G-4 with G-6: reconcile is an ambiguous attempt's one exit, so a fail-closed finding
    other than a removed slot does not keep the attempt parked; but the link it makes is
    never left `finalized`: it is suspended at once with the findings, and the answer says
    how to go on. Fails on the old main: the link was finalized under the drift."""
    key, object_id = await ambiguous_company(stack)
    await apply_edit(stack.pool, remote, company_scope_changed)
    args = ["reconcile", key, "--remote-id", object_id, "--evidence", "ledger", *WHO]
    result = await _cli(cli_env, *args)
    assert result.exit_code == 0, result.output
    assert "the link is suspended (drift:remote_scope)" in result.output
    assert f"revalidate-link {key}" in result.output
    assert (await stack.attempt(key))["status"] == "finalized"
    link = await stack.link(key)
    assert link is not None and link["status"] == "suspended_drift"
    assert link["remote_id"] == object_id
    assert link["suspend_reason"] == "drift:remote_scope"
