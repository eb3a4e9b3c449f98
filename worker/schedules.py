"""The worker's Temporal Schedules, created idempotently at worker start: the relay
(SPEC WF-2) always, the daily prune (OPS-3) when retention is configured."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleCalendarSpec,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from protocol.relay import RelayInput
from protocol.retention import PruneInput
from workflows.relay import RelayWorkflow
from workflows.retention import PruneWorkflow

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
    return await _create_or_update(client, relay_schedule_id(task_queue), schedule)


async def _create_or_update(client: Client, schedule_id: str, schedule: Schedule) -> ScheduleHandle:
    try:
        return await client.create_schedule(schedule_id, schedule)
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await handle.update(replace)
        return handle


# Daily, at a quiet hour (UTC): retention is housekeeping, not latency-sensitive.
PRUNE_HOUR_UTC: Final = 3


def prune_schedule_id(task_queue: str) -> str:
    return f"prune/{task_queue}"


def prune_schedule(task_queue: str, prune: PruneInput) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            PruneWorkflow.run,
            prune,
            id=prune_schedule_id(task_queue),
            task_queue=task_queue,
            static_summary=f"prune finished rows older than {prune.older_than_seconds} s (OPS-3)",
        ),
        spec=ScheduleSpec(calendars=[ScheduleCalendarSpec(hour=[ScheduleRange(PRUNE_HOUR_UTC)])]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_prune_schedule(
    client: Client, task_queue: str, prune: PruneInput | None
) -> ScheduleHandle | None:
    """The daily prune when configured; when not, an earlier one is deleted (it would keep
    deleting by a retention the operator has since switched off)."""
    schedule_id = prune_schedule_id(task_queue)
    if prune is None:
        try:
            await client.get_schedule_handle(schedule_id).delete()
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:
                raise
        return None
    return await _create_or_update(client, schedule_id, prune_schedule(task_queue, prune))
