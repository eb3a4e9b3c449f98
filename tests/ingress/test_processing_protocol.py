"""The pure parts of processing: the handler plan, completion eligibility, callback verdicts,
and the names the ingress uses to start workflows it may not import."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio import workflow

from protocol.action_callback import (
    ACTION_CALLBACK_WORKFLOW,
    PHASE_TRANSITIONS,
    ActionPhase,
    CallbackVerdict,
    CompletionState,
    PhaseBudget,
    callback_verdict,
    check_phase_transition,
    completion_for,
    phase_timeout,
)
from protocol.inbound import (
    INBOUND_EVENT_WORKFLOW,
    LINK_WORKFLOW,
    REMOTE_DELETED_SIGNAL,
    EventReason,
    EventStatus,
    EventView,
    PlanKind,
    check_event_transition,
    plan_event,
)
from protocol.states import ProtocolError
from workflows.action_callback import ActionCallbackWorkflow
from workflows.inbound import InboundEventWorkflow
from workflows.link import LinkWorkflow


def test_workflow_and_signal_names_match_the_classes() -> None:
    link = workflow._Definition.must_from_class(LinkWorkflow)
    assert link.name == LINK_WORKFLOW and REMOTE_DELETED_SIGNAL in link.signals
    assert workflow._Definition.must_from_class(InboundEventWorkflow).name == INBOUND_EVENT_WORKFLOW
    callback = workflow._Definition.must_from_class(ActionCallbackWorkflow)
    assert callback.name == ACTION_CALLBACK_WORKFLOW


def deletion(**fields: object) -> EventView:
    base: dict[str, object] = {
        "event_id": "ev1_x",
        "handler": "remote_deletion",
        "status": EventStatus.ADMITTED,
        "target_object": "contacts",
        "remote_object_id": "1001",
        "remote_scope": "sandbox-portal",
    }
    return EventView.model_validate(base | fields)


@pytest.mark.parametrize(
    ("event", "links", "expected"),
    [
        (deletion(), ["lk1_b", "lk1_a"], (PlanKind.SUSPEND_LINKS, EventStatus.PROCESSED)),
        (deletion(), [], (PlanKind.SETTLE, EventStatus.SKIPPED, EventReason.NO_FINALIZED_LINK)),
        (
            deletion(remote_object_id=None),
            ["lk1_a"],
            (PlanKind.SETTLE, EventStatus.DEAD, EventReason.MISSING_OBJECT_ID),
        ),
        (
            deletion(target_object=None),
            ["lk1_a"],
            (PlanKind.SETTLE, EventStatus.DEAD, EventReason.MISSING_TARGET_OBJECT),
        ),
        (
            deletion(remote_scope=None),
            ["lk1_a"],
            (PlanKind.SETTLE, EventStatus.SKIPPED, EventReason.UNMAPPED_REMOTE_SCOPE),
        ),
        (
            deletion(handler="remote_property_change"),
            ["lk1_a"],
            (PlanKind.SETTLE, EventStatus.SKIPPED, EventReason.NO_INBOUND_MAPPING),
        ),
        (
            deletion(handler="unrouted"),
            [],
            (PlanKind.SETTLE, EventStatus.SKIPPED, EventReason.NO_HANDLER),
        ),
        (
            deletion(status=EventStatus.DEAD),
            ["lk1_a"],
            (PlanKind.ALREADY_SETTLED, EventStatus.DEAD),
        ),
    ],
)
def test_plan_event(event: EventView, links: list[str], expected: tuple[object, ...]) -> None:
    plan = plan_event(event, links)
    assert (plan.kind, plan.status, plan.reason)[: len(expected)] == expected
    if plan.kind is PlanKind.SUSPEND_LINKS:
        assert plan.link_keys == ("lk1_a", "lk1_b")


def test_only_processed_makes_success_eligible() -> None:
    assert completion_for(EventStatus.PROCESSED) is CompletionState.SUCCESS
    assert completion_for(EventStatus.SKIPPED) is CompletionState.FAIL_CONTINUE
    assert completion_for(EventStatus.DEAD) is CompletionState.FAIL_CONTINUE
    with pytest.raises(ProtocolError):
        completion_for(EventStatus.ADMITTED)


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (204, CallbackVerdict.DELIVERED),
        (200, CallbackVerdict.DELIVERED),
        (409, CallbackVerdict.DELIVERED),
        (429, CallbackVerdict.RETRY),
        (500, CallbackVerdict.RETRY),
        (503, CallbackVerdict.RETRY),
        (None, CallbackVerdict.RETRY),
        (401, CallbackVerdict.UNAUTHORIZED),
        (403, CallbackVerdict.UNAUTHORIZED),
        (400, CallbackVerdict.REJECTED),
        (404, CallbackVerdict.REJECTED),
    ],
)
def test_callback_verdicts(status: int | None, verdict: CallbackVerdict) -> None:
    assert callback_verdict(status) is verdict


def test_phase_timeout_is_cut_at_the_block_expiration() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    budget = PhaseBudget(max_duration=timedelta(hours=1))
    assert phase_timeout(budget, now, now + timedelta(days=1)) == timedelta(hours=1)
    assert phase_timeout(budget, now, now + timedelta(minutes=5)) == timedelta(minutes=5)
    assert phase_timeout(budget, now, now) is None


def test_lifecycles_are_forward_only() -> None:
    check_event_transition(EventStatus.ADMITTED, EventStatus.PROCESSED)
    with pytest.raises(ProtocolError):
        check_event_transition(EventStatus.SKIPPED, EventStatus.PROCESSED)
    order = list(ActionPhase)
    for source, targets in PHASE_TRANSITIONS.items():
        for target in targets:
            check_phase_transition(source, target)
            assert target is ActionPhase.STOPPED or order.index(target) == order.index(source) + 1
    with pytest.raises(ProtocolError):
        check_phase_transition(ActionPhase.DELIVERED, ActionPhase.STOPPED)
