"""Starting processing after commit (SPEC ING-6, ING-7): bounded, and never part of a response.

The 2xx follows the commit alone. Starting the workflow is attempted afterwards
in the background, each start bounded in time; a start that fails leaves
`workflow_started_at` NULL and the relay starts it later. Starts are
idempotent: a running workflow is reused, a completed one is not repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from typing import Any, Final

import asyncpg
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from db.bounded import bounded_transaction
from db.ingress_queries import UnstartedExecution, mark_events_started, mark_execution_started
from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    ActionCallbackInput,
    action_workflow_id,
)
from protocol.inbound import INBOUND_EVENT_WORKFLOW, InboundEventInput, event_workflow_id
from protocol.ingress_policy import IngressPolicy, WorkflowActionEndpoint, WorkflowActionMode
from services.logthrottle import ThrottledLog

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

START_TIMEOUT_S: Final = 2.0


class WorkflowStarter:
    """Starts InboundEventWorkflow / ActionCallbackWorkflow runs and records that they exist."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        policy: IngressPolicy,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self._client = client
        self._task_queue = task_queue
        self._timeout_s = timeout_s
        self._actions = {
            e.name: e for e in policy.endpoints if isinstance(e, WorkflowActionEndpoint)
        }
        # ING-7: execution is enabled by the one mode switch; disabled, no callback
        # workflow starts, whoever asks (the request's own start or the relay).
        self.actions_enabled = policy.workflow_action_mode is WorkflowActionMode.PROXY

    async def _start(self, workflow: str, arg: object, workflow_id: str) -> None:
        # A completed run keeps its id (its work is done); a failed one may run again.
        with contextlib.suppress(WorkflowAlreadyStartedError):
            async with asyncio.timeout(self._timeout_s):
                await self._client.start_workflow(
                    workflow,
                    arg,
                    id=workflow_id,
                    task_queue=self._task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                )

    async def start_events(self, pool: asyncpg.Pool, event_ids: Sequence[str]) -> int:
        """Start each event's processing; returns how many were started (and marked)."""
        started = []
        for event_id in event_ids:
            try:
                await self._start(
                    INBOUND_EVENT_WORKFLOW,
                    InboundEventInput(event_id=event_id),
                    event_workflow_id(event_id),
                )
            except Exception as exc:  # Temporal unreachable or slow: the relay retries
                warn.warning("could not start event workflow: %s", type(exc).__name__)
                break
            started.append(event_id)
        if started:
            async with asyncio.timeout(self._timeout_s), bounded_transaction(pool) as conn:
                await mark_events_started(conn, started)
        return len(started)

    async def start_execution(self, pool: asyncpg.Pool, execution: UnstartedExecution) -> bool:
        """Start the callback workflow of one must-complete execution; False if it failed
        or workflow actions are disabled (the row is left as it is)."""
        if not self.actions_enabled:
            return False
        endpoint = self._actions.get(execution.endpoint)
        if endpoint is None or endpoint.callback_base_url is None:
            warn.warning("no callback target for endpoint %s", execution.endpoint)
            return False
        # Ids only (S-2): the worker resolves the completion target from its own policy.
        arg = ActionCallbackInput(
            execution_id=execution.execution_id, callback_id=execution.callback_id
        )
        try:
            workflow_id = action_workflow_id(execution.endpoint, execution.callback_id)
            await self._start(ACTION_CALLBACK_WORKFLOW, arg, workflow_id)
        except Exception as exc:
            warn.warning("could not start action workflow: %s", type(exc).__name__)
            return False
        async with asyncio.timeout(self._timeout_s), bounded_transaction(pool) as conn:
            await mark_execution_started(conn, execution.execution_id)
        return True


class Background:
    """Fire-and-forget tasks the app owns: kept referenced, cancelled at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            warn.warning("background start failed: %s", type(task.exception()).__name__)

    async def idle(self) -> None:
        """Wait until every spawned task has finished (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
