"""Create-path faults end to end: the ledger never shows a second create (SPEC REC-1..3,
POST-1..4, WF-3, WF-4): ambiguity, restarts, zombie tries, resets and crashes.

Real Postgres, a real Temporal server and the sandbox remote over HTTP. Workers
are started and stopped by the test (`Rig`), so a crash or a deploy in the middle
of an activity is a real worker shutdown, not a simulation. (Definite rejections,
the mirror, source deletion and ID-4 are in test_create_definite_outcomes.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import WorkflowHandle

from protocol.admission import CreateReserved, ObservedActiveAttempt
from protocol.messages import ReconcileInput
from sandbox.faults import FaultRuleSpec
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.create_faults_support import (
    COMPANIES,
    CONTACTS,
    creates,
    parked_ids,
    record_fields,
    status_of,
)
from tests.e2e.create_faults_support import rig as rig  # the fixture
from tests.e2e.rig import Rig, SteerableHooks
from tests.e2e.support import eventually
from worker.crm import workflow_id
from workflows.link import LinkWorkflow

# The zombie test drains its worker on stop, so the stalled try runs to its end.
LONG_DRAIN = timedelta(seconds=10)
FINISHED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
}


async def _push_company(stack: Stack, record_id: str) -> object:
    return await stack.push(record_id, slot="push-company", obj="Account", dest="remote-companies")


async def _contact_linked(stack: Stack, record_id: str) -> asyncpg.Record:
    """Create-inline associations need their target finalized first (else LANE-2 defers)."""
    await stack.push(record_id)
    return await status_of(stack, contact_key(record_id), "finalized")


async def _finished_since_last_signal(handle: WorkflowHandle[object, object]) -> int:
    """Activities that finished after the newest `record_saved` signal in the current run."""
    events = [e async for e in handle.fetch_history_events()]
    signals = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    start = signals[-1] if signals else 0
    return sum(1 for e in events[start:] if e.event_type in FINISHED)


# -- ambiguity, restart, reconcile ------------------------------------------------------


async def test_ambiguous_create_is_visible_survives_restart_and_reconciles(rig: Rig) -> None:
    """reset_after_effect on a profile without idempotency: parked, found with a visibility
    query; a new worker and a new save POST nothing; an operator's reconcile finalizes."""
    stack = rig.stack
    await rig.start_worker()
    await _contact_linked(stack, "c-002")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="reset_after_effect")
    )
    assert isinstance(await _push_company(stack, "a-002"), CreateReserved)
    key = company_key("a-002")
    await status_of(stack, key, "ambiguous_remote_effect")
    ids = await eventually(lambda: parked_ids(stack.client, key), lambda ids: bool(ids))
    assert ids == [workflow_id(key)]
    assert len(await creates(stack, "companies")) == 1

    await rig.stop_worker()
    await rig.start_worker()
    assert isinstance(await _push_company(stack, "a-002"), ObservedActiveAttempt)
    # The new worker handled the save's wake-up (a dispatch ran and found the parked attempt).
    await eventually(lambda: _finished_since_last_signal(stack.handle(key)), lambda n: n >= 1)
    [remote_id] = await creates(stack, "companies")
    assert remote_id is not None

    result = await stack.handle(key).execute_update(
        LinkWorkflow.reconcile,
        ReconcileInput(
            operator="ops@example.com",
            reason="found in the remote's ledger",
            remote_id=remote_id,
            evidence=f"sandbox ledger create {remote_id}",
        ),
    )
    assert result.accepted and result.view.remote_id == remote_id
    attempt = await status_of(stack, key, "finalized")
    link = await stack.link(key)
    assert link is not None and link["status"] == "finalized" and link["remote_id"] == remote_id
    assert attempt["mirror_status"] == "written" and attempt["last_operator"] == "ops@example.com"
    assert f'"remote_id__c": "{remote_id}"' in await record_fields(stack, "Account", "a-002")
    assert await creates(stack, "companies") == [remote_id]
    await eventually(lambda: parked_ids(stack.client, key), lambda ids: ids == [])


# -- fencing: zombie tries, resets, crashes ---------------------------------------------


