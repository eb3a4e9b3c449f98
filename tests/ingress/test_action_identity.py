"""Workflow actions on the real stack: identity per endpoint, the mode switch, phase budgets
(issue 30 item 6; SPEC §15 C-7, ING-7; SEED-ROWS-OPEN I-41, I-17, I-24).

Ingress, Postgres, Temporal with a worker, and sandbox remotes as callback targets.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from ingress.relay import Relay
from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    ActionCallbackInput,
    ActionCallbackResult,
    CallbackBudgets,
    PhaseBudget,
    action_workflow_id,
    callback_targets,
)
from protocol.states import ProtocolError
from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.faults import FaultRuleSpec
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import EXAMPLES, Stack
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

PATH, OTHER_PATH = "/actions/crm", "/actions/crm-b"
ENDPOINT, OTHER_ENDPOINT = "actions", "actions-b"
NO_LINK = 424242  # an object no link owns: the local work is skipped, FAIL_CONTINUE
FAIL_CONTINUE = {"hs_execution_state": "FAIL_CONTINUE"}


def new_callback_id() -> str:
    return f"cb-{uuid.uuid4().hex}"  # workflow ids are shared by the session's server


async def act(live: Live, callback_id: str, path: str = PATH) -> httpx.Response:
    document = execution(callback_id, 22)
    document["object"]["objectId"] = NO_LINK
    body = encode(document)
    headers = signed_headers(body, path, secret=ACTION_SECRET)
    return await live.client.post(path, content=body, headers=headers)


async def rows(pool: asyncpg.Pool, callback_id: str) -> dict[str, asyncpg.Record]:
    found = await pool.fetch(
        "SELECT * FROM workflow_action_execution WHERE callback_id = $1", callback_id
    )
    return {r["endpoint"]: r for r in found}


def test_c7_the_workflow_id_is_per_endpoint_and_callback_id() -> None:
    """C-7: one home for the id: the endpoint is part of it, encoded so it never adds a
    path separator; the same pair always gives the same id."""
    first = action_workflow_id("actions", "cb-1")
    assert first == action_workflow_id("actions", "cb-1") == "action/actions/cb-1"
    assert action_workflow_id("actions-b", "cb-1") != first
    assert action_workflow_id("a/b", "c") == "action/a%2Fb/c"
    with pytest.raises(ProtocolError):
        action_workflow_id("", "cb-1")
    with pytest.raises(ProtocolError):
        action_workflow_id("actions", "../cb")


# -- I-41 / C-7 ------------------------------------------------------------------------


@pytest.fixture
def other_remote() -> Iterator[BackgroundSandbox]:
    """A second sandbox: the other endpoint's own callback target."""
    config = SandboxConfig.model_validate(yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text()))
    with BackgroundSandbox(config) as server:
        yield server


def two_action_endpoints(first_target: str, second_target: str) -> dict[str, Any]:
    document = policy_document(callback_base_url=first_target)
    other = copy.deepcopy(document["endpoints"][2])
    other.update(name=OTHER_ENDPOINT, path=OTHER_PATH, callback_base_url=second_target)
    document["endpoints"].append(other)
    return document


