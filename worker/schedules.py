"""The relay's Temporal Schedule (SPEC WF-2), created idempotently at worker start."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from protocol.relay import RelayInput
from workflows.relay import RelayWorkflow

RELAY_EVERY: Final = timedelta(seconds=30)


def relay_schedule_id(task_queue: str) -> str:
    """One relay schedule per task queue: it wakes links on that queue."""
    return f"relay/{task_queue}"


def relay_schedule(task_queue: str, every: timedelta, relay: RelayInput) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RelayWorkflow.run,
            relay,
            id=relay_schedule_id(task_queue),
            task_queue=task_queue,
            static_summary="wake links with pending work (WF-2 relay)",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # A slow sweep is never doubled up: the next tick is skipped instead.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_relay_schedule(
    client: Client,
    task_queue: str,
    every: timedelta = RELAY_EVERY,
    relay: RelayInput | None = None,
) -> ScheduleHandle:
    """Create the relay schedule, or bring an existing one to this definition."""
    schedule = relay_schedule(task_queue, every, relay or RelayInput())
    try:
        return await client.create_schedule(relay_schedule_id(task_queue), schedule)
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(relay_schedule_id(task_queue))

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await handle.update(replace)
        return handle
