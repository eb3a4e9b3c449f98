"""The steps of an inbound event (SPEC ING-6, G-8): read and plan it, signal the links it
concerns, settle it.

Each is idempotent on the event id: planning reads only, a repeated link signal
is absorbed by the LinkWorkflow's compare-and-set, and settling is a
compare-and-set from `admitted` that reports the stored outcome when it lost; the
deletion evidence it records with it (G-8) is keyed by the event, so a re-run adds none.
"""

from __future__ import annotations

import asyncpg
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from db import inbound_queries as q
from db import remote_deletions as deletions_q
from protocol.inbound import (
    REMOTE_DELETED_SIGNAL,
    ClassifiedEvent,
    EventStatus,
    InboundErrorType,
    InboundEventResult,
    SettleEventInput,
    SignalLinksInput,
    check_event_transition,
    plan_event,
)
from protocol.ingress_policy import InboundHandler
from protocol.messages import LinkWorkflowInput, RemoteEvidence
from protocol.remote_deletion import records_remote_deletion
from services.wake import link_facts, signal_with_start


def _unknown_event(event_id: str) -> ApplicationError:
    return ApplicationError(
        f"no connector_event {event_id}", type=InboundErrorType.UNKNOWN_EVENT, non_retryable=True
    )


async def classify_event(pool: asyncpg.Pool, event_id: str) -> ClassifiedEvent:
    """The event and what its handler will do with it (reads only)."""
    async with pool.acquire() as conn:
        event = await q.select_event(conn, event_id)
        if event is None:
            raise _unknown_event(event_id)
        links: list[str] = []
        if (
            event.status is EventStatus.ADMITTED
            and event.handler == InboundHandler.REMOTE_DELETION.value
            and event.target_object is not None
            and event.remote_object_id is not None
            and event.remote_scope is not None
        ):
            links = await q.owning_links(
                conn, event.target_object, event.remote_object_id, event.remote_scope
            )
    return ClassifiedEvent(event=event, plan=plan_event(event, links))


async def signal_remote_deleted(
    pool: asyncpg.Pool, client: Client, task_queue: str, input: SignalLinksInput
) -> None:
    """Signal-with-start `remote_deleted` on each owning link's workflow (WF-1 ids).

    The link moves through its own workflow; a closed run is started fresh and
    reloads from Postgres, a running one receives the signal.
    """
    evidence = RemoteEvidence(
        event_id=input.event_id,
        detail=f"{input.target_object} {input.remote_object_id} deleted remotely",
    )
    async with pool.acquire() as conn:
        facts = await link_facts(conn, list(input.link_keys))
    for link_key in input.link_keys:
        await signal_with_start(
            client,
            task_queue,
            LinkWorkflowInput(link_key=link_key),
            REMOTE_DELETED_SIGNAL,
            evidence,
            facts.get(link_key),
        )


async def settle_event(pool: asyncpg.Pool, input: SettleEventInput) -> InboundEventResult:
    """admitted -> processed | skipped | dead, recording a deletion event's evidence
    (G-8); a re-run returns the stored outcome."""
    check_event_transition(EventStatus.ADMITTED, input.status)
    async with pool.acquire() as conn, conn.transaction():
        await q.settle_event(conn, input.event_id, input.status, input.reason)
        event = await q.select_event(conn, input.event_id)
        if event is None:
            raise _unknown_event(input.event_id)
        if records_remote_deletion(event):
            # G-8: whatever the links' state (or with none), the evidence outlives the
            # event row, which retention prunes; it commits with the settling.
            await deletions_q.record_from_event(conn, input.event_id)
    return InboundEventResult(
        event_id=event.event_id, status=event.status, reason=event.status_reason
    )
