"""SPEC S-2: nothing that reaches a workflow from outside chooses where the worker sends a
credential, and a signal's ids are checked against Postgres before the worker acts.

Real ingress, Postgres, Temporal with the stack's worker, the sandbox remote as the
configured completion target, and a second local HTTP listener standing for an
attacker's URL: anyone who can start a workflow in the namespace (the Web UI, `temporal
workflow start`) may put it in the callback workflow's input.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from temporalio.client import WorkflowExecutionStatus

from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    ActionCallbackInput,
    ActionCallbackResult,
    CallbackTarget,
    action_workflow_id,
)
from protocol.identity import LINK_WORKFLOW_TYPE, link_workflow_id
from protocol.inbound import REMOTE_DELETED_SIGNAL
from protocol.messages import LinkWorkflowInput, RemoteEvidence
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import Stack, contact_key
from tests.e2e.support import eventually
from tests.ingress.support import (
    ACTION_SECRET,
    config_from,
    encode,
    execution,
    live_server,
    policy_document,
    signed_headers,
)

PATH = "/actions/crm"
ENDPOINT = "actions"  # the workflow-action endpoint of policy_document()
FAIL_CONTINUE = {"hs_execution_state": "FAIL_CONTINUE"}


@dataclass
class Listener:
    """A plain HTTP listener that records every request head it is sent (answers 204)."""

    url: str = ""
    heads: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


@pytest.fixture
async def foreign() -> AsyncIterator[Listener]:
    listener = Listener()
    server = await asyncio.start_server(listener.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    listener.url = f"http://127.0.0.1:{port}"
    async with server:
        yield listener


async def admitted_execution(db_dsn: str, remote: BackgroundSandbox, pool: asyncpg.Pool) -> Any:
    """A must-complete execution the ingress admitted (BLOCK) and started no workflow for
    (no Temporal given): its object has no link, so its work ends skipped."""
    callback_id = f"cb-{uuid.uuid4().hex}"
    document = execution(callback_id, 22)
    document["object"]["objectId"] = 424242
    body = encode(document)
    config = config_from(policy_document(callback_base_url=remote.url))
    async with live_server(config, db_dsn, relay=False) as live:
        headers = signed_headers(body, PATH, secret=ACTION_SECRET)
        answer = await live.client.post(PATH, content=body, headers=headers)
    assert answer.json()["outputFields"]["hs_execution_state"] == "BLOCK"
    row = await pool.fetchrow(
        "SELECT * FROM workflow_action_execution WHERE callback_id = $1", callback_id
    )
    assert row is not None and row["phase"] == "admitted"
    return row


async def run_with_foreign_input(stack: Stack, row: Any, url: str) -> ActionCallbackResult:
    """Start the callback workflow as an outsider would: the execution's id, but another
    callback id and an attacker's target with a credential reference in the input."""
    handle = await stack.client.start_workflow(
        ACTION_CALLBACK_WORKFLOW,
        ActionCallbackInput(
            execution_id=row["execution_id"],
            callback_id="someone-elses-callback",
            target=CallbackTarget(base_url=url, credential_ref="sandbox"),
        ),
        id=action_workflow_id(ENDPOINT, row["callback_id"]),
        task_queue=stack.task_queue,
        result_type=ActionCallbackResult,
    )
    return await handle.result()


async def test_s2_a_callback_started_with_a_foreign_url_sends_nothing_there(
    stack: Stack, db_dsn: str, remote: BackgroundSandbox, foreign: Listener
) -> None:
    """S-2: the completion goes to the target the worker's ingress policy names for the
    execution's endpoint, for the stored callback id; the URL, credential reference and
    callback id in the input are not used. Before S-2 the worker POSTed the completion,
    with the credential's bearer token, to the input's URL."""
    row = await admitted_execution(db_dsn, remote, stack.pool)

    result = await run_with_foreign_input(stack, row, foreign.url)

    assert (result.phase, result.outcome) == ("delivered", "FAIL_CONTINUE")
    assert foreign.heads == []
    completions = await stack.sandbox.callbacks()
    assert [(c.callback_id, c.output_fields) for c in completions] == [
        (row["callback_id"], FAIL_CONTINUE)
    ]


