"""A workflow that reads the wall clock: what the workflow sandbox exists to refuse.
Only tests/workflows/test_worker_sandbox.py runs it."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow


@workflow.defn
class ClockWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # non-deterministic on purpose
