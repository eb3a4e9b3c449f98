"""Scenarios whose workflow histories are committed under tests/replay/histories/.

They run in every suite as ordinary end-to-end tests. With RECORD_HISTORIES=1
they also (re)write the history files that tests/replay replays, so a change
that breaks determinism of LinkWorkflow fails CI. Re-record only on purpose:
`RECORD_HISTORIES=1 .venv/bin/pytest tests/e2e/test_replay_sources.py`.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowUpdateFailedError

from protocol.messages import ReconcileInput
from sandbox.faults import FaultRuleSpec
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.support import eventually
from tests.replay.record import keep_history
from workflows.link import LinkWorkflow


async def _one_patch_succeeded(stack: Stack, key: str) -> None:
    await eventually(
        lambda: stack.pool.fetchval(
            "SELECT count(*) FROM connector_patch_dispatch WHERE link_key = $1 "
            "AND status = 'succeeded'",
            key,
        ),
        lambda n: n == 1,
    )


async def test_happy_path_then_patch(stack: Stack) -> None:
    key = contact_key("c-001")
    await stack.push("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await stack.push("c-001")
    await _one_patch_succeeded(stack, key)
    await keep_history(stack.handle(key), "happy_path_then_patch")


async def test_born_patched_create_then_patch_in_one_activity(stack: Stack) -> None:
    """Issue 16: a run born with its changes (no patch markers) whose PATCH is sent by the
    create step's activity; the older shape stays in happy_path_then_patch."""
    key = contact_key("c-003")
    await stack.push("c-003")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"FirstName": "Ida"}\'::jsonb '
        "WHERE record_id = 'c-003'"
    )
    await stack.push("c-003")
    await _one_patch_succeeded(stack, key)
    handle = stack.handle(key)
    await eventually(
        handle.describe, lambda d: not d.raw_description.HasField("pending_workflow_task")
    )
    await keep_history(handle, "born_patched_create_then_patch")


async def test_ambiguous_then_reconcile(stack: Stack) -> None:
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
    [created] = await stack.sandbox.ledger(object_type="companies", kind="create")
    assert created.object_id is not None
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.reconcile,
        ReconcileInput(
            operator="ops",
            reason="found it",
            remote_id=created.object_id,
            evidence="sandbox ledger entry",
        ),
        id="reconcile-1",
    )
    assert result.view.link_status == "finalized"
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await keep_history(handle, "ambiguous_then_reconcile_parked_open")


async def test_parked_then_reconciled_from_ui_json(stack: Stack) -> None:
    """OPS-1 and the UI repair path: static attributes at start, only changed values
    upserted, a refused update (bad JSON) and a reconcile sent as the UI sends it."""
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
    [created] = await stack.sandbox.ledger(object_type="companies", kind="create")
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("reconcile", {"operator": "ops"}, id="ui-bad")
    data = {"operator": "ops", "reason": "found", "remote_id": created.object_id, "evidence": "e"}
    await handle.execute_update("reconcile", data, id="ui-reconcile")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await keep_history(handle, "parked_then_reconciled_from_ui_json")
