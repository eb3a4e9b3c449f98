"""Activities of the ActionCallbackWorkflow (SPEC ING-7): one per persisted phase, each a
thin adapter over `services.action_callback`, where the phases and their idempotency
live."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import httpx
from temporalio import activity

from protocol.action_callback import (
    CallbackTarget,
    DeliverInput,
    ExecutionIdInput,
    ExecutionView,
    StopInput,
)
from services import action_callback as phases


class ActionCallbackActivities:
    """Bound to the worker's pool, its shared HTTP client (timeout below start-to-close)
    and the completion targets of its ingress policy, by endpoint name (S-2; none given:
    no completion is sent anywhere)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        http: httpx.AsyncClient,
        targets: Mapping[str, CallbackTarget] | None = None,
    ) -> None:
        self._pool = pool
        self._http = http
        self._targets: Mapping[str, CallbackTarget] = targets if targets is not None else {}

    @activity.defn
    async def load_execution(self, input: ExecutionIdInput) -> ExecutionView:
        return await phases.load_execution(self._pool, input.execution_id)

    @activity.defn
    async def enqueue(self, input: ExecutionIdInput) -> ExecutionView:
        """Phase 1: commit the execution's local work as a connector_event, then start it."""
        client, task_queue = activity.client(), activity.info().task_queue
        return await phases.enqueue(self._pool, client, task_queue, input.execution_id)

    @activity.defn
    async def observe(self, input: ExecutionIdInput) -> ExecutionView:
        """Phase 2: record the completion the event's outcome earns; retry while unsettled."""
        return await phases.observe(self._pool, input.execution_id)

    @activity.defn
    async def deliver(self, input: DeliverInput) -> ExecutionView:
        """Phase 3: POST the completion; 2xx/409 done, 401/403/4xx stopped, else raise to retry."""
        return await phases.deliver(self._pool, self._http, input, self._targets)

    @activity.defn
    async def stop(self, input: StopInput) -> ExecutionView:
        """Record why the execution ends undelivered (expired block, exhausted budget)."""
        return await phases.stop(self._pool, input)
