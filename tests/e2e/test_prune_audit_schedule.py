"""SPEC G-8 (`prune` writes an audit entry) for the worker's scheduled prune: the run the
daily schedule starts (PruneWorkflow on the real worker and Temporal server) appends an
OPS-2 entry naming the schedule as who and its workflow as why."""

from __future__ import annotations

import uuid

from db import audit as audit_q
from protocol.audit import AuditCommand
from protocol.retention import PruneInput
from tests.e2e.conftest import Stack
from workflows.retention import PruneWorkflow


async def test_g8_the_scheduled_prune_appends_an_audit_entry(stack: Stack) -> None:
    workflow_id = f"prune-audit-{uuid.uuid4().hex}"
    report = await stack.client.execute_workflow(
        PruneWorkflow.run,
        PruneInput(older_than_seconds=0),
        id=workflow_id,
        task_queue=stack.task_queue,
    )
    async with stack.pool.acquire() as conn:
        entries = await audit_q.entries(conn, None, None, 100)
    [entry] = [e for e in entries if e.command is AuditCommand.PRUNE]
    assert entry.operator == "retention schedule"
    assert workflow_id in entry.reason
    assert entry.outcome.startswith(f"deleted {sum(report.counts.model_dump().values())} ")
