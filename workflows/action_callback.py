"""ActionCallbackWorkflow: completes one must-complete workflow action (SPEC ING-7).

Theory of operation:
1. The ingress answered BLOCK after committing the execution row; this workflow
   (id `action/{endpoint}/{callbackId}`, C-7: one per endpoint and callback id)
   then runs three phases, each persisted in that row before the next begins:
   enqueue the local work as a connector_event, observe the event's outcome,
   deliver the completion callback.
2. Each phase is one activity with its own retry policy and a
   schedule-to-close timeout cut at the block expiration, so no phase can eat
   another's budget past the point where the remote stops waiting. A phase
   that runs out stops the execution and records why.
3. A (re)started run reloads the row and resumes at its phase: no phase is
   repeated once persisted. A refused callback (401/403/4xx) is terminal and
   raises `NeedsOperator`.
4. The input carries ids only that the worker acts on (S-2): the execution id,
   checked against its row by every phase. Where the completion goes is the
   worker's own configuration, never the input's `target` (kept for old runs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, RetryState

from activities.action_callback import ActionCallbackActivities
from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    ActionCallbackInput,
    ActionCallbackResult,
    ActionPhase,
    DeliverInput,
    ExecutionIdInput,
    ExecutionView,
    PhaseBudget,
    StopInput,
    StopReason,
    phase_timeout,
)
from protocol.inbound import INBOUND_NON_RETRYABLE
from protocol.messages import Message
from protocol.timeouts import LOCAL_ACTIVITY_START_TO_CLOSE, REMOTE_ACTIVITY_START_TO_CLOSE
from workflows import search_attributes as sa

LOCAL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=sorted(INBOUND_NON_RETRYABLE),
)
NEEDS_OPERATOR_REASONS = frozenset(
    {
        StopReason.CALLBACK_UNAUTHORIZED,
        StopReason.CALLBACK_REJECTED,
        StopReason.BUDGET_EXHAUSTED,
        StopReason.CALLBACK_TARGET_UNKNOWN,
    }
)

P = TypeVar("P", bound=Message)


def _retry(budget: PhaseBudget) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=budget.initial_interval,
        backoff_coefficient=2.0,
        maximum_interval=budget.maximum_interval,
        maximum_attempts=budget.max_attempts,
        non_retryable_error_types=sorted(INBOUND_NON_RETRYABLE),
    )


@workflow.defn(name=ACTION_CALLBACK_WORKFLOW)
class ActionCallbackWorkflow:
    @workflow.init
    def __init__(self, input: ActionCallbackInput) -> None:
        self._input = input

    @workflow.run
    async def run(self, input: ActionCallbackInput) -> ActionCallbackResult:
        view = await self._load()
        budgets, key = input.budgets, ExecutionIdInput(execution_id=input.execution_id)
        if view.phase is ActionPhase.ADMITTED:
            view = await self._phase(
                view, budgets.enqueue, ActionCallbackActivities.enqueue, key, "1: enqueue"
            )
        if view.phase is ActionPhase.ENQUEUED:
            view = await self._phase(
                view, budgets.observe, ActionCallbackActivities.observe, key, "2: observe outcome"
            )
        if view.phase is ActionPhase.OBSERVED:
            assert view.outcome is not None
            deliver = DeliverInput(
                execution_id=view.execution_id,
                callback_id=view.callback_id,
                target=input.target,
                outcome=view.outcome,
            )
            view = await self._phase(
                view, budgets.deliver, ActionCallbackActivities.deliver, deliver, "3: deliver"
            )
        return self._finish(view)

    async def _load(self) -> ExecutionView:
        return await workflow.execute_activity_method(
            ActionCallbackActivities.load_execution,
            ExecutionIdInput(execution_id=self._input.execution_id),
            start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
            retry_policy=LOCAL_RETRY,
            summary="reload the execution",
        )

    async def _phase(
        self,
        view: ExecutionView,
        budget: PhaseBudget,
        method: Callable[[ActionCallbackActivities, P], Awaitable[ExecutionView]],
        arg: P,
        summary: str,
    ) -> ExecutionView:
        """Run one phase within its own budget, cut at the block expiration; stop if it runs out."""
        timeout = phase_timeout(budget, workflow.now(), view.expires_at)
        if timeout is None:
            return await self._stop(StopReason.EXPIRED)
        try:
            return await workflow.execute_activity_method(
                method,
                arg,
                start_to_close_timeout=min(timeout, REMOTE_ACTIVITY_START_TO_CLOSE),
                schedule_to_close_timeout=timeout,
                retry_policy=_retry(budget),
                summary=f"phase {summary}",
            )
        except ActivityError as err:
            # The server gives up early when the next retry would land past the timeout,
            # so "timed out against a cut made by the expiration" is what expiry means.
            cut_by_expiry = timeout < budget.max_duration
            expired = err.retry_state is RetryState.TIMEOUT and cut_by_expiry
            if expired or workflow.now() >= view.expires_at:
                return await self._stop(StopReason.EXPIRED)
            return await self._stop(StopReason.BUDGET_EXHAUSTED)

    async def _stop(self, reason: StopReason) -> ExecutionView:
        return await workflow.execute_activity_method(
            ActionCallbackActivities.stop,
            StopInput(execution_id=self._input.execution_id, reason=reason),
            start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
            retry_policy=LOCAL_RETRY,
            summary=f"stop: {reason.value}",
        )

    def _finish(self, view: ExecutionView) -> ActionCallbackResult:
        needs_operator = view.phase is ActionPhase.STOPPED and view.stop_reason in {
            r.value for r in NEEDS_OPERATOR_REASONS
        }
        if needs_operator:
            workflow.upsert_search_attributes([sa.NEEDS_OPERATOR.value_set(True)])
        workflow.set_current_details(
            f"**phase** `{view.phase}` outcome `{view.outcome or '-'}` "
            f"callback `{view.callback_status or '-'}` {view.stop_reason or ''}"
        )
        return ActionCallbackResult(
            execution_id=view.execution_id,
            phase=view.phase,
            outcome=view.outcome,
            callback_status=view.callback_status,
            stop_reason=view.stop_reason,
            needs_operator=needs_operator,
        )
