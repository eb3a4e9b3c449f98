"""LinkWorkflow: one per link key, running create -> writeback -> PATCH (SPEC §5).

Theory of operation:
1. Postgres is the source of truth. The workflow holds no business state of its
   own: every step is an activity that reads the durable rows, decides with
   `protocol/` and moves them with compare-and-set. A duplicated or lost
   `record_saved` signal therefore changes nothing (WF-2).
2. Ambiguity is never retried. Activities raise non-retryable errors (§5.4)
   after persisting the parked state; the workflow publishes it
   (`NeedsOperator`) and waits for an operator update.
3. The run ends when idle and continues-as-new when history grows; the next
   save starts a fresh run that reloads everything from Postgres.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.link import LinkActivities
    from activities.link_ops import LinkOpsActivities
    from activities.rate_limit import RateLimitActivities

from protocol.errors import NON_RETRYABLE_ERROR_TYPES
from protocol.identity import link_workflow_id
from protocol.link_versions import (
    BORN_WITH,
    BOUNDED_RUNS,
    OPS_ATTRIBUTES,
    PARKED_STAYS_OPEN,
    REMOTE_BUDGET_PRIORITY,
    VISIBLE_PATCH_AMBIGUITY,
)
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    LinkView,
    LinkWorkflowInput,
    LinkWorkflowResult,
    LinkWorkflowState,
    MirrorInput,
    ParkInput,
    RecordSaved,
    RemoteEvidence,
    StepKind,
    StepResult,
)
from protocol.park import park_reason
from protocol.rate_limit import RemoteBudgetInput, RemoteBudgetResult
from protocol.states import AttemptStatus
from protocol.timeouts import LOCAL_ACTIVITY_START_TO_CLOSE, REMOTE_ACTIVITY_START_TO_CLOSE
from workflows import search_attributes as sa
from workflows.details import details_markdown
from workflows.link_operator import LinkOperatorUpdates
from workflows.link_retries import LOCAL_RETRY, REMOTE_RETRY

IDLE_TIMEOUT = timedelta(minutes=10)
ASSOCIATION_RECHECK = timedelta(seconds=60)
MAX_STEPS_PER_WAKE = 20


@workflow.defn
class LinkWorkflow(LinkOperatorUpdates):
    @workflow.init
    def __init__(self, input: LinkWorkflowInput) -> None:
        self._state = input.state or LinkWorkflowState(link_key=input.link_key)
        self._view = LinkView(link_key=input.link_key)
        self._loaded = False
        self._wake = True
        self._evidence: list[RemoteEvidence] = []
        self._published: dict[str, object] = {}
        # OPS_ATTRIBUTES: what the attributes should say once this drain settles.
        self._unflushed: list[tuple[SearchAttributeKey[Any], Any]] | None = None
        self._parked = False  # what NeedsOperator says (see _needs_operator)
        # PROF-3: known from the start input (or the previous run), else looked up once.
        budget = input.budget or (input.state.budget if input.state else None)
        self._budget: RemoteBudgetResult | None = budget
        self._priority: Priority | None = _priority_of(budget) if budget else None
        self._born_with = frozenset(input.patches)

    @workflow.signal
    def record_saved(self, signal: RecordSaved) -> None:
        """A save was admitted for this link: look for work in Postgres."""
        del signal
        self._wake = True

    @workflow.signal
    def remote_deleted(self, evidence: RemoteEvidence) -> None:
        """The remote reports the linked object deleted (ING-6): suspend, never re-create."""
        self._evidence.append(evidence)

    @workflow.query
    def state(self) -> LinkView:
        """The link, its newest attempt and queued PATCHes, as last read from Postgres."""
        return self._view.model_copy(update={"loaded": self._loaded})

    @workflow.run
    async def run(self, input: LinkWorkflowInput) -> LinkWorkflowResult:
        while True:
            await self._drain()
            self._flush_attributes()
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._flush_attributes()  # the next run starts with them
                workflow.continue_as_new(
                    LinkWorkflowInput(
                        link_key=input.link_key, state=self._next_state(), patches=BORN_WITH
                    )
                )
            if not await self._wait_for_work():
                return LinkWorkflowResult(link_key=input.link_key, reason="idle")

    async def _wait_for_work(self) -> bool:
        """True when woken (signal, or the LANE-2 re-check); False after an idle period."""
        if self._parked and self._patched(PARKED_STAYS_OPEN):
            # A parked link waits for its operator with no idle timeout, so the UI query
            # `NeedsOperator = true AND ExecutionStatus = "Running"` lists exactly the
            # links that need a person (a closed run's search attributes never change).
            await workflow.wait_condition(self._has_work)
            return True
        waiting = self._view.dispatch_lane == "deferred_association" and (
            self._view.attempt_status is AttemptStatus.PENDING
        )
        try:
            timeout = ASSOCIATION_RECHECK if waiting else IDLE_TIMEOUT
            await workflow.wait_condition(self._has_work, timeout=timeout)
        except TimeoutError:
            if waiting:  # a lost notification is covered by the periodic re-check
                self._wake = True
                return True
            await workflow.wait_condition(workflow.all_handlers_finished)
            return self._has_work()
        return True

    async def _wake_dependants(self, link_keys: list[str]) -> None:
        """Tell deferred creates that waited on this link that it is finalized (LANE-2)."""
        for key in link_keys:
            handle = workflow.get_external_workflow_handle(link_workflow_id(key))
            # Not running: the relay (or the next save) starts it; nothing is lost.
            with contextlib.suppress(FailureError):
                await handle.signal(LinkWorkflow.record_saved, RecordSaved())

    def _patched(self, patch_id: str) -> bool:
        """`workflow.patched`, except for a change the run was born with: no marker, no
        billed action (`protocol.link_versions`)."""
        return patch_id in self._born_with or workflow.patched(patch_id)

    def _has_work(self) -> bool:
        return self._wake or bool(self._evidence)

    async def _drain(self) -> None:
        steps = 0
        while self._has_work() and not self._yield_now(steps):
            steps += 1
            if self._evidence:
                await self._remote_evidence(self._evidence.pop(0))
                continue
            self._wake = False
            result = await self._create_step()
            await self._wake_dependants(result.dependants)
            if result.kind is StepKind.WRITEBACK_PENDING:
                result = await self._mirror(result.view)
            while result.kind is StepKind.FINALIZED and result.view.pending_patches:
                if self._yield_now(steps, patch_loop=True):
                    self._wake = True  # the queued PATCH is picked up after the check
                    break
                steps += 1
                result = await self._patch_step()
            if result.kind is StepKind.RETRY_LATER:
                await self._retry_later(result)
        if steps >= MAX_STEPS_PER_WAKE:
            self._wake = True  # more to do: continue after the continue-as-new check

    def _yield_now(self, steps: int, *, patch_loop: bool = False) -> bool:
        """Stop draining so the run reaches its continue-as-new check: history stays bounded
        (the PATCH loop had no bound; histories recorded before it still replay)."""
        over = steps >= MAX_STEPS_PER_WAKE
        if over and not patch_loop:
            return True  # the drain's original bound
        if not over and not workflow.info().is_continue_as_new_suggested():
            return False
        return self._patched(BOUNDED_RUNS)

    async def _retry_later(self, result: StepResult) -> None:
        """PROF-1: the remote said "not applied": wait in a timer, not in the retry budget."""
        delay = timedelta(seconds=result.retry_after_seconds or 1.0)
        await workflow.sleep(delay, summary=result.detail or "remote asked to retry later")
        self._wake = True

    async def _guarded(self, call: Awaitable[StepResult]) -> StepResult:
        """Run one activity step; publish its durable view whatever the outcome."""
        try:
            result = await call
        except ActivityError as err:
            result = await self._after_failure(err)
        self._publish(result.view)
        return result

    async def _create_step(self) -> StepResult:
        return await self._guarded(
            workflow.execute_activity_method(
                LinkActivities.dispatch_create,
                DispatchInput(link_key=self._state.link_key),
                start_to_close_timeout=REMOTE_ACTIVITY_START_TO_CLOSE,
                retry_policy=REMOTE_RETRY,
                summary="the pending create (claim, POST, finalize), else the queued PATCH",
                priority=await self._remote_priority(),
            )
        )

    async def _patch_step(self) -> StepResult:
        return await self._guarded(
            workflow.execute_activity_method(
                LinkOpsActivities.dispatch_patch,
                DispatchInput(link_key=self._state.link_key),
                start_to_close_timeout=REMOTE_ACTIVITY_START_TO_CLOSE,
                retry_policy=REMOTE_RETRY,
                summary="gate, build and send the queued PATCH",
                priority=await self._remote_priority(),
            )
        )

    async def _remote_priority(self) -> Priority:
        """The remote budget's fairness key (PROF-3): from the start input when the starter
        knew it, else resolved once per run from Postgres."""
        if self._priority is None:
            self._priority = Priority.default
            if self._patched(REMOTE_BUDGET_PRIORITY):
                self._budget = await workflow.execute_local_activity_method(
                    RateLimitActivities.remote_budget,
                    RemoteBudgetInput(link_key=self._state.link_key),
                    start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                    retry_policy=LOCAL_RETRY,
                    summary="which remote rate-limit budget this link spends",
                )
                self._priority = _priority_of(self._budget)
        return self._priority

    async def _mirror(self, view: LinkView) -> StepResult:
        assert view.attempt_id is not None
        return await self._guarded(
            workflow.execute_activity_method(
                LinkActivities.write_mirror,
                MirrorInput(link_key=self._state.link_key, attempt_id=view.attempt_id),
                start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                retry_policy=LOCAL_RETRY,
                summary="compatibility mirror writeback (never re-POSTs)",
            )
        )

    async def _remote_evidence(self, evidence: RemoteEvidence) -> StepResult:
        return await self._guarded(
            workflow.execute_activity_method(
                LinkOpsActivities.apply_remote_evidence,
                EvidenceInput(link_key=self._state.link_key, evidence=evidence),
                start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                retry_policy=LOCAL_RETRY,
                summary=f"remote evidence {evidence.reason} ({evidence.event_id})",
            )
        )

    async def _after_failure(self, err: ActivityError) -> StepResult:
        """Non-retryable: the state is durable, publish it. Retries exhausted: park it (REC-3)."""
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type in NON_RETRYABLE_ERROR_TYPES:
            details = cause.details[0] if cause.details else {}
            view = LinkView.model_validate(details) if details else self._view
            return StepResult(
                kind=StepKind.PARKED, view=view, detail=f"{cause.type}: {cause.message}"
            )
        return await workflow.execute_activity_method(
            LinkOpsActivities.park_exhausted,
            ParkInput(link_key=self._state.link_key, error=str(cause or err)),
            start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
            retry_policy=LOCAL_RETRY,
            summary="retries exhausted: park durably for an operator",
        )

    def _needs_operator(self, view: LinkView) -> bool:
        """A parked attempt, a suspended link, or a PATCH whose outcome is unknown (the
        remote may lag the record until a save converges it): listed for an operator."""
        if view.needs_operator:
            return True
        return view.patch_outcome_unknown and self._patched(VISIBLE_PATCH_AMBIGUITY)

    def _publish(self, view: LinkView) -> None:
        """Keep the query, the UI details and the WF-4 search attributes current."""
        self._view = view
        self._loaded = True
        self._parked = self._needs_operator(view)
        reason = park_reason(view) if self._parked else None
        if self._patched(OPS_ATTRIBUTES):
            # Upserted once the drain settles, not after every step: a create's passing
            # writeback_pending state never costs an upsert (each is a billed action).
            self._unflushed = sa.wanted_attributes(
                view, self._parked, reason.value if reason else None
            )
        else:
            self._upsert_wf4(view)
        workflow.set_current_details(details_markdown(view, reason))

    def _flush_attributes(self) -> None:
        """Upsert only the attributes whose value changed since the last upsert; the static
        ones arrive with the start options and are never sent again."""
        if self._unflushed is None:
            return
        current = workflow.info().typed_search_attributes
        changes = [
            key.value_set(value) if value is not None else key.value_unset()
            for key, value in self._unflushed
            if current.get(key) != value
        ]
        self._unflushed = None
        if changes:
            workflow.upsert_search_attributes(changes)

    def _upsert_wf4(self, view: LinkView) -> None:
        """Histories recorded before OPS-1: every WF-4 attribute at each change."""
        wanted: dict[str, object] = {
            sa.LINK_KEY.name: view.link_key,
            sa.CONNECTOR_OWNER_KEY.name: view.connector_owner_key,
            sa.DESTINATION_SLOT_ID.name: view.destination_slot_id,
            sa.SOURCE_OBJECT.name: view.source_object,
            sa.LINK_STATE.name: view.link_status.value if view.link_status else None,
            sa.ATTEMPT_STATUS.name: view.attempt_status.value if view.attempt_status else None,
            sa.NEEDS_OPERATOR.name: self._parked,
        }
        if wanted != self._published:
            workflow.upsert_search_attributes(_updates(view, self._parked))
            self._published = wanted

    def _next_state(self) -> LinkWorkflowState:
        return self._state.model_copy(update={"runs": self._state.runs + 1, "budget": self._budget})


def _priority_of(budget: RemoteBudgetResult) -> Priority:
    return Priority(fairness_key=budget.fairness_key, fairness_weight=budget.fairness_weight)


def _updates(view: LinkView, parked: bool) -> list[SearchAttributeUpdate[Any]]:
    pairs = [
        (sa.LINK_KEY, view.link_key),
        (sa.CONNECTOR_OWNER_KEY, view.connector_owner_key),
        (sa.DESTINATION_SLOT_ID, view.destination_slot_id),
        (sa.SOURCE_OBJECT, view.source_object),
        (sa.LINK_STATE, view.link_status.value if view.link_status else None),
        (sa.ATTEMPT_STATUS, view.attempt_status.value if view.attempt_status else None),
    ]
    updates: list[SearchAttributeUpdate[Any]] = [
        key.value_set(value) if value is not None else key.value_unset() for key, value in pairs
    ]
    updates.append(sa.NEEDS_OPERATOR.value_set(parked))
    return updates
