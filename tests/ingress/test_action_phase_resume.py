"""Must-complete workflow actions resume from their persisted phase (issue 15; seed 004
"L2 Workflow Actions": "Result observation never repeats an accepted CRM enqueue.
Callback retry never repeats either CRM enqueue or result observation"; SPEC ING-7).

The ingress admits the execution and answers BLOCK; here no workflow is started by it
(no Temporal given). The test then performs a phase exactly as the worker's activity
does, with the same queries, and stops, as a worker killed right after it would: after
`enqueued`, and after `observed`. A fresh ActionCallbackWorkflow run for the execution
must reload the row and run only the phases still to do: one event, one callback, no
repeated enqueue or observation (its history names the activities it ran).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.common import WorkflowIDConflictPolicy

from db import inbound_queries as q
from db.ingress_queries import mark_events_started
from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    ActionCallbackInput,
    ActionCallbackResult,
    action_workflow_id,
    completion_for,
)
from protocol.inbound import INBOUND_EVENT_WORKFLOW, EventView, InboundEventInput, event_workflow_id
from protocol.states import EventStatus
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from tests.ingress.support import (
    ACTION_SECRET,
    Live,
    config_from,
    encode,
    execution,
    live_server,
    policy_document,
    signed_headers,
)

PATH = "/actions/crm"


@pytest.fixture
async def live(stack: Stack, db_dsn: str, remote: BackgroundSandbox) -> AsyncIterator[Live]:
    document = policy_document(callback_base_url=remote.url)
    async with live_server(config_from(document), db_dsn, relay=False) as server:
        yield server


async def _admitted(live: Live, stack: Stack) -> asyncpg.Record:
    """A must-complete execution for a finalized contact, admitted (BLOCK), not started."""
    await stack.push("c-001")
    link = await eventually(
        lambda: stack.link(contact_key("c-001")),
        lambda r: r is not None and r["status"] == "finalized",
    )
    assert link is not None
    callback_id = f"cb-{uuid.uuid4().hex}"
    document = execution(callback_id, 22)
    document["object"]["objectId"] = int(link["remote_id"])
    body = encode(document)
    answer = await live.client.post(
        PATH, content=body, headers=signed_headers(body, PATH, secret=ACTION_SECRET)
    )
    assert answer.json()["outputFields"]["hs_execution_state"] == "BLOCK"
    row = await stack.pool.fetchrow(
        "SELECT * FROM workflow_action_execution WHERE callback_id = $1", callback_id
    )
    assert row is not None and row["phase"] == "admitted"
    return row


async def _enqueue_then_die(stack: Stack, execution_id: str) -> str:
    """Phase 1 as `ActionCallbackActivities.enqueue` runs it: the event committed with the
    phase, then its processing started."""
    async with stack.pool.acquire() as conn:
        async with conn.transaction():
            await q.insert_execution_event(conn, execution_id)
            assert await q.mark_enqueued(conn, execution_id)
        execution = await q.select_execution(conn, execution_id)
        assert execution is not None and execution.event_id is not None
        event_id = execution.event_id
        await stack.client.start_workflow(
            INBOUND_EVENT_WORKFLOW,
            InboundEventInput(event_id=event_id),
            id=event_workflow_id(event_id),
            task_queue=stack.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        await mark_events_started(conn, [event_id])
    return event_id


async def _observe_then_die(stack: Stack, execution_id: str, event_id: str) -> None:
    """Phase 2 as `ActionCallbackActivities.observe` records it, once the event settled."""
    event = await eventually(
        lambda: q_event(stack, event_id),
        lambda e: e.status is not EventStatus.ADMITTED,
        timeout_s=30,
    )
    async with stack.pool.acquire() as conn, conn.transaction():
        assert await q.mark_observed(conn, execution_id, completion_for(event.status))


async def q_event(stack: Stack, event_id: str) -> EventView:
    async with stack.pool.acquire() as conn:
        event = await q.select_event(conn, event_id)
    assert event is not None
    return event


async def _restart(live: Live, stack: Stack, row: asyncpg.Record) -> tuple[Any, list[str]]:
    """A fresh run for the execution; its result and the activities its history ran."""
    # Ids only (S-2): the worker resolves the completion target from its own policy.
    arg = ActionCallbackInput(execution_id=str(row["execution_id"]), callback_id=row["callback_id"])
    handle = await stack.client.start_workflow(
        ACTION_CALLBACK_WORKFLOW,
        arg,
        id=action_workflow_id(row["endpoint"], row["callback_id"]),
        task_queue=stack.task_queue,
        result_type=ActionCallbackResult,
    )
    result = await handle.result()
    ran = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    return result, ran


async def _one_event_one_callback(stack: Stack, row: asyncpg.Record) -> None:
    events = await stack.pool.fetchval(
        "SELECT count(*) FROM connector_event WHERE event_id = "
        "(SELECT event_id FROM workflow_action_execution WHERE execution_id = $1)",
        row["execution_id"],
    )
    assert events == 1
    completions = await stack.sandbox.callbacks()
    assert [(c.callback_id, c.output_fields) for c in completions] == [
        (row["callback_id"], {"hs_execution_state": "SUCCESS"})
    ]


async def test_a_run_restarted_after_enqueued_observes_and_delivers_only(
    live: Live, stack: Stack
) -> None:
    row = await _admitted(live, stack)
    await _enqueue_then_die(stack, str(row["execution_id"]))
    result, ran = await _restart(live, stack, row)
    assert (result.phase, result.outcome, result.callback_status) == ("delivered", "SUCCESS", 204)
    assert "enqueue" not in ran and ran.count("observe") == 1 and ran.count("deliver") == 1
    await _one_event_one_callback(stack, row)


async def test_a_run_restarted_after_observed_delivers_only(live: Live, stack: Stack) -> None:
    row = await _admitted(live, stack)
    event_id = await _enqueue_then_die(stack, str(row["execution_id"]))
    await _observe_then_die(stack, str(row["execution_id"]), event_id)
    result, ran = await _restart(live, stack, row)
    assert (result.phase, result.outcome, result.callback_status) == ("delivered", "SUCCESS", 204)
    assert "enqueue" not in ran and "observe" not in ran and ran.count("deliver") == 1
    await _one_event_one_callback(stack, row)
