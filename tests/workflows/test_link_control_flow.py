"""LinkWorkflow's control flow on stub activities and the time-skipping server (STYLE
rule 20): the drain (WF-2, PATCH-2), the operator hold and updates (WF-1', WF-3),
parking (§5.4, REC-3), the deferred re-check (LANE-2) and the end of a run (WF-1').

A tenth of a second each, so `make check` runs them: what activities do to Postgres is the
e2e tests' subject; here only which step the workflow takes next, and when. Timers
pass by time skipping (`env.sleep`, or awaiting the result), never by real sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import JsonValue
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from protocol.messages import (
    OperatorResult,
    RecordSaved,
    RemoteEvidence,
    StepKind,
    StepResult,
)
from protocol.operator import OperatorErrorType
from protocol.states import AttemptStatus, LinkStatus, PatchStatus
from tests.workflows.link_stubs import (
    CompletionGate,
    StubActivities,
    finalized,
    latest_run_span,
    link_worker,
    new_link_key,
    published,
    save,
    time_skipping_env,
    view,
)
from workflows import search_attributes as sa
from workflows.link import ASSOCIATION_RECHECK, OPERATOR_HOLD, LinkWorkflow

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping_env() as env:
        yield env


def _json(**fields: str) -> JsonValue:
    """An update's input as the UI and the CLI send it: JSON, parsed leniently (WF-3)."""
    return {name: value for name, value in fields.items()}


@pytest.fixture
def stubs() -> StubActivities:
    return StubActivities(new_link_key())


