"""G-8, WF-1: a LinkWorkflow run that continues as new carries every queued signal and
evidence item, on stub activities and the time-skipping server (STYLE rule 20).

The run's one continue-as-new trigger is the server's suggestion (`workflow.info()
.is_continue_as_new_suggested()`); here it answers as a server with a history limit of
one workflow task would (`suggested_after_the_first_task`), so the first run continues
as new as soon as its first step returns. Each signal is sent while that step is held
open, so it is queued, not yet handled, when the run continues.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from protocol.messages import RecordSaved, RemoteEvidence
from protocol.rate_limit import remote_priority_key
from tests.workflows.link_stubs import (
    LinkHandle,
    StubActivities,
    latest_run_span,
    link_worker,
    new_link_key,
    save,
    suggested_after_the_first_task,
    time_skipping_env,
)
from workflows.link import OPERATOR_HOLD, LinkWorkflow

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping_env() as env:
        yield env


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> StubActivities:
    monkeypatch.setattr(
        workflow.Info, "is_continue_as_new_suggested", suggested_after_the_first_task
    )
    return StubActivities(new_link_key())


async def _continued(env: WorkflowEnvironment, handle: LinkHandle) -> bool:
    """Whether the run `handle` started continued as new (rather than completing)."""
    first = env.client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    return (await first.describe()).status is WorkflowExecutionStatus.CONTINUED_AS_NEW


async def test_queued_remote_deleted_evidence_is_carried_across_continue_as_new(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """G-8, ING-6: remote evidence queued when the run continues as new is applied by
    the next run, before its first step (it was dropped: the link stayed unsuspended)."""
    gate = stubs.gate("dispatch_create")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key)
        await gate.entered.wait()
        await handle.signal(LinkWorkflow.remote_deleted, RemoteEvidence(event_id="gone-1"))
        await handle.signal(LinkWorkflow.remote_deleted, RemoteEvidence(event_id="gone-2"))
        gate.release.set()
        assert (await handle.result()).reason == "done"
        assert await _continued(env, handle)
    assert stubs.calls == [
        ("dispatch_create", ""),
        ("apply_remote_evidence", "gone-1"),
        ("apply_remote_evidence", "gone-2"),
        ("dispatch_create", ""),
    ]


async def test_a_queued_save_is_drained_by_the_run_continued_as_new(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """G-8, WF-2: a save signalled during the last step before continue-as-new is looked
    for by the next run (every run starts woken)."""
    gate = stubs.gate("dispatch_create")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key)
        await gate.entered.wait()
        await handle.signal(LinkWorkflow.record_saved, RecordSaved(save_id="s2"))
        gate.release.set()
        assert (await handle.result()).reason == "done"
        assert await _continued(env, handle)
    assert stubs.names() == ["dispatch_create", "dispatch_create"]


async def test_a_queued_operator_wake_holds_the_run_continued_as_new(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """G-8, WF-1', WF-3: an operator command's wake queued at continue-as-new still holds
    the next run open OPERATOR_HOLD for its update (it ended at once: the update failed)."""
    gate = stubs.gate("dispatch_create")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key)
        await gate.entered.wait()
        await handle.signal(LinkWorkflow.record_saved, RecordSaved(for_operator=True))
        gate.release.set()
        assert (await handle.result()).reason == "done"
        assert await _continued(env, handle)
        started, closed = await latest_run_span(handle)
    assert closed - started >= OPERATOR_HOLD
    assert stubs.names() == ["dispatch_create", "dispatch_create"]


async def test_bulk_saves_keep_their_priority_across_continue_as_new(
    env: WorkflowEnvironment, stubs: StubActivities, task_queue: str
) -> None:
    """G-8, NF-8: a run woken only by bulk saves keeps their lower priority for its remote
    steps after continue-as-new (it jumped ahead of single saves)."""
    gate = stubs.gate("dispatch_create")
    async with link_worker(env, stubs, task_queue):
        handle = await save(env, task_queue, stubs.link_key, RecordSaved(bulk=True))
        await gate.entered.wait()
        await handle.signal(LinkWorkflow.record_saved, RecordSaved(bulk=True))
        gate.release.set()
        assert (await handle.result()).reason == "done"
        assert await _continued(env, handle)
    assert stubs.priorities == [remote_priority_key(True)] * 2