async def test_i41_c7_the_same_callback_id_on_two_endpoints_is_two_completed_executions(
    stack: Stack, db_dsn: str, remote: BackgroundSandbox, other_remote: BackgroundSandbox
) -> None:
    """I-41 / C-7: two workflow-action endpoints receive the same callbackId. Both answer
    BLOCK, both executions run (two workflows) and each completes to its own callback
    target. With one workflow id per callbackId the second was acknowledged and never
    completed."""
    document = two_action_endpoints(remote.url, other_remote.url)
    # The worker reads the policy the ingress serves (S-2): both endpoints' targets.
    stack.callback_targets.update(callback_targets(config_from(document).policy))
    temporal = (stack.client, stack.task_queue)
    callback_id = new_callback_id()
    async with live_server(config_from(document), db_dsn, temporal=temporal, relay=False) as live:
        answers = [await act(live, callback_id, path) for path in (PATH, OTHER_PATH)]
        await live.ingress.background.idle()
    assert [a.json()["outputFields"]["hs_execution_state"] for a in answers] == ["BLOCK"] * 2

    delivered = await eventually(
        lambda: rows(stack.pool, callback_id),
        lambda found: len(found) == 2 and {r["phase"] for r in found.values()} == {"delivered"},
        timeout_s=60,
    )
    assert {e: (r["outcome"], r["callback_attempts"]) for e, r in delivered.items()} == {
        ENDPOINT: ("FAIL_CONTINUE", 1),
        OTHER_ENDPOINT: ("FAIL_CONTINUE", 1),
    }
    assert delivered[ENDPOINT]["execution_id"] != delivered[OTHER_ENDPOINT]["execution_id"]
    async with httpx.AsyncClient(base_url=other_remote.url, timeout=10.0) as http:
        other_completions = await SandboxClient(other_remote.url, http).callbacks()
    for completions in (await stack.sandbox.callbacks(), other_completions):
        assert [(c.callback_id, c.output_fields, c.duplicate) for c in completions] == [
            (callback_id, FAIL_CONTINUE, False)
        ]
    for endpoint in (ENDPOINT, OTHER_ENDPOINT):
        handle = stack.client.get_workflow_handle(
            action_workflow_id(endpoint, callback_id), result_type=ActionCallbackResult
        )
        result = await handle.result()
        assert result.execution_id == delivered[endpoint]["execution_id"]


# -- I-17: disabled means nothing starts, not even from the relay -------------------------


async def test_i17_disabled_mode_starts_no_action_workflow_and_the_relay_leaves_the_row(
    stack: Stack, db_dsn: str, remote: BackgroundSandbox
) -> None:
    """I-17 / ING-7: an `admitted` execution row (admitted while the mode was proxy, its
    workflow never started) and an ingress running with workflow_action_mode=disabled:
    the relay starts no `action/...` workflow and leaves the row as it was."""
    document = policy_document(callback_base_url=remote.url)
    callback_id = new_callback_id()
    async with live_server(config_from(document), db_dsn, relay=False) as live:  # no Temporal
        assert (await act(live, callback_id)).status_code == 200
    [before] = (await rows(stack.pool, callback_id)).values()
    assert (before["phase"], before["workflow_started_at"]) == ("admitted", None)

    document["workflow_action_mode"] = "disabled"
    temporal = (stack.client, stack.task_queue)
    async with live_server(config_from(document), db_dsn, temporal=temporal, relay=False) as live:
        starter = live.ingress.starter
        assert starter is not None
        relay = Relay(starter, min_age=timedelta(0))
        started = [await relay.run_once(live.ingress.admitter.pool) for _ in range(2)]
    assert started == [0, 0]
    [after] = (await rows(stack.pool, callback_id)).values()
    assert dict(after) == dict(before)
    for workflow_id in (action_workflow_id(ENDPOINT, callback_id), f"action/{callback_id}"):
        with pytest.raises(RPCError) as missing:
            await stack.client.get_workflow_handle(workflow_id).describe()
        assert missing.value.status is RPCStatusCode.NOT_FOUND


# -- I-24: one failing callback endpoint holds up nothing else ------------------------------


async def attempts_of(stack: Stack, workflow_id: str) -> dict[str, int]:
    """How many attempts each activity type took, read from the workflow's history."""
    handle = stack.client.get_workflow_handle(workflow_id)
    scheduled: dict[int, str] = {}
    attempts: dict[str, int] = {}
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            name = scheduled[started.scheduled_event_id]
            attempts[name] = attempts.get(name, 0) + started.attempt
    return attempts


