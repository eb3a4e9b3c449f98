"""InboundEventWorkflow: one per admitted connector_event (SPEC ING-6).

Theory of operation:
1. The ingress commits the event, answers, and only then starts this workflow
   (id `event/{event_id}`); a relay starts the ones it could not. The run
   reloads the event from Postgres, so starting it twice changes nothing.
2. `protocol.inbound.plan_event` decides; this workflow carries the plan out:
   a remote deletion of a finalized link's object is handed to that link's own
   workflow (signal-with-start `remote_deleted`), everything else is settled.
3. Every run ends the event `processed`, `skipped` or `dead` with a reason;
   a step that keeps failing settles it `dead` rather than leaving it admitted.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from activities.inbound import InboundActivities
from protocol.inbound import (
    INBOUND_EVENT_WORKFLOW,
    INBOUND_NON_RETRYABLE,
    ClassifiedEvent,
    EventIdInput,
    EventReason,
    EventStatus,
    InboundEventInput,
    InboundEventResult,
    PlanKind,
    SettleEventInput,
    SignalLinksInput,
)
from protocol.timeouts import LOCAL_ACTIVITY_START_TO_CLOSE

RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=sorted(INBOUND_NON_RETRYABLE),
)
# Signalling a link goes through the Temporal frontend; give up (and settle the
# event dead) after a bounded number of tries rather than hold it admitted forever.
SIGNAL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)


@workflow.defn(name=INBOUND_EVENT_WORKFLOW)
class InboundEventWorkflow:
    @workflow.run
    async def run(self, input: InboundEventInput) -> InboundEventResult:
        classified = await self._classify(input.event_id)
        plan = classified.plan
        if plan.kind is PlanKind.ALREADY_SETTLED:
            event = classified.event
            return InboundEventResult(
                event_id=event.event_id, status=event.status, reason=event.status_reason
            )
        if plan.kind is PlanKind.SUSPEND_LINKS and not await self._signal_links(classified):
            dead = EventStatus.DEAD
            return await self._settle(input.event_id, dead, EventReason.PROCESSING_FAILED)
        assert plan.reason is not None
        return await self._settle(input.event_id, plan.status, plan.reason)

    async def _classify(self, event_id: str) -> ClassifiedEvent:
        return await workflow.execute_activity_method(
            InboundActivities.classify_event,
            EventIdInput(event_id=event_id),
            start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
            retry_policy=RETRY,
            summary="read the event and plan its handler",
        )

    async def _signal_links(self, classified: ClassifiedEvent) -> bool:
        event = classified.event
        assert event.target_object is not None and event.remote_object_id is not None
        try:
            await workflow.execute_activity_method(
                InboundActivities.signal_remote_deleted,
                SignalLinksInput(
                    event_id=event.event_id,
                    link_keys=classified.plan.link_keys,
                    target_object=event.target_object,
                    remote_object_id=event.remote_object_id,
                ),
                start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                retry_policy=SIGNAL_RETRY,
                summary=f"remote_deleted -> {len(classified.plan.link_keys)} link(s)",
            )
        except ActivityError:
            return False
        return True

    async def _settle(
        self, event_id: str, status: EventStatus, reason: EventReason
    ) -> InboundEventResult:
        result = await workflow.execute_activity_method(
            InboundActivities.settle_event,
            SettleEventInput(event_id=event_id, status=status, reason=reason.value),
            start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
            retry_policy=RETRY,
            summary=f"event -> {status.value} ({reason.value})",
        )
        workflow.set_current_details(f"**event** `{result.status}` ({result.reason})")
        return result
