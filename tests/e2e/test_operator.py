"""The operator CLI (SPEC WF-3): each command wakes the link, runs the update, prints the answer.

The commands run their own event loop, so they are invoked off the test's loop;
TEMPORAL_ADDRESS and CONNECTOR_PUSH_TASK_QUEUE point them at this test's server
and worker, exactly as an operator's shell would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import Result
from temporalio.service import RPCError, RPCStatusCode
from typer.testing import CliRunner

from cli.main import app
from cli.stack.temporal import TemporalDevServer
from protocol.admission import CreateReserved, DeferredAssociationReserved
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.patch_support import apply_edit, credential_ref, finalized_contact, suspended
from tests.e2e.support import eventually

WHO = ["--operator", "ops@example.com", "--reason", "incident 42"]


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


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def _ambiguous_company(stack: Stack) -> str:
    await stack.push("c-002")
    await eventually(
        lambda: stack.attempt(contact_key("c-002")), lambda r: r["status"] == "finalized"
    )
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/companies", action="reset_after_effect")
    )
    await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")
    key = company_key("a-002")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "ambiguous_remote_effect")
    return key


async def test_reconcile_finalizes_and_a_repeated_command_does_not_apply_twice(
    stack: Stack, cli_env: dict[str, str]
) -> None:
    key = await _ambiguous_company(stack)
    [entry] = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert entry.object_id is not None
    args = ["reconcile", key, "--remote-id", entry.object_id, "--evidence", "ledger", *WHO]
    first = _json(await _cli(cli_env, *args, "--json"))
    assert first["accepted"] and first["view"]["remote_id"] == entry.object_id
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert attempt["last_operator"] == "ops@example.com"
    assert attempt["last_operator_reason"] == "incident 42"
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized"
    # Same command again (a lost reply, a re-run): same update id, the first answer back.
    again = _json(await _cli(cli_env, *args, "--json"))
    assert again == first


async def test_validator_rejection_exits_1_with_the_reason(
    stack: Stack, cli_env: dict[str, str]
) -> None:
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    result = await _cli(cli_env, "supersede", key, *WHO)
    assert result.exit_code == 1
    assert "supersede does not apply: the attempt is finalized" in result.output
    assert (await stack.attempt(key))["status"] == "finalized"


async def test_supersede_after_a_422_reserves_attempt_2_which_creates(
    stack: Stack, cli_env: dict[str, str]
) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/contacts", action="status", status=422)
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed")
    await stack.sandbox.clear_faults()
    result = await _cli(cli_env, "supersede", key, *WHO)
    assert result.exit_code == 0, result.output
    assert "attempt #2 reserved" in result.output
    attempt = await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    assert attempt["attempt_ordinal"] == 2
    assert len(await stack.sandbox.ledger(object_type="contacts", kind="create")) == 1


async def test_supersede_no_reserve_leaves_the_slot_free(
    stack: Stack, cli_env: dict[str, str]
) -> None:
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/contacts", action="status", status=422)
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed")
    data = _json(await _cli(cli_env, "supersede", key, "--no-reserve", *WHO, "--json"))
    assert data["view"]["attempt_status"] == "superseded"
    count = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_push_attempt WHERE link_key = $1", key
    )
    assert count == 1


async def test_mark_terminal_closes_a_waiting_attempt_and_retire_releases_a_link(
    stack: Stack, cli_env: dict[str, str]
) -> None:
    """A company whose primary contact is not linked waits (LANE-2) in `pending`: the
    operator closes it; a finalized contact link is retired."""
    # The company's association target, contact c-001, has no link yet.
    decision = await stack.push(
        "a-001", slot="push-company", obj="Account", dest="remote-companies"
    )
    assert isinstance(decision, DeferredAssociationReserved | CreateReserved)
    key = company_key("a-001")
    assert (await stack.attempt(key))["status"] == "pending"
    data = _json(await _cli(cli_env, "mark-terminal", key, *WHO, "--json"))
    assert data["view"]["attempt_status"] == "terminal_failed"
    assert (await stack.attempt(key))["status"] == "terminal_failed"

    await stack.push("c-003")
    contact = contact_key("c-003")
    await eventually(lambda: stack.attempt(contact), lambda r: r["status"] == "finalized")
    result = await _cli(cli_env, "retire", contact, *WHO)
    assert result.exit_code == 0, result.output
    link = await stack.link(contact)
    assert link is not None and link["status"] == "retired"
    assert link["last_operator"] == "ops@example.com"


async def test_commands_start_a_closed_link_workflow(stack: Stack, cli_env: dict[str, str]) -> None:
    """No running workflow (a save admitted while Temporal was down): the command starts
    one, waits until it has loaded the link, then applies the action."""
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path="/crm/v3/objects/contacts", action="status", status=422)
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "terminal_failed")
    await stack.handle(key).terminate("simulating an idle-completed run")
    await stack.sandbox.clear_faults()
    result = await _cli(cli_env, "supersede", key, *WHO)
    assert result.exit_code == 0, result.output
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")


async def test_revalidate_link_restores_a_drift_suspended_link(
    stack: Stack, cli_env: dict[str, str], remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, credential_ref)
    await stack.push("c-001")
    await suspended(stack, link["link_key"])
    # Issue 13: a key with no rows: exit 2 before anything is woken; --operator is required.
    unknown = contact_key("never-saved")
    missing_operator = await _cli(cli_env, "revalidate-link", unknown, "--reason", "x")
    assert missing_operator.exit_code == 2 and "--operator" in missing_operator.output
    refused = await _cli(cli_env, "revalidate-link", unknown, "--reason", "x", *WHO[:2])
    assert refused.exit_code == 2, refused.output
    assert f"no link or attempt has key {unknown}; nothing was started" in refused.stderr
    with pytest.raises(RPCError) as no_workflow:
        await stack.handle(unknown).describe()
    assert no_workflow.value.status is RPCStatusCode.NOT_FOUND
    result = _json(
        await _cli(
            cli_env,
            "revalidate-link",
            link["link_key"],
            "--reason",
            "rotated on purpose",
            "--operator",
            "ops@example.com",
            "--json",
        )
    )
    assert result["view"]["link_status"] == "finalized"
    row = await stack.link(link["link_key"])
    assert row is not None and row["last_operator"] == "ops@example.com"
    assert row["last_operator_reason"] == "rotated on purpose"
