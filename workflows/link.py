"""LinkWorkflow: one per link key, running create -> writeback -> PATCH (SPEC §5).

Theory of operation:
1. Postgres is the source of truth. The workflow holds no business state of its
   own: every step is an activity that reads the durable rows, decides with
   `protocol/` and moves them with compare-and-set. A duplicated or lost
   `record_saved` signal therefore changes nothing (WF-2).
2. Ambiguity is never retried. Activities raise non-retryable errors (§5.4)
   after persisting the parked state; the workflow publishes it
   (`NeedsOperator`) and waits for an operator update.
3. A run ends when its work is done (WF-1'): once a drain finds no work, the run
   completes at once, unless it is parked (it stays open for its operator: the UI's
   updates need a running workflow, and `NeedsOperator = true AND ExecutionStatus =
   "Running"` lists exactly those), waiting in the deferred lane (it re-checks every
   `ASSOCIATION_RECHECK`), or held for an operator (`RecordSaved.for_operator`: the CLI
   wakes the link, reads its state, then sends its update; the run stays open until
   `OPERATOR_HOLD` passes with no update, so the update lands, and a command re-run
   after a lost reply gets the first answer back by its update id). No idle timer. The
   next save's signal-with-start opens a new run, which reloads from Postgres; a run
   continues-as-new before its history grows large, carrying what its signals queued
   (G-8: remote evidence, an operator hold, the bulk flag; `_next_state`).
   No signal is lost at the end: the run re-checks for work after every handler has
   finished, in the workflow task that completes it, and a signal that reaches the
   server while that task runs makes the server refuse the completion (the task has
   unhandled events) and deliver the signal in a new task, whose handler sets the wake
   flag before the loop looks again (tests/e2e/test_run_lifecycle.py holds a completing
   task open and signals into it). A signal after the completion starts the next run.
4. Search attributes: the starter sets the static ones (the link's own facts,
   `workflows.search_attributes.start_attributes`); a run upserts the state ones
   (`LinkState`, `AttemptStatus`, `RemoteId`, `NeedsOperator`, `ParkReason`) once its
   drain settles, and only values that changed. A run that completes cleanly — a create
   or a PATCH that needs no one — upserts nothing: it only corrects a state attribute
   it already carries (e.g. `NeedsOperator` after a reconcile). Decision (NF-6):
   a closed run's state attributes would be a copy of Postgres frozen at its close,
   read by nobody the product relies on — the operator's query is over running runs,
   and `connector-push links find --remote-id/--record-id` and `links show` answer
   from Postgres, the source of truth, even with Temporal down — while each upsert is
   a billed action (a third of a create's cost). So a clean create is two actions
   (signal-with-start, the activity) and a PATCH two (signal-with-start, the
   activity); closed runs are found by the static `SourceRecordId` / `LinkKey`.
5. Workflow versions (SPEC VER-1; this is the rule's one home): the committed
   histories in tests/replay/histories are the 1.0 release's baseline, recorded
   from the released code (histories/pre-1.0/ keeps those recorded before it, which
   still replay). After the release, every change to workflow code that
   changes its commands (a new or moved activity, timer, upsert, signal, update or
   continue-as-new in an existing path) goes behind `workflow.patched(<change id>)`
   — or into a new workflow type — and a history recorded before the change must
   still replay (tests/replay/test_replay.py; record new ones with RECORD_HISTORIES=1,
   tests/e2e/test_replay_sources.py). A branch is removed only once no open run and
   no kept history can reach it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.link import LinkActivities
    from activities.link_ops import LinkOpsActivities
    from activities.rate_limit import RateLimitActivities

from protocol.errors import NON_RETRYABLE_ERROR_TYPES
from protocol.identity import link_workflow_id
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
from protocol.rate_limit import (
    RemoteBudgetInput,
    RemoteBudgetResult,
    fairness_key_for,
    remote_priority_key,
)
from protocol.states import AttemptStatus
from protocol.timeouts import LOCAL_ACTIVITY_START_TO_CLOSE, REMOTE_ACTIVITY_START_TO_CLOSE
from workflows import search_attributes as sa
from workflows.details import details_markdown
from workflows.link_operator import LinkOperatorUpdates
from workflows.link_retries import LOCAL_RETRY, REMOTE_RETRY

ASSOCIATION_RECHECK = timedelta(seconds=60)
# How long a run stays open for an operator with no update: the CLI sends its update as
# soon as the run has loaded the link (its own load timeout is 30 s), and may re-run it.
OPERATOR_HOLD = timedelta(seconds=60)
MAX_STEPS_PER_WAKE = 20
# REC-3: a link whose newest PATCH failed is listed for an operator (workflow.patched: a
# run recorded before this lists it as it did then).
PATCH_FAILED_LISTED = "patch-failed-listed"


@workflow.defn
class LinkWorkflow(LinkOperatorUpdates):
    @workflow.init
    def __init__(self, input: LinkWorkflowInput) -> None:
        self._state = input.state or LinkWorkflowState(link_key=input.link_key)
        self._view = LinkView(link_key=input.link_key)
        self._loaded = False
        self._wake = True
        # G-8: what the previous run's signals left unhandled carries over.
        self._hold = self._state.hold  # an operator command's update is on its way
        self._evidence: list[RemoteEvidence] = list(self._state.evidence)
        # What the attributes should say once this drain settles (None: nothing new).
        self._unflushed: list[tuple[SearchAttributeKey[Any], Any]] | None = None
        self._parked = False  # what NeedsOperator says (see _needs_operator)
        # PROF-3: known from the start input (or the previous run), else looked up once.
        budget = input.budget or (input.state.budget if input.state else None)
        self._budget: RemoteBudgetResult | None = budget
        self._priority: Priority | None = _priority_of(budget) if budget else None
        # NF-8: only bulk (`push`) saves woke this run: its remote steps yield to single
        # saves. None until the first signal (or as the previous run left it, G-8); any
        # save that is not bulk clears it.
        self._bulk: bool | None = self._state.bulk

    @workflow.signal
    def record_saved(self, signal: RecordSaved) -> None:
        """A save was admitted for this link (or an operator command is about to act on
        it): look for work in Postgres."""
        self._wake = True
        self._hold = self._hold or signal.for_operator
        self._bulk = signal.bulk and self._bulk is not False

    @workflow.signal
    def remote_deleted(self, evidence: RemoteEvidence) -> None:
        """The remote reports the linked object deleted (ING-6): suspend, never re-create.
        Only an event id is taken from the signal: the activity suspends only for a
        deletion event Postgres holds for this link's object (S-2)."""
        self._evidence.append(evidence)

    @workflow.query
    def state(self) -> LinkView:
        """The link, its newest attempt and queued PATCHes, as last read from Postgres."""
        return self._view.model_copy(update={"loaded": self._loaded})

    @workflow.run
    async def run(self, input: LinkWorkflowInput) -> LinkWorkflowResult:
        while True:
            await self._drain()
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._flush_attributes()  # the next run starts with them
                workflow.continue_as_new(
                    LinkWorkflowInput(link_key=input.link_key, state=self._next_state())
                )
            if self._has_work():
                continue  # the drain stopped at its step bound
            if self._parked or self._deferred():
                self._flush_attributes()  # what the UI lists while the run stays open
                await self._wait_for_work()
                continue
            if self._hold:
                self._flush_attributes(closing=True)  # e.g. NeedsOperator after a repair
                await self._wait_for_operator()
                continue
            # Done (WF-1'): let running updates finish, look once more, then complete. A
            # signal arriving while this task runs fails the completion (module doc, 3).
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._has_work() or self._hold:
                continue
            self._flush_attributes(closing=True)
            return LinkWorkflowResult(link_key=input.link_key, reason="done")

    def _deferred(self) -> bool:
        return self._view.dispatch_lane == "deferred_association" and (
            self._view.attempt_status is AttemptStatus.PENDING
        )

    async def _wait_for_work(self) -> None:
        """Parked: until a signal or an update brings work (no timer). Deferred: the same,
        or the periodic re-check (LANE-2: a lost notification is covered)."""
        self._hold = False  # the run stays open anyway
        if self._parked:
            # `NeedsOperator = true AND ExecutionStatus = "Running"` lists exactly the
            # links that need a person.
            await workflow.wait_condition(self._has_work)
            return
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                self._has_work,
                timeout=ASSOCIATION_RECHECK,
                timeout_summary="deferred association re-check",
            )
        self._wake = True  # woken, or the periodic re-check

    async def _wait_for_operator(self) -> None:
        """An operator command woke the run, or an update just ran: stay open for the
        operator's update (or a re-run's) until OPERATOR_HOLD passes with none; a save
        or an update meanwhile is drained first, and the hold starts again."""
        try:
            await workflow.wait_condition(
                self._has_work,
                timeout=OPERATOR_HOLD,
                timeout_summary="held open for the operator's update",
            )
        except TimeoutError:
            self._hold = False

    async def _wake_dependants(self, link_keys: list[str]) -> None:
        """Tell deferred creates that waited on this link that it is finalized (LANE-2)."""
        for key in link_keys:
            handle = workflow.get_external_workflow_handle(link_workflow_id(key))
            # Not running: the relay (or the next save) starts it; nothing is lost.
            with contextlib.suppress(FailureError):
                await handle.signal(LinkWorkflow.record_saved, RecordSaved())

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
                if self._yield_now(steps):
                    self._wake = True  # the queued PATCH is picked up after the check
                    break
                steps += 1
                result = await self._patch_step()
            if result.kind is StepKind.RETRY_LATER:
                await self._retry_later(result)
        if steps >= MAX_STEPS_PER_WAKE:
            self._wake = True  # more to do: continue after the continue-as-new check

    def _yield_now(self, steps: int) -> bool:
        """Stop draining so the run reaches its continue-as-new check: history stays bounded
        (also inside the PATCH loop, which saves arriving without pause keep busy)."""
        return steps >= MAX_STEPS_PER_WAKE or workflow.info().is_continue_as_new_suggested()

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
        knew it, else resolved once per run from Postgres. A single save's steps use the
        budget's other key and a higher priority, so they do not queue behind its bulk
        `push` (NF-8); the slots in Postgres cap the two keys together."""
        if self._priority is None:
            self._budget = await workflow.execute_local_activity_method(
                RateLimitActivities.remote_budget,
                RemoteBudgetInput(link_key=self._state.link_key),
                start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                retry_policy=LOCAL_RETRY,
                summary="which remote rate-limit budget this link spends",
            )
            self._priority = _priority_of(self._budget)
        bulk = bool(self._bulk)
        key = fairness_key_for(self._priority.fairness_key, bulk)
        return replace(self._priority, fairness_key=key, priority_key=remote_priority_key(bulk))

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
        """A parked attempt, a suspended link, or a PATCH whose outcome is unknown or that
        failed (REC-3: the remote lags the record until a save converges it): listed for
        an operator. Runs recorded before a failed PATCH was listed keep their answer."""
        if view.needs_operator or view.patch_outcome_unknown:
            return True
        return view.patch_failed and workflow.patched(PATCH_FAILED_LISTED)

    def _publish(self, view: LinkView) -> None:
        """Keep the query, the UI details and the WF-4 search attributes current."""
        self._view = view
        self._loaded = True
        self._parked = self._needs_operator(view)
        reason = park_reason(view) if self._parked else None
        # Upserted once the drain settles, not after every step: a create's passing
        # writeback_pending state never costs an upsert (each is a billed action).
        self._unflushed = sa.wanted_attributes(view, self._parked, reason.value if reason else None)
        workflow.set_current_details(details_markdown(view, reason))

    def _flush_attributes(self, *, closing: bool = False) -> None:
        """Upsert only the attributes whose value changed since the last upsert; the static
        ones arrive with the start options and are never sent again. A closing run upserts
        only to correct a state attribute it carries (module doc, 4)."""
        if self._unflushed is None:
            return
        current = workflow.info().typed_search_attributes
        changed = [(key, value) for key, value in self._unflushed if current.get(key) != value]
        self._unflushed = None
        if closing and all(current.get(key) is None for key, _ in changed):
            return  # a clean close: nothing it carries is wrong, nothing new is billed
        if changed:
            workflow.upsert_search_attributes(
                [key.value_set(v) if v is not None else key.value_unset() for key, v in changed]
            )

    def _next_state(self) -> LinkWorkflowState:
        """G-8: the next run gets every queued signal's effect (a save's wake it has anyway)."""
        carried = {"evidence": list(self._evidence), "hold": self._hold, "bulk": self._bulk}
        return self._state.model_copy(
            update={"runs": self._state.runs + 1, "budget": self._budget, **carried}
        )


def _priority_of(budget: RemoteBudgetResult) -> Priority:
    return Priority(fairness_key=budget.fairness_key, fairness_weight=budget.fairness_weight)
