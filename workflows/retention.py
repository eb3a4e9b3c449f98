"""PruneWorkflow: the daily retention run (SPEC OPS-3), started by a Temporal Schedule.

Theory of operation:
1. The worker creates the schedule only when `CONNECTOR_PUSH_PRUNE_OLDER_THAN` is
   set (worker/schedules.py); operators pause or trigger it from the UI's
   Schedules page, and overlapping runs are skipped by policy.
2. One activity does the work in batches of its own transactions; it is idempotent
   (a retry deletes whatever is still finished and old), so the workflow only
   bounds it with a timeout and a few retries.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.retention import RetentionActivities

from protocol.retention import PruneInput, PruneReport

PRUNE_TIMEOUT: Final = timedelta(hours=1)
PRUNE_RETRY: Final = RetryPolicy(maximum_interval=timedelta(minutes=5), maximum_attempts=3)


@workflow.defn
class PruneWorkflow:
    @workflow.run
    async def run(self, input: PruneInput) -> PruneReport:
        return await workflow.execute_activity_method(
            RetentionActivities.prune_finished,
            input,
            start_to_close_timeout=PRUNE_TIMEOUT,
            retry_policy=PRUNE_RETRY,
            summary=f"prune finished rows older than {input.older_than_seconds} s (OPS-3)",
        )
