"""The product's worker runs workflow code in Temporal's sandbox (issue 32 item 5's
decision, worker/runtime.py): a workflow that reads the wall clock has its task failed
there, before the call can reach a history; the same worker built outside the sandbox
(`sandboxed=False`, which only `make bench ONLY=SANDBOX` uses) runs it to completion."""

from __future__ import annotations

import uuid

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from tests.e2e.support import eventually
from tests.workflows.clock import ClockWorkflow
from worker.runtime import build_worker, remote_http_client


async def _failed_tasks(handle: WorkflowHandle[ClockWorkflow, str]) -> list[str]:
    return [
        event.workflow_task_failed_event_attributes.failure.message
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def test_the_workers_sandbox_fails_a_workflow_task_that_reads_the_clock(
    temporal_client: Client, db_pool: asyncpg.Pool, task_queue: str
) -> None:
    async with (
        remote_http_client() as http,
        build_worker(temporal_client, db_pool, http, task_queue, workflows=[ClockWorkflow]),
    ):
        handle = await temporal_client.start_workflow(
            ClockWorkflow.run, id=f"clock-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        failures = await eventually(lambda: _failed_tasks(handle), bool)
        await handle.terminate("test done")
    assert "datetime.datetime.now" in failures[0]


async def test_outside_the_sandbox_the_same_workflow_completes(
    temporal_client: Client, db_pool: asyncpg.Pool, task_queue: str
) -> None:
    async with (
        remote_http_client() as http,
        build_worker(
            temporal_client,
            db_pool,
            http,
            task_queue,
            workflows=[ClockWorkflow],
            sandboxed=False,
        ),
    ):
        result = await temporal_client.execute_workflow(
            ClockWorkflow.run, id=f"clock-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
    assert result[:4].isdigit()