async def test_s2_an_endpoint_the_worker_has_no_target_for_stops_with_nothing_sent(
    stack: Stack, db_dsn: str, remote: BackgroundSandbox, foreign: Listener
) -> None:
    """S-2, fail closed: the worker's policy gives this endpoint no target (unset, or the
    row names an endpoint it does not have): the execution stops `callback_target_unknown`
    for an operator, and nothing is sent anywhere, the input's URL included."""
    row = await admitted_execution(db_dsn, remote, stack.pool)
    stack.callback_targets.clear()

    result = await run_with_foreign_input(stack, row, foreign.url)

    assert (result.phase, result.stop_reason, result.needs_operator) == (
        "stopped",
        "callback_target_unknown",
        True,
    )
    assert foreign.heads == []
    assert await stack.sandbox.callbacks() == []
    stored = await stack.pool.fetchrow(
        "SELECT phase, callback_attempts FROM workflow_action_execution WHERE execution_id = $1",
        row["execution_id"],
    )
    assert stored is not None and tuple(stored) == ("stopped", 0)


# -- a `remote_deleted` signal suspends only for a stored deletion event --------------------


async def finalized(stack: Stack, record_id: str) -> asyncpg.Record:
    await stack.push(record_id)
    link = await eventually(
        lambda: stack.link(contact_key(record_id)),
        lambda r: r is not None and r["status"] == "finalized",
    )
    assert link is not None
    return link


async def signal_deleted(stack: Stack, key: str, event_id: str) -> None:
    """Signal-with-start `remote_deleted` as anyone with namespace access can, then wait
    until the run settles: completed (nothing to do) or the link suspended (parked)."""
    handle = await stack.client.start_workflow(
        LINK_WORKFLOW_TYPE,
        LinkWorkflowInput(link_key=key),
        id=link_workflow_id(key),
        task_queue=stack.task_queue,
        start_signal=REMOTE_DELETED_SIGNAL,
        start_signal_args=[RemoteEvidence(event_id=event_id, reason="operator_says_so")],
    )

    async def settled() -> tuple[WorkflowExecutionStatus | None, str | None]:
        status = (await handle.describe()).status
        link = await stack.link(key)
        return status, None if link is None else link["suspend_reason"]

    await eventually(
        settled, lambda s: s[0] is not WorkflowExecutionStatus.RUNNING or s[1] is not None
    )


async def record_deletion(pool: asyncpg.Pool, link: asyncpg.Record, remote_id: str) -> str:
    """A deletion event of (the link's target object, `remote_id`) as G-8 records it."""
    event_id = f"evt-{uuid.uuid4().hex}"
    await pool.execute(
        "INSERT INTO connector_remote_deletion (event_id, target_object, remote_scope, "
        "remote_id, event_type, endpoint) VALUES ($1, $2, $3, $4, 'contact.deletion', 'crm')",
        event_id,
        link["target_object"],
        link["remote_scope"],
        remote_id,
    )
    return event_id


async def test_s2_a_remote_deleted_signal_with_an_unknown_event_suspends_nothing(
    stack: Stack,
) -> None:
    """S-2: an event id nobody stored, or a stored deletion of another object, suspends
    nothing; a stored deletion of the link's own object suspends it, with the stored
    fact as its reason and detail (not the signal's `reason`)."""
    key = contact_key("c-001")
    link = await finalized(stack, "c-001")

    await signal_deleted(stack, key, "no-such-event")
    other = await record_deletion(stack.pool, link, f"{link['remote_id']}0")
    await signal_deleted(stack, key, other)

    after = await stack.link(key)
    assert after is not None
    assert (after["status"], after["suspend_reason"]) == ("finalized", None)

    stored = await record_deletion(stack.pool, link, link["remote_id"])
    await signal_deleted(stack, key, stored)
    suspended = await stack.link(key)
    assert suspended is not None
    assert (suspended["status"], suspended["suspend_reason"]) == (
        "suspended_drift",
        "remote_deleted",
    )
    assert stored in str(suspended["drift_findings"])
