"""RelayWorkflow: the sweep that dispatches work whose wake-up never arrived (SPEC WF-2).

Theory of operation:
1. Admission commits in the CRM's transaction before the workflow is woken, so a
   save made while Temporal was unreachable leaves a reservation no workflow
   knows about. This sweep finds such links in Postgres and wakes them with the
   same signal-with-start the CRM entry uses; duplicates are harmless because the
   LinkWorkflow reads its work from Postgres.
2. It runs on a Temporal Schedule (`worker.schedules`), not as a long-lived loop:
   the server owns the timer, overlapping sweeps are skipped by policy, there is
   no history to continue-as-new, and operators can pause or trigger it from the
   UI's Schedules page.
3. One run walks the backlog in key-ordered pages up to a page budget; whatever
   is left is the next run's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.relay import RelayActivities

from protocol.relay import RelayInput, RelayPageInput, RelayResult

MAX_PAGES_PER_RUN: Final = 50
PAGE_TIMEOUT: Final = timedelta(minutes=2)
PAGE_RETRY: Final = RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5)


@workflow.defn
class RelayWorkflow:
    @workflow.run
    async def run(self, input: RelayInput) -> RelayResult:
        after: str | None = None
        woken = 0
        for page in range(1, MAX_PAGES_PER_RUN + 1):
            result = await workflow.execute_activity_method(
                RelayActivities.wake_links_with_pending_work,
                RelayPageInput(
                    after=after, limit=input.page_size, min_age_seconds=input.min_age_seconds
                ),
                start_to_close_timeout=PAGE_TIMEOUT,
                retry_policy=PAGE_RETRY,
                summary=f"wake links with pending work (page {page})",
            )
            woken += result.woken
            if result.last_key is None:
                return RelayResult(woken=woken, pages=page, complete=True)
            after = result.last_key
        return RelayResult(woken=woken, pages=MAX_PAGES_PER_RUN, complete=False)
