"""The phases of a workflow action's execution (SPEC ING-7), one operation each.

Every phase starts by reading the execution row and does nothing when its phase is
already behind it, so a retry, a reset or a second workflow run never repeats an
accepted enqueue, an observed outcome or a delivered completion. Only the delivery
phase talks to the remote (its own client, target resolved from configuration, §17
S-2: the worker's ingress policy, by the endpoint the stored row names; the callback
id and the outcome are the row's too, never the workflow input's); its retryable
failures raise, its terminal ones are recorded and returned.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Final
from urllib.parse import quote

import asyncpg
import httpx
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from db import inbound_queries as q
from db.ingress_queries import mark_events_started
from db.records import Conn
from protocol.action_callback import (
    COMPLETE_PATH,
    ActionPhase,
    CallbackTarget,
    CallbackVerdict,
    CompletionState,
    DeliverInput,
    ExecutionView,
    StopInput,
    StopReason,
    callback_verdict,
    completion_for,
)
from protocol.inbound import (
    INBOUND_EVENT_WORKFLOW,
    EventStatus,
    InboundErrorType,
    InboundEventInput,
    event_workflow_id,
)
from protocol.outcome import parse_retry_after
from services.credentials import CredentialNotBound, bind_credential

log = logging.getLogger(__name__)


async def _load(conn: Conn, execution_id: str) -> ExecutionView:
    view = await q.select_execution(conn, execution_id)
    if view is None:
        raise ApplicationError(
            f"no workflow_action_execution {execution_id}",
            type=InboundErrorType.UNKNOWN_EXECUTION,
            non_retryable=True,
        )
    return view


# S-6: the longest wait a completion's `Retry-After` may ask for before the next try.
CALLBACK_RETRY_AFTER_CAP_S: Final = 300.0


def callback_retry_delay(response: httpx.Response | None) -> timedelta | None:
    """The wait the remote asked for (delta-seconds or an HTTP-date, read as every answer's
    is), at most `CALLBACK_RETRY_AFTER_CAP_S`; None: the retry policy's own backoff."""
    raw = response.headers.get("retry-after") if response is not None else None
    wanted = parse_retry_after(raw, datetime.now(UTC))
    if wanted is None or not math.isfinite(wanted):
        return None
    return timedelta(seconds=min(wanted, CALLBACK_RETRY_AFTER_CAP_S))


async def load_execution(pool: asyncpg.Pool, execution_id: str) -> ExecutionView:
    """The execution as stored."""
    async with pool.acquire() as conn:
        return await _load(conn, execution_id)


async def enqueue(
    pool: asyncpg.Pool, client: Client, task_queue: str, execution_id: str
) -> ExecutionView:
    """Phase 1: commit the execution's local work as a connector_event, then start it."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            view = await _load(conn, execution_id)
            if view.phase is ActionPhase.ADMITTED:
                await q.insert_execution_event(conn, execution_id)
                await q.mark_enqueued(conn, execution_id)
        view = await _load(conn, execution_id)
        if view.phase is ActionPhase.ENQUEUED and view.event_id is not None:
            await _start_processing(client, task_queue, conn, view.event_id)
    return view


async def _start_processing(client: Client, task_queue: str, conn: Conn, event_id: str) -> None:
    # Completed runs keep their id, so a retried enqueue cannot process twice.
    with contextlib.suppress(WorkflowAlreadyStartedError):
        await client.start_workflow(
            INBOUND_EVENT_WORKFLOW,
            InboundEventInput(event_id=event_id),
            id=event_workflow_id(event_id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        )
    await mark_events_started(conn, [event_id])


async def observe(pool: asyncpg.Pool, execution_id: str) -> ExecutionView:
    """Phase 2: record the completion the event's outcome earns; retry while unsettled."""
    async with pool.acquire() as conn, conn.transaction():
        view = await _load(conn, execution_id)
        if view.phase is not ActionPhase.ENQUEUED or view.event_id is None:
            return view
        event = await q.select_event(conn, view.event_id)
        status = event.status if event is not None else EventStatus.ADMITTED
        if status is EventStatus.ADMITTED:
            raise ApplicationError(
                f"event {view.event_id} not settled yet",
                type=InboundErrorType.EVENT_NOT_SETTLED,
            )
        await q.mark_observed(conn, execution_id, completion_for(status))
        return await _load(conn, execution_id)


async def deliver(
    pool: asyncpg.Pool,
    http: httpx.AsyncClient,
    input: DeliverInput,
    targets: Mapping[str, CallbackTarget],
) -> ExecutionView:
    """Phase 3: POST the completion to the target `targets` (the worker's policy) names for
    the row's endpoint; 2xx/409 done, 401/403/4xx stopped, else raise to retry. An
    endpoint with no target there stops the execution, nothing sent (S-2)."""
    async with pool.acquire() as conn:
        view = await _load(conn, input.execution_id)
        if view.phase is not ActionPhase.OBSERVED or view.outcome is None:
            return view
        target = targets.get(view.endpoint or "")
        if target is None:
            log.warning(
                "workflow action %s: no callback target for endpoint %r in the worker's "
                "ingress policy (CONNECTOR_PUSH_INGRESS_CONFIG); stopped, nothing sent",
                view.execution_id,
                view.endpoint,
            )
            await q.mark_stopped(conn, input.execution_id, StopReason.CALLBACK_TARGET_UNKNOWN)
            return await _load(conn, input.execution_id)
        response = await _post(http, target, view.callback_id, view.outcome)
        status = response.status_code if response is not None else None
        await q.record_callback_attempt(conn, input.execution_id, status)
        verdict = callback_verdict(status)
        match verdict:
            case CallbackVerdict.DELIVERED:
                await q.mark_delivered(conn, input.execution_id)
            case CallbackVerdict.UNAUTHORIZED:
                await q.mark_stopped(conn, input.execution_id, StopReason.CALLBACK_UNAUTHORIZED)
            case CallbackVerdict.REJECTED:
                await q.mark_stopped(conn, input.execution_id, StopReason.CALLBACK_REJECTED)
            case CallbackVerdict.RETRY:
                raise ApplicationError(
                    f"completion not delivered (status {status})",
                    type=InboundErrorType.CALLBACK_NOT_DELIVERED,
                    next_retry_delay=callback_retry_delay(response),
                )
        return await _load(conn, input.execution_id)


async def _post(
    http: httpx.AsyncClient, target: CallbackTarget, callback_id: str, outcome: CompletionState
) -> httpx.Response | None:
    # Quoted although ingress admits only URL-safe ids: a stored id never reshapes the
    # path the credential is sent to (a '/' or '..' would name another endpoint).
    segment = quote(callback_id, safe=":")
    url = target.base_url.rstrip("/") + COMPLETE_PATH.format(callback_id=segment)
    body = {"outputFields": {"hs_execution_state": outcome.value}}
    request = http.build_request("POST", url, json=body)
    try:
        if target.credential_ref is not None:  # only to a host bound to it (S-3)
            bind_credential(request, target.credential_ref)
        return await http.send(request)
    except CredentialNotBound as refused:  # fail closed: retried, never sent, logged
        log.warning("workflow-action completion refused before sending: %s", refused)
        return None
    except httpx.TransportError:
        return None  # no response: retried like a 5xx (a completion is safe to repeat)


async def stop(pool: asyncpg.Pool, input: StopInput) -> ExecutionView:
    """Record why the execution ends undelivered (expired block, exhausted budget)."""
    async with pool.acquire() as conn:
        await q.mark_stopped(conn, input.execution_id, input.reason)
        return await _load(conn, input.execution_id)
