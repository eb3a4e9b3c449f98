"""Workflow-action callback completions: recorded, batchable, and fault-injectable."""

from __future__ import annotations

import httpx

from sandbox.client import SandboxClient
from sandbox.faults import FaultRuleSpec

CALLBACKS = "/automation/v4/actions/callbacks"
SUCCESS = {"outputFields": {"hs_execution_state": "SUCCESS"}}


async def test_completion_is_204_and_recorded(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    answer = await http.post(f"{CALLBACKS}/cb-1/complete", json=SUCCESS)

    assert answer.status_code == 204
    [completion] = await sandbox.callbacks()
    assert completion.callback_id == "cb-1"
    assert completion.output_fields == {"hs_execution_state": "SUCCESS"}
    assert (completion.batch, completion.duplicate) == (False, False)


async def test_batch_completion_records_each_input_and_flags_duplicates(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    inputs = [
        {"callbackId": "cb-2", "outputFields": {"hs_execution_state": "SUCCESS"}},
        {"callbackId": "cb-3", "outputFields": {"hs_execution_state": "FAIL_CONTINUE"}},
    ]
    await http.post(f"{CALLBACKS}/cb-2/complete", json=SUCCESS)

    answer = await http.post(f"{CALLBACKS}/complete", json={"inputs": inputs})

    assert answer.status_code == 204
    received = [(c.callback_id, c.batch, c.duplicate) for c in await sandbox.callbacks()]
    assert received == [("cb-2", False, False), ("cb-2", True, True), ("cb-3", True, False)]


async def test_malformed_completion_is_400_and_not_recorded(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    single = await http.post(f"{CALLBACKS}/cb-4/complete", json={"state": "SUCCESS"})
    batch = await http.post(f"{CALLBACKS}/complete", json={"inputs": [{"outputFields": {}}]})

    assert (single.status_code, batch.status_code) == (400, 400)
    assert await sandbox.callbacks() == []


async def test_completion_can_be_fault_injected_then_succeeds(
    sandbox: SandboxClient, http: httpx.AsyncClient
) -> None:
    await sandbox.add_fault(
        FaultRuleSpec(path=f"{CALLBACKS}/*/complete", action="status", status=503, times=1)
    )

    failed = await http.post(f"{CALLBACKS}/cb-5/complete", json=SUCCESS)
    completed = await http.post(f"{CALLBACKS}/cb-5/complete", json=SUCCESS)

    assert (failed.status_code, completed.status_code) == (503, 204)
    assert [c.callback_id for c in await sandbox.callbacks()] == ["cb-5"]