async def test_i24_a_failing_callback_target_holds_up_no_other_phase_or_budget(
    stack: Stack, db_dsn: str, remote: BackgroundSandbox
) -> None:
    """I-24 / ING-7: the completion of execution A keeps failing (503). Meanwhile B is
    enqueued, observed and delivered. C, run with an enqueue budget of one attempt and a
    callback budget of three, exhausts its callback budget (stopped `budget_exhausted`
    after exactly three completion requests) while its enqueue took its one attempt:
    the phases' budgets are separate, and after that D still enqueues and observes."""
    a, b, c, d = (new_callback_id() for _ in range(4))
    for failing in (a, c, d):
        path = f"/automation/v4/actions/callbacks/{failing}/complete"
        await stack.sandbox.add_fault(FaultRuleSpec(path=path, action="status", status=503))
    document = policy_document(callback_base_url=remote.url)
    temporal = (stack.client, stack.task_queue)
    async with live_server(config_from(document), db_dsn, temporal=temporal, relay=False) as live:
        assert (await act(live, a)).status_code == 200
        await live.ingress.background.idle()
        await eventually(
            lambda: rows(stack.pool, a),
            lambda found: found[ENDPOINT]["callback_attempts"] >= 2,
            timeout_s=60,
        )
        assert (await act(live, b)).status_code == 200
        await live.ingress.background.idle()
        await eventually(
            lambda: rows(stack.pool, b),
            lambda found: found[ENDPOINT]["phase"] == "delivered",
            timeout_s=60,
        )
    [still_failing] = (await rows(stack.pool, a)).values()
    assert still_failing["phase"] == "observed"  # A keeps retrying its completion

    # C and D: admitted without a start (no Temporal), then run with small budgets.
    budgets = CallbackBudgets(
        enqueue=PhaseBudget(max_duration=timedelta(minutes=1), max_attempts=1),
        deliver=PhaseBudget(
            max_duration=timedelta(minutes=1),
            max_attempts=3,
            initial_interval=timedelta(milliseconds=100),
            maximum_interval=timedelta(milliseconds=200),
        ),
    )
    async with live_server(config_from(document), db_dsn, relay=False) as live:
        for callback_id in (c, d):
            assert (await act(live, callback_id)).status_code == 200
    results = {}
    for callback_id in (c, d):
        [row] = (await rows(stack.pool, callback_id)).values()
        handle = await stack.client.start_workflow(
            ACTION_CALLBACK_WORKFLOW,
            ActionCallbackInput(
                execution_id=row["execution_id"],
                callback_id=callback_id,
                budgets=budgets,
            ),
            id=action_workflow_id(ENDPOINT, callback_id),
            task_queue=stack.task_queue,
            result_type=ActionCallbackResult,
        )
        try:
            results[callback_id] = await handle.result()
        except WorkflowFailureError as failure:  # pragma: no cover - shown if it happens
            raise AssertionError(f"workflow failed: {failure.cause!r}") from failure

    assert (results[c].phase, results[c].stop_reason, results[c].needs_operator) == (
        "stopped",
        "budget_exhausted",
        True,
    )
    [exhausted] = (await rows(stack.pool, c)).values()
    assert (exhausted["callback_attempts"], exhausted["outcome"]) == (3, "FAIL_CONTINUE")
    event = await stack.pool.fetchrow(
        "SELECT status FROM connector_event WHERE event_id = $1", exhausted["event_id"]
    )
    assert event is not None and event["status"] == "skipped"  # its enqueued work stands
    ran = await attempts_of(stack, action_workflow_id(ENDPOINT, c))
    assert (ran["enqueue"], ran["observe"] >= 1, ran["deliver"]) == (1, True, 3)
    # D, after C's exhaustion, with the same budgets: its enqueue and observe still run.
    assert (results[d].phase, results[d].outcome) == ("stopped", "FAIL_CONTINUE")
    [later] = (await rows(stack.pool, d)).values()
    assert later["event_id"] is not None and later["outcome"] == "FAIL_CONTINUE"
    # B's completion is the only one the target accepted.
    completions = await stack.sandbox.callbacks()
    assert [(x.callback_id, x.output_fields) for x in completions] == [(b, FAIL_CONTINUE)]
