"""The LinkWorkflow's create activities (SPEC POST-1..4, REC-1..4): thin adapters over
`services.create`, and how every link activity runs a step: bound to the worker's pool
and HTTP client, its failures raised as the `ApplicationError` types the workflow knows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from protocol.messages import DispatchInput, MirrorInput, StepResult
from protocol.rate_limit import INTERACTIVE_PRIORITY
from protocol.timeouts import activity_time_left
from services.create.apply import write_mirror
from services.create.dispatch import dispatch_create
from services.dispatch_hooks import DispatchHooks
from services.link_step import LinkStep, StepFailed, StepRetry
from services.mirror import MIRROR_ATTEMPTS
from services.pacing import PaceSlot


def link_step(pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks) -> LinkStep:
    """The running activity as a step: its type names its spans, its heartbeat is Temporal's,
    its requests end before its start-to-close does (G-7)."""
    if not activity.in_activity():
        return LinkStep(pool, http, hooks, "transaction", activity.heartbeat)
    info = activity.info()
    rank = info.priority.priority_key or INTERACTIVE_PRIORITY
    deadline = _deadline(info)
    return LinkStep(pool, http, hooks, info.activity_type, activity.heartbeat, deadline, rank)


def _deadline(info: activity.Info) -> float | None:
    """When this try's start-to-close ends, on the event loop's clock."""
    if info.start_to_close_timeout is None:
        return None
    left = activity_time_left(info.start_to_close_timeout, info.started_time, datetime.now(UTC))
    return asyncio.get_running_loop().time() + left


def pace_slot() -> PaceSlot:
    """The budget slot this activity was scheduled for (its fairness key and weight)."""
    info = activity.info()
    return PaceSlot(info.task_queue, info.priority.fairness_key, info.priority.fairness_weight)


def step_error(error: StepFailed | StepRetry) -> ApplicationError:
    """A step's failure as Temporal's: a refusal is non-retryable (SPEC §5.4) and carries
    the link's durable view; a retry keeps the delay the remote asked for."""
    if isinstance(error, StepRetry):
        return ApplicationError(error.message, type=error.kind.value, next_retry_delay=error.delay)
    details = () if error.view is None else (error.view.model_dump(mode="json"),)
    return ApplicationError(error.message, *details, type=error.kind.value, non_retryable=True)


class LinkActivities:
    """The create path: claim, POST, finalize, mirror."""

    def __init__(
        self, pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks | None = None
    ) -> None:
        self._pool = pool
        self._http = http
        self._hooks = hooks or DispatchHooks()

    @activity.defn
    async def dispatch_create(self, input: DispatchInput) -> StepResult:
        """Claim and POST the pending create, or resume whatever a crash left behind; on a
        finalized link, send its queued PATCH instead."""
        step = link_step(self._pool, self._http, self._hooks)
        try:
            return await dispatch_create(step, input.link_key, pace_slot())
        except (StepFailed, StepRetry) as error:
            raise step_error(error) from None

    @activity.defn
    async def write_mirror(self, input: MirrorInput) -> StepResult:
        """Retry the compatibility mirror only; never re-POST (POST-3)."""
        step = link_step(self._pool, self._http, self._hooks)
        give_up = activity.info().attempt >= MIRROR_ATTEMPTS
        try:
            return await write_mirror(step, input.link_key, input.attempt_id, give_up)
        except StepRetry as error:
            raise step_error(error) from None