async def test_the_drain_sends_the_create_then_each_queued_patch_in_order(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-2, POST-2, PATCH-2: writeback after the create, then every queued PATCH, one at
    a time, until none is queued; then the run completes (WF-1')."""
    key = stubs.link_key
    queued = [PatchStatus.PENDING]
    writeback = view(key, attempt_id="a1", attempt_status=AttemptStatus.WRITEBACK_PENDING)
    stubs.creates.append(StepResult(kind=StepKind.WRITEBACK_PENDING, view=writeback))
    stubs.mirrors.append(finalized(key, pending_patches=queued * 2))
    stubs.patches.append(finalized(key, pending_patches=queued))
    async with link_worker(env, stubs, task_queue):
        result = await (await save(env, task_queue, key)).result()
    assert result.reason == "done"
    assert stubs.names() == ["dispatch_create", "write_mirror", "dispatch_patch", "dispatch_patch"]


async def test_evidence_and_saves_arriving_mid_step_are_drained_evidence_first(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-2, ING-6: signals queued while a step runs are all handled, remote evidence
    first and in arrival order, then the save's step."""
    key = stubs.link_key
    gate = stubs.gate("dispatch_create")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, key)
        await gate.entered.wait()
        await handle.signal(LinkWorkflow.remote_deleted, RemoteEvidence(event_id="e1"))
        await handle.signal(LinkWorkflow.record_saved, RecordSaved(save_id="s2"))
        await handle.signal(LinkWorkflow.remote_deleted, RemoteEvidence(event_id="e2"))
        gate.release.set()
        assert (await handle.result()).reason == "done"
    assert stubs.calls == [
        ("dispatch_create", ""),
        ("apply_remote_evidence", "e1"),
        ("apply_remote_evidence", "e2"),
        ("dispatch_create", ""),
    ]


async def test_an_operator_wake_holds_the_run_open_for_its_update(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-1', WF-3: a save `for_operator` keeps a run with no work open, so the operator's
    update lands; after it the run stays OPERATOR_HOLD more (a re-run gets its answer)."""
    key = stubs.link_key
    retired = view(key, link_status=LinkStatus.RETIRED, attempt_status=AttemptStatus.FINALIZED)
    stubs.operator.append(OperatorResult(accepted=True, message="retired", view=retired))
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, key, RecordSaved(for_operator=True))
        started = await env.get_current_time()
        await stubs.called("dispatch_create")
        await env.sleep(OPERATOR_HOLD / 2)  # the step's result is in: loaded, holding
        answer = await handle.execute_update(
            LinkWorkflow.retire, _json(operator="ops", reason="gone")
        )
        assert answer.view.link_status is LinkStatus.RETIRED
        updated = await env.get_current_time()
        assert (await handle.result()).reason == "done"
        _, closed = await latest_run_span(handle)
    assert updated - started < OPERATOR_HOLD
    assert closed - updated >= OPERATOR_HOLD, "held again after the update"
    assert stubs.names() == ["dispatch_create", "apply_operator_action", "dispatch_create"]


async def test_an_operator_hold_with_no_update_ends_after_operator_hold(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-1': the hold is bounded; with no update the run completes once it passes."""
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key, RecordSaved(for_operator=True))
        assert (await handle.result()).reason == "done"
        started, closed = await latest_run_span(handle)
    assert closed - started >= OPERATOR_HOLD
    assert stubs.names() == ["dispatch_create"]


async def test_an_update_running_as_the_run_ends_is_followed_through(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-1', WF-3: a run that finds no work first lets a running update finish, then looks
    again: the work the update made (its wake, its hold) is done in this run, not lost."""
    key = stubs.link_key
    writeback = view(
        key,
        link_status=LinkStatus.FINALIZED,
        attempt_id="a1",
        attempt_status=AttemptStatus.WRITEBACK_PENDING,
    )
    stubs.creates.append(StepResult(kind=StepKind.WRITEBACK_PENDING, view=writeback))
    mirror, operator = stubs.gate("write_mirror"), stubs.gate("apply_operator_action")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, key)
        await mirror.entered.wait()
        await handle.start_update(
            LinkWorkflow.retire,
            _json(operator="ops", reason="gone"),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
        await operator.entered.wait()
        mirror.release.set()
        await published(handle, AttemptStatus.FINALIZED)  # the run waits on the update
        operator.release.set()
        assert (await handle.result()).reason == "done"
    assert stubs.names() == [
        "dispatch_create",
        "write_mirror",
        "apply_operator_action",
        "dispatch_create",
    ]


async def test_a_parked_link_waits_with_no_timer_until_reconciled(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """§5.4, WF-3, WF-4: a non-retryable step parks the run open with NeedsOperator and
    no timer; an update that does not apply is refused before any activity; reconcile
    resumes the writeback, and the closing run clears NeedsOperator."""
    key = stubs.link_key
    ambiguous = view(key, attempt_id="a1", attempt_status=AttemptStatus.AMBIGUOUS_REMOTE_EFFECT)
    stubs.creates.append(
        ApplicationError(
            "timed out after send",
            ambiguous.model_dump(mode="json"),
            type="AmbiguousRemoteEffect",
            non_retryable=True,
        )
    )
    writeback = view(key, attempt_id="a1", attempt_status=AttemptStatus.WRITEBACK_PENDING)
    reconciled = OperatorResult(accepted=True, message="reconciled", view=writeback)
    stubs.operator.append(reconciled)
    stubs.creates.append(StepResult(kind=StepKind.WRITEBACK_PENDING, view=writeback))
    operator = {"operator": "ops", "reason": "seen in the remote"}
    retire = _json(**operator)
    reconcile = _json(**operator, remote_id="r-1", evidence="GET r-1")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, key)
        await stubs.called("dispatch_create")
        await env.sleep(timedelta(days=7))
        described = await handle.describe()
        assert described.status is WorkflowExecutionStatus.RUNNING
        assert described.typed_search_attributes.get(sa.NEEDS_OPERATOR) is True
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(LinkWorkflow.retire, retire)
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.type == OperatorErrorType.REFUSED.value
        assert stubs.names() == ["dispatch_create"], "refused by the validator"
        await handle.execute_update(LinkWorkflow.reconcile, reconcile)
        assert (await handle.result()).reason == "done"
        described = await handle.describe()
    assert described.typed_search_attributes.get(sa.NEEDS_OPERATOR) is False
    assert stubs.names() == [
        "dispatch_create",
        "apply_operator_action",
        "dispatch_create",
        "write_mirror",
    ]


async def test_a_step_out_of_retries_is_parked_durably(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """REC-3: a remote step that keeps failing retries within its budget (timers skipped
    here), then `park_exhausted` makes it durable; the run stays open, parked."""
    stubs.creates.extend(ApplicationError("connection reset") for _ in range(8))
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key)
        await env.sleep(timedelta(days=1))  # the backoffs (~1.5 min in all), then no timer
        await stubs.called("park_exhausted")
        assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
        state = await handle.query(LinkWorkflow.state)
        await handle.terminate()
    assert stubs.names() == ["dispatch_create"] * 8 + ["park_exhausted"]
    assert state.link_status is LinkStatus.SUSPENDED_DRIFT


async def test_a_deferred_create_is_rechecked_periodically_and_at_once_on_a_save(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """LANE-2: a create waiting in the deferred lane keeps the run open and looks again
    every ASSOCIATION_RECHECK (a lost wake is covered), or at once when a signal comes."""
    key = stubs.link_key
    lane = {"dispatch_lane": "deferred_association", "attempt_status": AttemptStatus.PENDING}
    waiting = StepResult(kind=StepKind.WAITING, view=view(key, **lane))
    stubs.creates.extend([waiting, waiting])
    async with link_worker(env, stubs, task_queue):
        started = await env.get_current_time()
        handle = await save(env, task_queue, key)
        await stubs.called("dispatch_create")
        await env.sleep(ASSOCIATION_RECHECK / 2)
        assert stubs.names() == ["dispatch_create"], "no look before the re-check is due"
        await handle.signal(LinkWorkflow.record_saved, RecordSaved())
        await stubs.called("dispatch_create", 2)
        woken = await env.get_current_time()
        assert (await handle.result()).reason == "done"
        _, closed = await latest_run_span(handle)
    assert woken - started < ASSOCIATION_RECHECK, "the signal woke it, not the timer"
    assert closed - woken >= ASSOCIATION_RECHECK, "one periodic re-check, then finalized"
    assert stubs.names() == ["dispatch_create"] * 3


async def test_a_save_signalled_while_the_run_completes_is_drained_by_that_run(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """WF-1' (workflows/link.py, theory 3): a signal reaching the server while the run's
    completing task runs makes the server refuse the completion; the same run handles
    the save, then completes. No save is lost between runs."""
    gate = CompletionGate()
    async with link_worker(env, stubs, task_queue, interceptors=[gate]):
        handle = await save(env, task_queue, stubs.link_key)
        assert await asyncio.to_thread(gate.reached.wait, 10), "the run never returned"
        await handle.signal(LinkWorkflow.record_saved, RecordSaved(save_id="late"))
        gate.release.set()
        assert (await handle.result()).reason == "done"
        events = [event async for event in handle.fetch_history_events()]
    assert gate.released_in_time, "the signal took over 1.5 s: the premise did not hold"
    refused = [
        e.workflow_task_failed_event_attributes.cause
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert refused == [WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND]
    assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    assert stubs.names() == ["dispatch_create", "dispatch_create"], "one run, both saves"


async def test_a_patch_out_of_retries_is_listed_until_a_save_converges_it(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """REC-3: a PATCH whose retries ran out with no effect leaves the link finalized but
    behind the record; the run stays open with NeedsOperator (found by the operator's
    query), and the next save's PATCH, succeeding, clears it and ends the run."""
    key = stubs.link_key
    stubs.creates.append(finalized(key, pending_patches=[PatchStatus.PENDING]))
    stubs.patches.extend(ApplicationError("connection reset") for _ in range(8))
    failed = view(
        key,
        link_status=LinkStatus.FINALIZED,
        attempt_status=AttemptStatus.FINALIZED,
        last_patch_status=PatchStatus.FAILED,
    )
    stubs.parks.append(StepResult(kind=StepKind.PARKED, view=failed))
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, key)
        await env.sleep(timedelta(days=1))  # the backoffs, then no timer
        await stubs.called("park_exhausted")
        described = await handle.describe()
        assert described.status is WorkflowExecutionStatus.RUNNING
        assert described.typed_search_attributes.get(sa.NEEDS_OPERATOR) is True
        await handle.signal(LinkWorkflow.record_saved, RecordSaved())
        assert (await handle.result()).reason == "done"
        described = await handle.describe()
    assert described.typed_search_attributes.get(sa.NEEDS_OPERATOR) is False
    assert stubs.names()[-2:] == ["park_exhausted", "dispatch_create"], "the save's step"