async def test_zombie_try_loses_its_claim_and_sends_nothing(rig: Rig) -> None:
    """REC-1: the first try stalls after its claim; Temporal moves on (here: the try is
    failed by task token, which is what a start-to-close timeout does on the server); the
    retry re-claims with a fresh token and POSTs; the released zombie's checkpoint CAS fails.

    Companies have no idempotency key and no locator: a second POST from the zombie
    would be a second object in the ledger, so exactly one entry means it sent nothing."""
    stack = rig.stack
    await rig.start_worker()
    await _contact_linked(stack, "c-002")  # the company's association target
    await rig.stop_worker()
    hooks = SteerableHooks(hold_first=True)
    await rig.start_worker(hooks, graceful=LONG_DRAIN)
    await _push_company(stack, "a-002")
    key = company_key("a-002")
    await asyncio.wait_for(hooks.held.wait(), timeout=30)
    stalled = await stack.attempt(key)
    assert stalled["status"] == "processing" and stalled["remote_io_started_at"] is None
    assert hooks.held_task_token is not None
    await stack.client.get_async_activity_handle(task_token=hooks.held_task_token).fail(
        RuntimeError("simulated start-to-close timeout of the stalled try")
    )
    attempt = await status_of(stack, key, "finalized")
    assert attempt["claim_token"] != stalled["claim_token"] and hooks.tries == 2

    hooks.release.set()
    await rig.stop_worker()  # drains: returns once the zombie try has run to its end
    assert (await stack.attempt(key))["status"] == "finalized"
    assert await creates(stack, "companies") == [attempt["remote_id"]]


class AnswerHoldingHooks(DispatchHooks):
    """The first try waits after its POST was answered, recording its task token."""

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.task_token: bytes | None = None
        self.answers = 0

    async def after_answer(self, attempt_id: str) -> None:
        self.answers += 1
        if self.answers == 1:
            self.task_token = activity.info().task_token
            self.held.set()
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    # A stalled try sees no cancellation: the server's failure of its task
                    # token reaches the worker at the try's next heartbeat, which a try
                    # held here (unlike the one it stands for) would still send. Held as
                    # the stalled one would be, so the test does not turn on that timing.
                    task = asyncio.current_task()
                    assert task is not None
                    task.uncancel()


async def test_a_late_answer_keeps_its_remote_id_in_the_journal(rig: Rig) -> None:
    """JRN-1, seed "After POST" 1 (persist the extracted remote id): the first try's POST
    landed, but the try outlived its timeout (failed by task token, as the server does)
    before it applied the answer; the retry finds the try may have landed and parks the
    attempt ambiguous. When the late 201 is applied, its claim is gone so it finalizes
    nothing, but the journal keeps the outcome and the remote id for the reconcile."""
    stack = rig.stack
    await rig.start_worker()
    await _contact_linked(stack, "c-002")  # the company's association target
    await rig.stop_worker()
    hooks = AnswerHoldingHooks()
    await rig.start_worker(hooks, graceful=LONG_DRAIN)
    await _push_company(stack, "a-002")
    key = company_key("a-002")
    await asyncio.wait_for(hooks.held.wait(), timeout=30)
    [remote_id] = await creates(stack, "companies")
    assert hooks.task_token is not None
    await stack.client.get_async_activity_handle(task_token=hooks.task_token).fail(
        RuntimeError("simulated start-to-close timeout of the answered try")
    )
    parked = await status_of(stack, key, "ambiguous_remote_effect")
    assert parked["remote_id"] is None

    hooks.release.set()
    await rig.stop_worker()  # drains: returns once the late try has run to its end
    tries = await stack.pool.fetch(
        "SELECT outcome, status, remote_id FROM connector_send_journal "
        "WHERE attempt_id = $1 ORDER BY journal_id",
        parked["attempt_id"],
    )
    assert [tuple(t) for t in tries] == [("answered", 201, remote_id)]
    assert (await stack.attempt(key))["status"] == "ambiguous_remote_effect"
    assert await creates(stack, "companies") == [remote_id]


