"""Issue 10 problem 5 (SPEC WF-1): while saves keep arriving, a LinkWorkflow run still
reaches its continue-as-new check, so no run's history grows without bound.

A private dev server suggests continue-as-new after a few dozen events; one
record is edited and saved as fast as the CRM entry takes it for twenty seconds (a
minute until issue 31: twenty already spans several suggestions). Before the fix the
PATCH loop never looked at the suggestion (one run reached 1,703 events, suggested at 63).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from cli.stack.temporal import TemporalDevServer
from sandbox.client import SandboxClient
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import contact_key
from tests.e2e.rig import Rig, private_temporal, rig_on
from tests.e2e.support import eventually
from worker.crm import workflow_id

THRESHOLD = 40
SAVING_S = 20.0
# Events one step may add after the suggestion: its activity's completion and the
# workflow tasks of signals that arrive meanwhile. Unbounded before: thousands.
STEP_EVENTS = 60


@pytest.fixture
def small_history_temporal(tmp_path: Path) -> Iterator[TemporalDevServer]:
    suggest = f"limit.historyCount.suggestContinueAsNew={THRESHOLD}"
    with private_temporal(tmp_path, ["--dynamic-config-value", suggest]) as server:
        yield server


@pytest.fixture
async def small_rig(
    small_history_temporal: TemporalDevServer, demo_db: asyncpg.Pool, sandbox: SandboxClient
) -> AsyncIterator[Rig]:
    async with rig_on(small_history_temporal, demo_db, sandbox, "bounded") as rig:
        yield rig


async def _runs(client: Client, key: str) -> list[list[HistoryEvent]]:
    """Every run of the link's workflow id, as its list of history events."""
    query = f'WorkflowId = "{workflow_id(key)}"'
    runs = []
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        runs.append([e async for e in handle.fetch_history_events()])
    return runs


def _after_suggestion(events: list[HistoryEvent]) -> tuple[int, int]:
    """(events, activities scheduled) after the first task that suggested continue-as-new."""
    for i, event in enumerate(events):
        attrs = event.workflow_task_started_event_attributes
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and (
            attrs.suggest_continue_as_new
        ):
            rest = events[i + 1 :]
            scheduled = sum(
                1 for e in rest if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            )
            return len(rest), scheduled
    return 0, 0


@pytest.mark.slow(seconds=35)
@pytest.mark.timeout(240)
async def test_twenty_seconds_of_saves_keep_every_run_bounded_and_lose_nothing(
    small_rig: Rig, remote: BackgroundSandbox
) -> None:
    stack = small_rig.stack
    await small_rig.start_worker()
    key = contact_key("c-001")
    await stack.push("c-001")
    await eventually(lambda: stack.attempt(key), lambda a: a["status"] == "finalized")
    link = await stack.link(key)
    assert link is not None

    saves, last = 0, ""
    deadline = time.monotonic() + SAVING_S
    while time.monotonic() < deadline:
        saves += 1
        last = f"Edit{saves}"
        await stack.pool.execute(
            "UPDATE crm_record SET fields = fields || jsonb_build_object('LastName', $1::text) "
            "WHERE source_object = 'Contact' AND record_id = 'c-001'",
            last,
        )
        await stack.push("c-001")

    def settled(rows: list[asyncpg.Record]) -> bool:
        return all(r["status"] not in ("pending", "processing") for r in rows)

    rows = await eventually(
        lambda: stack.pool.fetch(
            "SELECT status FROM connector_patch_dispatch WHERE link_key = $1", key
        ),
        settled,
        timeout_s=60,
    )
    assert {r["status"] for r in rows} <= {"succeeded", "superseded"}, "nothing failed"
    async with httpx.AsyncClient(base_url=remote.url) as http:
        obj = (await http.get(f"/crm/v3/objects/contacts/{link['remote_id']}")).json()
    assert obj["properties"]["lastname"] == last, "the last save reached the remote"

    runs = await _runs(stack.client, key)
    assert len(runs) > 2, f"{saves} saves over {SAVING_S} s continued as new"
    for events in runs:
        tail, activities = _after_suggestion(events)
        assert tail <= STEP_EVENTS and activities <= 1, (len(events), tail, activities)
        assert len(events) <= THRESHOLD + STEP_EVENTS + 20
