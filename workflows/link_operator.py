"""The link workflow's operator updates (WF-3): supersede, reconcile, retire, mark
terminal and revalidate.

`LinkWorkflow` inherits them. Each validator refuses in one line the UI / CLI shows,
before anything is recorded; each update applies its action through one
compare-and-set activity and republishes the link's view.
"""

from __future__ import annotations

from pydantic import JsonValue
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.link_ops import LinkOpsActivities

from protocol.messages import (
    LinkView,
    LinkWorkflowState,
    MarkTerminalInput,
    OperatorActionInput,
    OperatorInput,
    OperatorResult,
    ReconcileInput,
    RetireInput,
    RevalidateInput,
    SupersedeInput,
)
from protocol.operator import OperatorAction, check_operator_action
from protocol.states import ProtocolError
from protocol.timeouts import LOCAL_ACTIVITY_START_TO_CLOSE
from protocol.update_input import InputT
from workflows.link_retries import LOCAL_RETRY
from workflows.refusals import activity_refusal, parse_input, refused


class LinkOperatorUpdates:
    """The operator updates of `LinkWorkflow`, which owns the state they read and publish."""

    _state: LinkWorkflowState
    _view: LinkView
    _loaded: bool
    _wake: bool
    _hold: bool

    def _publish(self, view: LinkView) -> None:
        raise NotImplementedError  # LinkWorkflow keeps the query, details and attributes

    async def _operate(self, request: OperatorActionInput) -> OperatorResult:
        await workflow.wait_condition(lambda: self._loaded)
        try:
            result = await workflow.execute_activity_method(
                LinkOpsActivities.apply_operator_action,
                request,
                start_to_close_timeout=LOCAL_ACTIVITY_START_TO_CLOSE,
                retry_policy=LOCAL_RETRY,
                summary=f"operator {request.action} by {request.operator}",
            )
        except ActivityError as err:
            # The compare-and-set refused (the rows moved since the validator ran): one
            # readable line for the UI / CLI, not the activity's failure chain.
            raise refused(activity_refusal(err)) from None
        finally:
            # Stay open a while for the operator: a command re-run after a lost reply
            # (same update id) gets this answer back instead of a refusal.
            self._hold = True
        self._publish(result.view)
        self._wake = True  # a reconciled or newly reserved attempt has work to do
        return result

    def _action(self, action: OperatorAction, request: OperatorInput) -> OperatorActionInput:
        update = workflow.current_update_info()  # set: every caller is an update handler
        return OperatorActionInput(
            link_key=self._state.link_key,
            action=action,
            operator=request.operator,
            reason=request.reason,
            accepted_at=workflow.now(),
            update_id=update.id if update is not None else None,
        )

    def _validate(self, action: OperatorAction, model: type[InputT], raw: object) -> InputT:
        """The parsed input, or a one-line refusal the UI / CLI shows before anything is
        recorded (missing or bad fields named, then whether the action applies)."""
        request = parse_input(action, model, raw)
        if not self._loaded:
            raise refused("link state is still loading; retry in a moment")
        try:
            check_operator_action(action, self._view)
        except ProtocolError as error:
            raise refused(str(error)) from None
        return request

    # Each update takes any JSON (the UI sends what the operator typed) and parses it in
    # its validator, so a missing field is named instead of "Failed decoding arguments".

    @workflow.update
    async def supersede(self, request: SupersedeInput | JsonValue = None) -> OperatorResult:
        """terminal_failed -> superseded, optionally reserving the next attempt."""
        request = parse_input(OperatorAction.SUPERSEDE, SupersedeInput, request)
        base = self._action(OperatorAction.SUPERSEDE, request)
        key = str(workflow.uuid4()) if request.reserve_next else None
        update = {"reserve_next": request.reserve_next, "new_idempotency_key": key}
        return await self._operate(base.model_copy(update=update))

    @supersede.validator
    def _validate_supersede(self, request: SupersedeInput | JsonValue = None) -> None:
        self._validate(OperatorAction.SUPERSEDE, SupersedeInput, request)

    @workflow.update
    async def reconcile(self, request: ReconcileInput | JsonValue = None) -> OperatorResult:
        """ambiguous_remote_effect -> writeback_pending with an operator-proven remote id."""
        request = parse_input(OperatorAction.RECONCILE, ReconcileInput, request)
        base = self._action(OperatorAction.RECONCILE, request)
        update = {"remote_id": request.remote_id, "evidence": request.evidence}
        return await self._operate(base.model_copy(update=update))

    @reconcile.validator
    def _validate_reconcile(self, request: ReconcileInput | JsonValue = None) -> None:
        # PROF-4 (canonical id) and ID-4 are checked by the activity, which can name the
        # link that owns the id; a refusal there changes nothing either.
        self._validate(OperatorAction.RECONCILE, ReconcileInput, request)

    @workflow.update
    async def retire(self, request: RetireInput | JsonValue = None) -> OperatorResult:
        """finalized | suspended_drift -> retired."""
        parsed = parse_input(OperatorAction.RETIRE, RetireInput, request)
        return await self._operate(self._action(OperatorAction.RETIRE, parsed))

    @retire.validator
    def _validate_retire(self, request: RetireInput | JsonValue = None) -> None:
        self._validate(OperatorAction.RETIRE, RetireInput, request)

    @workflow.update
    async def mark_terminal(self, request: MarkTerminalInput | JsonValue = None) -> OperatorResult:
        """A pending or parked attempt -> terminal_failed, so it can be superseded."""
        parsed = parse_input(OperatorAction.MARK_TERMINAL, MarkTerminalInput, request)
        return await self._operate(self._action(OperatorAction.MARK_TERMINAL, parsed))

    @mark_terminal.validator
    def _validate_mark_terminal(self, request: MarkTerminalInput | JsonValue = None) -> None:
        self._validate(OperatorAction.MARK_TERMINAL, MarkTerminalInput, request)

    @workflow.update
    async def revalidate(self, request: RevalidateInput | JsonValue = None) -> OperatorResult:
        """suspended_drift -> finalized on the active pack's snapshots (not the mapping)."""
        parsed = parse_input(OperatorAction.REVALIDATE, RevalidateInput, request)
        return await self._operate(self._action(OperatorAction.REVALIDATE, parsed))

    @revalidate.validator
    def _validate_revalidate(self, request: RevalidateInput | JsonValue = None) -> None:
        self._validate(OperatorAction.REVALIDATE, RevalidateInput, request)