async def test_workflow_reset_to_before_the_post_sends_no_second_create(rig: Rig) -> None:
    """An operator resets a finalized link's workflow to its first workflow task (before
    the POST): the re-run dispatch reads Postgres and finds nothing to send."""
    stack = rig.stack
    await rig.start_worker()
    await stack.push("c-001")
    key = contact_key("c-001")
    attempt = await status_of(stack, key, "finalized")
    handle = stack.handle(key)
    events = [e async for e in handle.fetch_history_events()]
    first_task = next(
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    run_id = (await handle.describe()).run_id
    response = await stack.client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=stack.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id(key), run_id=run_id),
            reason="operator reset from the UI",
            workflow_task_finish_event_id=first_task,
            request_id=str(uuid.uuid4()),
        )
    )
    reset = stack.client.get_workflow_handle(workflow_id(key), run_id=response.run_id)

    async def dispatches_in_new_run() -> int:
        events = [e async for e in reset.fetch_history_events()]
        return sum(
            1 for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        )

    await eventually(dispatches_in_new_run, lambda n: n >= 1)
    assert (await stack.attempt(key))["status"] == "finalized"
    assert await creates(stack, "contacts") == [attempt["remote_id"]]


async def test_worker_crash_while_post_hangs_after_effect_parks_plain_profile(rig: Rig) -> None:
    """The worker dies after RemoteIOStartedAt and the remote's effect, before the
    response: the new worker finds the checkpoint and parks (no idempotency declared)."""
    stack = rig.stack
    await rig.start_worker()
    await _contact_linked(stack, "c-002")
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, nth=1, action="hang_after_effect")
    )
    await _push_company(stack, "a-002")
    key = company_key("a-002")
    await eventually(lambda: creates(stack, "companies"), lambda c: len(c) == 1)
    assert (await stack.attempt(key))["remote_io_started_at"] is not None

    await rig.stop_worker()
    await rig.start_worker()
    attempt = await status_of(stack, key, "ambiguous_remote_effect")
    assert attempt["retry_count"] == 0  # nobody claimed it again
    assert len(await creates(stack, "companies")) == 1


async def test_worker_crash_while_post_hangs_after_effect_resends_idempotent_profile(
    rig: Rig,
) -> None:
    """Same crash on a profile with replay-safe idempotency: the new worker re-sends the
    same frozen request with the same key; the remote replays; one object, finalized."""
    stack = rig.stack
    await rig.start_worker()
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=CONTACTS, nth=1, action="hang_after_effect")
    )
    await stack.push("c-001")
    key = contact_key("c-001")
    await eventually(lambda: creates(stack, "contacts"), lambda c: len(c) == 1)

    await rig.stop_worker()
    await rig.start_worker()
    attempt = await status_of(stack, key, "finalized")
    entries = await stack.sandbox.ledger(object_type="contacts", kind="create")
    assert [e.replayed for e in entries] == [False, True]
    assert {e.object_id for e in entries} == {attempt["remote_id"]}
    assert len({e.idempotency_key for e in entries}) == 1


async def test_worker_crash_before_checkpoint_posts_exactly_once(rig: Rig) -> None:
    """The worker dies between the claim and RemoteIOStartedAt: nothing was sent, so the
    new worker re-claims with a fresh token and POSTs exactly once (plain profile: the
    claim and the checkpoint are separate writes)."""
    stack = rig.stack
    await rig.start_worker()
    await _contact_linked(stack, "c-002")
    await rig.stop_worker()
    hooks = SteerableHooks(hold_first=True)
    await rig.start_worker(hooks)
    await _push_company(stack, "a-002")
    key = company_key("a-002")
    await asyncio.wait_for(hooks.held.wait(), timeout=30)
    stalled = await stack.attempt(key)
    assert stalled["status"] == "processing" and stalled["remote_io_started_at"] is None

    await rig.stop_worker()
    await rig.start_worker()
    attempt = await status_of(stack, key, "finalized")
    assert attempt["claim_token"] != stalled["claim_token"]
    assert await creates(stack, "companies") == [attempt["remote_id"]]


async def test_claim_and_checkpoint_are_one_write_only_where_a_late_send_is_harmless(
    rig: Rig,
) -> None:
    """REC-1 cost model: contacts replay an Idempotency-Key, so their claim writes the
    checkpoint too (one transaction fewer); companies have neither an idempotency key
    nor a locator, so their checkpoint is a separate compare-and-set after the claim."""
    stack = rig.stack
    await rig.start_worker()
    contact = await _contact_linked(stack, "c-002")
    await _push_company(stack, "a-002")
    company = await status_of(stack, company_key("a-002"), "finalized")
    assert contact["remote_io_started_at"] == contact["claimed_at"]
    assert company["remote_io_started_at"] > company["claimed_at"]
