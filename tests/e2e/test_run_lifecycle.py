"""WF-1' (issue 32): a run ends when its work is done, and no signal is lost at its end.

A save's signal can reach the server while the run's last workflow task — the one
that completes it — is running. Temporal then refuses the completion (the task has
unhandled events) and delivers the signal in a new task. Here a worker interceptor
holds that task open after the run has returned, a real save is admitted and
signalled meanwhile, and only then is the completion sent: deterministic, no sleep.
(The other orders are ordinary: a signal before the task joins the drain; after the
completion, signal-with-start opens a new run — test_replay_sources.py.)

And what a clean create and a PATCH cost (NF-6): two billed actions each.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from bench.actions import billable_actions
from protocol.admission import PatchQueued
from protocol.messages import LinkWorkflowInput
from protocol.rate_limit import fairness_key_for
from sandbox.client import SandboxClient
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from worker import registry
from worker.runtime import remote_http_client
from workflows.link import LinkWorkflow

GATE_TIMEOUT_S = 30.0
# The worker takes a workflow task that runs for 2 s for a deadlock: the gate holds
# less, and one save (a transaction and one RPC) takes tens of milliseconds.
HOLD_S = 1.5


class CompletionGate(Interceptor):
    """Holds the first run's completing workflow task open until released."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self._armed = True
        self.released_in_time = False

    def hold(self) -> None:
        """Called in the workflow task, after the run returned, before the completion is
        sent (the worker runs workflow tasks in its own threads)."""
        if self._armed:
            self._armed = False
            self.reached.set()
            self.released_in_time = self.release.wait(HOLD_S)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        gate = self

        class HoldCompletion(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                result = await super().execute_workflow(input)
                gate.hold()
                return result

        return HoldCompletion


@pytest.fixture
def gate() -> CompletionGate:
    return CompletionGate()


@pytest.fixture
async def gated_stack(
    demo_db: asyncpg.Pool,
    temporal_client: Client,
    task_queue: str,
    sandbox: SandboxClient,
    gate: CompletionGate,
) -> AsyncIterator[Stack]:
    """The e2e stack's worker with the gate (unsandboxed, so the gate is this object)."""
    async with remote_http_client() as http:
        worker = Worker(
            temporal_client,
            task_queue=task_queue,
            workflows=[LinkWorkflow],
            activities=list(registry.activity_callables(demo_db, http, DispatchHooks())),
            workflow_runner=UnsandboxedWorkflowRunner(),
            interceptors=[gate],
            disable_eager_activity_execution=True,
        )
        async with worker:
            stack = Stack(demo_db, temporal_client, task_queue, sandbox)
            try:
                yield stack
            finally:
                gate.release.set()
                await stack.close()


async def test_a_save_signalled_while_the_run_completes_is_handled_by_that_run(
    gated_stack: Stack, gate: CompletionGate
) -> None:
    stack = gated_stack
    key = contact_key("c-001")
    await stack.push("c-001")
    await stack.pool.execute(  # the create's request is frozen: this is the next save's
        'UPDATE crm_record SET fields = fields || \'{"LastName": "Late"}\'::jsonb '
        "WHERE record_id = 'c-001'"
    )
    assert await asyncio.to_thread(gate.reached.wait, GATE_TIMEOUT_S), "the run never returned"
    handle = stack.handle(key)
    first = (await handle.describe()).run_id
    # The run has returned; its completion is not sent yet. A save is admitted now.
    assert isinstance(await stack.push("c-001"), PatchQueued)
    gate.release.set()

    await eventually(
        lambda: stack.pool.fetchval(
            "SELECT status FROM connector_patch_dispatch WHERE link_key = $1", key
        ),
        lambda status: status == "succeeded",
    )
    assert gate.released_in_time, f"the save took over {HOLD_S} s: the premise did not hold"
    described = await eventually(
        handle.describe, lambda d: d.status == WorkflowExecutionStatus.COMPLETED
    )
    assert described.run_id == first, "one run: the signal joined the completing run"
    events = [e async for e in handle.fetch_history_events()]
    refused = [
        e.workflow_task_failed_event_attributes.cause
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert refused == [WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND]
    activities = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(activities) == 2, "the create, then the PATCH in the same run"


async def _completed_run(stack: Stack, key: str) -> list[HistoryEvent]:
    handle = stack.handle(key)
    described = await eventually(
        handle.describe, lambda d: d.status == WorkflowExecutionStatus.COMPLETED
    )
    run = stack.client.get_workflow_handle(handle.id, run_id=described.run_id)
    return [e async for e in run.fetch_history_events()]


async def test_a_create_and_the_next_save_s_patch_are_two_runs_of_two_actions(
    stack: Stack,
) -> None:
    """Each run is signal-with-start and one activity: no upsert, no timer, and no budget
    look-up — the CRM entry starts the PATCH's run already paced, like the create's."""
    key = contact_key("c-002")
    await stack.push("c-002")
    created = await _completed_run(stack, key)
    await stack.pool.execute(
        'UPDATE crm_record SET fields = fields || \'{"LastName": "Next"}\'::jsonb '
        "WHERE record_id = 'c-002'"
    )
    assert isinstance(await stack.push("c-002"), PatchQueued)
    patched = await eventually(
        lambda: _completed_run(stack, key), lambda events: events[0] != created[0]
    )
    two = Counter(signal_with_start=1, activity=1)
    assert (billable_actions(created), billable_actions(patched)) == (two, two)
    [payload] = patched[0].workflow_execution_started_event_attributes.input.payloads
    budget = LinkWorkflowInput.model_validate_json(payload.data).budget
    assert budget is not None and (budget.fairness_key or "").startswith("rb1_")
    [scheduled] = [
        e.activity_task_scheduled_event_attributes
        for e in patched
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    # A single save spends the budget under its single-save key (NF-8).
    assert scheduled.priority.fairness_key == fairness_key_for(budget.fairness_key, bulk=False)
    patch = await stack.pool.fetchval(
        "SELECT status FROM connector_patch_dispatch WHERE link_key = $1", key
    )
    assert patch == "succeeded"
