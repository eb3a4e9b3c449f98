"""Drift on the PATCH path through the workflow (SPEC DRIFT-2, WF-3 revalidate): a
fail-closed change suspends and sends nothing, a benign one PATCHes and records its
findings, and revalidate restores a suspended link."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from temporalio.client import WorkflowUpdateFailedError

from protocol.admission import PatchQueued, Rejected
from protocol.errors import RejectReason
from protocol.messages import RevalidateInput
from sandbox.server import BackgroundSandbox
from services.wake import wake_link
from tests.e2e.conftest import Stack
from tests.e2e.patch_support import (
    Doc,
    action_rename,
    apply_edit,
    base_url,
    credential_ref,
    endpoint_class,
    finalized_contact,
    flow_version,
    mapping_rows,
    patches,
    reinstall,
    remote_scope,
    retry_policy,
    revalidate_owner_now,
    settled,
    suspended,
    target_new_slot,
    update_path,
)
from tests.e2e.support import eventually
from workflows.link import LinkWorkflow


@pytest.mark.parametrize(
    ("edit", "reinstalled", "surface"),
    [
        pytest.param(reinstall, True, "pack_install", id="install-changed"),
        pytest.param(credential_ref, False, "credential_ref", id="credential-ref"),
        pytest.param(endpoint_class, False, "endpoint", id="endpoint-class"),
        pytest.param(base_url, False, "endpoint", id="base-url"),
        pytest.param(update_path, False, "update_path", id="update-path"),
        pytest.param(mapping_rows, False, "mapping", id="mapping-rows"),
        pytest.param(target_new_slot, False, "target_new_slot", id="target-new-destination-slot"),
        pytest.param(remote_scope, False, "remote_scope", id="remote-scope"),
    ],
)
async def test_fail_closed_drift_suspends_and_sends_nothing(
    stack: Stack,
    remote: BackgroundSandbox,
    edit: Callable[[Doc], None],
    reinstalled: bool,
    surface: str,
) -> None:
    """DRIFT-2; issue 14 item 7: `suspend_reason` names the surface (`drift:endpoint`)."""
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, edit, reinstall=reinstalled)
    decision = await stack.push("c-001")
    assert isinstance(decision, Rejected) and decision.reason is RejectReason.DRIFT_FAIL_CLOSED
    row = await suspended(stack, link["link_key"])
    assert row is not None and row["suspend_reason"] == f"drift:{surface}"
    findings = json.loads(row["drift_findings"])
    assert any(f["disposition"] == "fail_closed" for f in findings)
    if edit is base_url:  # the binding that changed, not "objects-api -> objects-api"
        (endpoint,) = [f for f in findings if f["surface"] == "endpoint"]
        assert endpoint["detail"] == "base URL " + remote.url + " -> http://127.0.0.1:9"
    view = await eventually(
        lambda: stack.handle(link["link_key"]).query(LinkWorkflow.state), lambda v: v.needs_operator
    )
    assert view.suspend_reason == f"drift:{surface}"
    assert await patches(stack) == []


@pytest.mark.parametrize("edit", [flow_version, action_rename, retry_policy])
async def test_benign_drift_patches_and_records_findings(
    stack: Stack, remote: BackgroundSandbox, edit: Callable[[Doc], None]
) -> None:
    """Benign surfaces PATCH once the new install is revalidated (C-4, P-10: an apply is a
    new install, and the link fails closed until then; test_install_fail_closed.py)."""
    link = await finalized_contact(stack)
    await apply_edit(stack.pool, remote, edit)
    await revalidate_owner_now(stack.pool)
    decision = await stack.push("c-001")
    assert isinstance(decision, PatchQueued), decision
    rows = await settled(stack, link["link_key"])
    assert [r["status"] for r in rows] == ["succeeded"]
    row = await stack.link(link["link_key"])
    assert row is not None and row["status"] == "finalized"
    assert json.loads(row["drift_findings"]), "benign findings are recorded"
    assert len(await patches(stack)) == 1


async def test_revalidate_restores_a_suspended_link_and_rejects_a_finalized_one(
    stack: Stack, remote: BackgroundSandbox
) -> None:
    link = await finalized_contact(stack)
    handle = stack.handle(link["link_key"])
    # The clean run has closed (WF-1'): wake it for the update, as the CLI does.
    await wake_link(stack.client, stack.task_queue, link["link_key"], None, for_operator=True)
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.loaded)
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(
            LinkWorkflow.revalidate, RevalidateInput(operator="op", reason="not suspended")
        )
    await apply_edit(stack.pool, remote, credential_ref)
    await stack.push("c-001")
    await suspended(stack, link["link_key"])
    await eventually(lambda: handle.query(LinkWorkflow.state), lambda v: v.needs_operator)
    result = await handle.execute_update(
        LinkWorkflow.revalidate, RevalidateInput(operator="op", reason="credential rotated")
    )
    assert result.view.link_status == "finalized"
    row = await stack.link(link["link_key"])
    assert row is not None and row["credential_ref"] == "env:OTHER_TOKEN"
    assert row["last_operator"] == "op"
    assert isinstance(await stack.push("c-001"), PatchQueued)
    await settled(stack, link["link_key"])
    assert len(await patches(stack)) == 1
