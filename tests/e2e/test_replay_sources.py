"""Scenarios whose workflow histories are committed under tests/replay/histories/.

They run in every suite as ordinary end-to-end tests. With RECORD_HISTORIES=1
they also (re)write the history files that tests/replay replays, so a change
that breaks determinism of LinkWorkflow fails CI. Each history is one whole run,
recorded once it has completed. The committed set is the 1.0 release's baseline,
recorded from the released code (SPEC VER-1; the rule after it: `workflows/link.py`,
theory of operation 5); tests/replay/histories/pre-1.0/ keeps the ones before it.
After the release a history is added, never re-recorded over: record into a new
name when a change needs its own (`RECORD_HISTORIES=1 .venv/bin/pytest
tests/e2e/test_replay_sources.py` rewrites these names).
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError

from protocol.messages import ReconcileInput, RetireInput
from sandbox.faults import FaultRuleSpec
from services.wake import wake_link
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


async def _closed(stack: Stack, key: str) -> WorkflowHandle[Any, Any]:
    """The link's newest run, once it has completed (WF-1': a clean run ends at once)."""
    handle = stack.handle(key)
    described = await eventually(
        handle.describe, lambda d: d.status == WorkflowExecutionStatus.COMPLETED
    )
    return stack.client.get_workflow_handle(handle.id, run_id=described.run_id)


async def _held(stack: Stack, key: str) -> WorkflowHandle[Any, Any]:
    """The link's run once it waits, held open for the operator after an update (it would
    close `OPERATOR_HOLD` later): no workflow task or activity pending, a timer set."""
    handle = stack.handle(key)
    await eventually(
        handle.describe,
        lambda d: (
            not d.raw_description.HasField("pending_workflow_task")
            and not d.raw_description.pending_activities
        ),
    )
    return handle


async def test_happy_path_create_then_patch_on_a_new_run(stack: Stack) -> None:
    """A clean create's run completes; the next save opens a new run whose one activity
    sends the PATCH (the create step finds the queued PATCH), and it completes too."""
    key = contact_key("c-003")
    await stack.push("c-003")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    created = await _closed(stack, key)
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"FirstName": "Ida"}\'::jsonb '
        "WHERE record_id = 'c-003'"
    )
    await stack.push("c-003")
    await _one_patch_succeeded(stack, key)
    patched = await _closed(stack, key)
    assert patched.run_id != created.run_id
    await keep_history(created, "happy_path_create")
    await keep_history(patched, "happy_path_patch")


async def test_retire_on_a_closed_link_holds_the_run_for_the_operator(stack: Stack) -> None:
    """An operator command wakes a closed link `for_operator` (the CLI does): the new run
    loads the link, waits for the update instead of ending, applies it and stays open
    for a re-run of the command."""
    key = contact_key("c-001")
    await stack.push("c-001")
    await eventually(lambda: stack.attempt(key), lambda r: r["status"] == "finalized")
    await _closed(stack, key)
    await wake_link(stack.client, stack.task_queue, key, None, for_operator=True)
    handle = stack.handle(key)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.loaded)
    request = RetireInput(operator="ops", reason="record deleted in the CRM")
    result = await handle.execute_update(LinkWorkflow.retire, request, id=f"retire/{key}")
    assert result.view.link_status == "retired"
    again = await handle.execute_update(LinkWorkflow.retire, request, id=f"retire/{key}")
    assert again == result  # a re-run after a lost reply: the first answer back
    await keep_history(await _held(stack, key), "retire_on_a_closed_link")


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
    await keep_history(await _held(stack, key), "ambiguous_then_reconcile")


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
    await keep_history(await _held(stack, key), "parked_then_reconciled_from_ui_json")
