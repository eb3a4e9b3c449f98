"""Must-complete workflow actions after BLOCK (ING-7): enqueue, observe, deliver, each
persisted; SUCCESS only for `processed`; 5xx retried, 401 terminal, expiry stops."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.client import WorkflowHandle

from protocol.action_callback import ActionCallbackResult, action_workflow_id
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from tests.ingress.support import (
    ACTION_ROUTE,
    ACTION_SECRET,
    Live,
    config_from,
    encode,
    execution,
    live_server,
    policy_document,
    signed_headers,
)
from tests.replay.record import keep_history
from workflows.search_attributes import NEEDS_OPERATOR

PATH = "/actions/crm"
ENDPOINT = "actions"  # the workflow-action endpoint of policy_document()
COMPLETE = "/automation/v4/actions/callbacks/*/complete"
BLOCK = {"hs_execution_state": "BLOCK", "hs_expiration_duration": "PT2H"}
SHORT_BLOCK = "44"  # must_complete with a three-second block


@pytest.fixture
async def live(stack: Stack, db_dsn: str, remote: BackgroundSandbox) -> AsyncIterator[Live]:
    document = policy_document(callback_base_url=remote.url)
    actions = document["endpoints"][2]["actions"]
    actions[SHORT_BLOCK] = {
        "policy": "must_complete",
        "block_expiration": "PT3S",
        "route": ACTION_ROUTE,
    }
    temporal = (stack.client, stack.task_queue)
    async with live_server(config_from(document), db_dsn, temporal=temporal, relay=False) as server:
        yield server


async def act(live: Live, callback_id: str, object_id: Any, action_id: int = 22) -> httpx.Response:
    document = execution(callback_id, action_id)
    if object_id is None:
        del document["object"]["objectId"]
    else:
        document["object"]["objectId"] = object_id
    body = encode(document)
    headers = signed_headers(body, PATH, secret=ACTION_SECRET)
    return await live.client.post(PATH, content=body, headers=headers)


async def outcome(live: Live, stack: Stack, callback_id: str) -> ActionCallbackResult:
    await live.ingress.background.idle()  # the start after BLOCK has happened
    handle: WorkflowHandle[Any, ActionCallbackResult] = stack.client.get_workflow_handle(
        action_workflow_id(ENDPOINT, callback_id), result_type=ActionCallbackResult
    )
    return await handle.result()


async def execution_row(pool: asyncpg.Pool, callback_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT * FROM workflow_action_execution WHERE callback_id = $1", callback_id
    )
    assert row is not None
    return row


async def finalized_remote_id(stack: Stack, record_id: str) -> int:
    await stack.push(record_id)
    link = await eventually(
        lambda: stack.link(contact_key(record_id)),
        lambda r: r is not None and r["status"] == "finalized",
    )
    return int(link["remote_id"])


def new_callback_id() -> str:
    return f"cb-{uuid.uuid4().hex}"  # workflow ids are shared by the session's server


async def test_processed_completes_success_once_after_a_5xx(live: Live, stack: Stack) -> None:
    remote_id = await finalized_remote_id(stack, "c-001")
    await stack.sandbox.add_fault(
        FaultRuleSpec(path=COMPLETE, action="status", status=503, times=1)
    )
    callback_id = new_callback_id()

    answers = [await act(live, callback_id, remote_id) for _ in range(2)]  # a duplicate delivery
    result = await outcome(live, stack, callback_id)

    assert [(a.status_code, a.json()["outputFields"]) for a in answers] == [(200, BLOCK)] * 2
    assert (result.phase, result.outcome, result.callback_status) == ("delivered", "SUCCESS", 204)
    completions = await stack.sandbox.callbacks()
    assert [(c.callback_id, c.output_fields, c.duplicate) for c in completions] == [
        (callback_id, {"hs_execution_state": "SUCCESS"}, False)
    ]
    row = await execution_row(stack.pool, callback_id)
    assert (row["phase"], row["callback_attempts"]) == ("delivered", 2)
    event = await stack.pool.fetchrow(
        "SELECT status FROM connector_event WHERE event_id = $1", row["event_id"]
    )
    assert event is not None and event["status"] == "processed"
    assert await stack.pool.fetchval("SELECT count(*) FROM workflow_action_execution") == 1
    client = stack.client
    await keep_history(
        client.get_workflow_handle(action_workflow_id(ENDPOINT, callback_id)), "action_5xx"
    )
    await keep_history(client.get_workflow_handle(f"event/{row['event_id']}"), "action_event")


@pytest.mark.parametrize(
    ("object_id", "status", "reason"),
    [(424242, "skipped", "no_finalized_link"), (None, "dead", "missing_object_id")],
)
async def test_skipped_or_dead_work_completes_fail_continue(
    live: Live, stack: Stack, object_id: int | None, status: str, reason: str
) -> None:
    callback_id = new_callback_id()

    assert (await act(live, callback_id, object_id)).status_code == 200
    result = await outcome(live, stack, callback_id)

    assert (result.phase, result.outcome) == ("delivered", "FAIL_CONTINUE")
    [completion] = await stack.sandbox.callbacks()
    assert completion.output_fields == {"hs_execution_state": "FAIL_CONTINUE"}
    row = await execution_row(stack.pool, callback_id)
    event = await stack.pool.fetchrow(
        "SELECT status, status_reason FROM connector_event WHERE event_id = $1", row["event_id"]
    )
    assert event is not None and (event["status"], event["status_reason"]) == (status, reason)


async def test_unauthorized_callback_is_terminal_and_needs_an_operator(
    live: Live, stack: Stack
) -> None:
    await stack.sandbox.add_fault(FaultRuleSpec(path=COMPLETE, action="status", status=401))
    callback_id = new_callback_id()

    assert (await act(live, callback_id, 424242)).status_code == 200
    result = await outcome(live, stack, callback_id)

    assert (result.phase, result.stop_reason, result.callback_status) == (
        "stopped",
        "callback_unauthorized",
        401,
    )
    assert result.needs_operator
    description = await stack.client.get_workflow_handle(
        action_workflow_id(ENDPOINT, callback_id)
    ).describe()
    assert description.typed_search_attributes.get(NEEDS_OPERATOR) is True
    row = await execution_row(stack.pool, callback_id)
    assert row["callback_attempts"] == 1  # never retried
    [fault] = await stack.sandbox.faults()
    assert fault.fired == 1


async def test_block_expiry_stops_and_records_it(live: Live, stack: Stack) -> None:
    await stack.sandbox.add_fault(FaultRuleSpec(path=COMPLETE, action="status", status=503))
    callback_id = new_callback_id()

    assert (await act(live, callback_id, 424242, action_id=int(SHORT_BLOCK))).status_code == 200
    result = await outcome(live, stack, callback_id)

    assert (result.phase, result.outcome, result.stop_reason) == (
        "stopped",
        "FAIL_CONTINUE",
        "expired",
    )
    assert not result.needs_operator
    row = await execution_row(stack.pool, callback_id)
    assert row["phase"] == "stopped" and row["callback_attempts"] >= 2
    assert await stack.sandbox.callbacks() == []
