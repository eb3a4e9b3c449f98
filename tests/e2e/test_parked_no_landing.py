"""A parked create whose journal later proves that no try landed (SPEC §17 G-6, JRN-1,
C-1): `links show`, the workflow's details in the UI and the remedy say so and name the
migration policy, and the attempt stays `ambiguous_remote_effect` with its evidence.

The product reaches the state by itself: the remote refuses the first POST (400), but
the try that sent it outlives its activity's timeout before it applies the answer (the
activity is failed by task token, which is what the server does at start-to-close), so
the retry finds an unanswered try and parks the attempt ambiguous (REC-1). The late
try's answer is then recorded (its claim is gone: it moves nothing) and proves it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from typer.testing import CliRunner

from cli.main import app
from protocol.admission import ObservedActiveAttempt
from protocol.landing import PROOF
from sandbox.faults import FaultRuleSpec
from services.dispatch_hooks import DispatchHooks
from tests.e2e.conftest import Stack, company_key, contact_key
from tests.e2e.create_faults_support import COMPANIES, creates, status_of
from tests.e2e.create_faults_support import rig as rig  # the fixture
from tests.e2e.rig import Rig
from tests.e2e.support import eventually

# The stopping worker lets the held try run to its end (it records the late answer).
LONG_DRAIN = timedelta(seconds=10)


class LateAnswerHooks(DispatchHooks):
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
            await self.release.wait()


def _links_show(key: str, dsn: str) -> Any:
    result = CliRunner().invoke(app, ["links", "show", key, "--json", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def _details(handle: WorkflowHandle[Any, Any]) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(metadata.current_details)


async def _parked_with_an_unanswered_try(rig: Rig, hooks: LateAnswerHooks) -> str:
    """a-002's first POST is refused, but its try is failed before it applies the answer:
    the retry parks the attempt ambiguous. The key."""
    stack = rig.stack
    await rig.start_worker()
    await stack.push("c-002")  # the company's association target, finalized first
    await status_of(stack, contact_key("c-002"), "finalized")
    await rig.stop_worker()
    await rig.start_worker(hooks, graceful=LONG_DRAIN)
    await stack.sandbox.add_fault(
        FaultRuleSpec(method="POST", path=COMPANIES, action="status", status=400, times=1)
    )
    await _push_company(stack)
    await asyncio.wait_for(hooks.held.wait(), timeout=30)
    assert hooks.task_token is not None
    await stack.client.get_async_activity_handle(task_token=hooks.task_token).fail(
        RuntimeError("simulated start-to-close timeout of the answered try")
    )
    key = company_key("a-002")
    await status_of(stack, key, "ambiguous_remote_effect")
    return key


async def _push_company(stack: Stack) -> object:
    return await stack.push("a-002", slot="push-company", obj="Account", dest="remote-companies")


async def test_a_late_refusal_proves_no_landing_on_every_surface(rig: Rig, db_dsn: str) -> None:
    """G-6: before the late answer the journal proves nothing and the remedy is to find
    the object and reconcile; after it, all three surfaces say no try landed and name the
    migration policy; the attempt is still parked, its journal kept, nothing re-sent."""
    stack = rig.stack
    hooks = LateAnswerHooks()
    key = await _parked_with_an_unanswered_try(rig, hooks)
    handle = stack.handle(key)
    parked = await eventually(lambda: _details(handle), lambda d: "reconcile" in d)
    assert "no try landed" not in parked and "Find the object" in parked
    before = await asyncio.to_thread(_links_show, key, db_dsn)
    assert before["attempt_landing"] == "may_have_landed"
    assert "Find the object" in before["remedy"]

    hooks.release.set()
    await rig.stop_worker()  # drains: the held try applies its answer, too late
    [attempt] = (await asyncio.to_thread(_links_show, key, db_dsn))["attempts"]
    assert attempt["status"] == "ambiguous_remote_effect"  # no new transition (seed)
    tries = [(t["outcome"], t["status"], t["may_have_landed"]) for t in attempt["send_journal"]]
    assert tries == [("answered", 400, False)]  # the evidence, kept
    assert await creates(stack, "companies") == []

    shown = await asyncio.to_thread(_links_show, key, db_dsn)
    assert shown["park_reason"] == "ambiguous_remote_effect"
    assert shown["attempt_landing"] == "proved_not_landed"
    assert PROOF[1:] in shown["remedy"] and "Find the object" not in shown["remedy"]
    assert "migration policy" in shown["remedy"] and "rebind" in shown["remedy"]
    assert shown["remedy_actions"] == ["reconcile"]
    assert f"links show {key}" in shown["remedy_evidence"]

    # The parked run reads Postgres again when it is next woken (here the record's next
    # save, which observes the active attempt and sends nothing).
    await rig.start_worker()
    assert isinstance(await _push_company(stack), ObservedActiveAttempt)
    details = await eventually(lambda: _details(handle), lambda d: "no try landed" in d)
    assert f"**no try landed**: {PROOF}" in details
    assert "migration policy" in details and "Find the object" not in details
    assert "Send an Update → pick `reconcile`" in details
    assert (await stack.attempt(key))["status"] == "ambiguous_remote_effect"
    assert await creates(stack, "companies") == []
