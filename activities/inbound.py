"""Activities of the InboundEventWorkflow (SPEC ING-6): read, plan, signal links, settle;
thin adapters over `services.inbound`, where each step's idempotency lives."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from protocol.inbound import (
    ClassifiedEvent,
    EventIdInput,
    InboundEventResult,
    SettleEventInput,
    SignalLinksInput,
)
from services import inbound


class InboundActivities:
    """Bound to the worker's pool; Temporal calls go through the activity's own client."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn
    async def classify_event(self, input: EventIdInput) -> ClassifiedEvent:
        """The event and what its handler will do with it (reads only)."""
        return await inbound.classify_event(self._pool, input.event_id)

    @activity.defn
    async def signal_remote_deleted(self, input: SignalLinksInput) -> None:
        """Signal-with-start `remote_deleted` on each owning link's workflow (WF-1 ids)."""
        client, task_queue = activity.client(), activity.info().task_queue
        await inbound.signal_remote_deleted(self._pool, client, task_queue, input)

    @activity.defn
    async def settle_event(self, input: SettleEventInput) -> InboundEventResult:
        """admitted -> processed | skipped | dead, recording a deletion event's evidence
        (G-8); a re-run returns the stored outcome."""
        return await inbound.settle_event(self._pool, input)
