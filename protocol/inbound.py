"""Processing admitted inbound events (SPEC ING-6): outcomes, reasons, and the handler table.

Rules kept in this module:
1. An event is `admitted` until exactly one processing decision moves it to
   `processed`, `skipped` or `dead`, always with a reason from `EventReason`;
   `EVENT_TRANSITIONS` is the whole lifecycle.
2. `plan_event` is the only place that decides what a handler does with an
   event; activities gather its inputs (the row, the owning links) and carry out
   the plan, workflows only sequence them.
3. Workflows are started by the ingress, which may not import `workflows/`:
   the workflow type names, ids and signal names they share live here, and a
   test keeps them equal to the classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

from protocol.identity import LINK_WORKFLOW_TYPE
from protocol.identity import link_workflow_id as link_workflow_id
from protocol.ingress_policy import InboundHandler
from protocol.messages import Message
from protocol.states import EVENT_TRANSITIONS, check_transition
from protocol.states import EventStatus as EventStatus  # re-exported: one home in states

INBOUND_EVENT_WORKFLOW: Final = "InboundEventWorkflow"
LINK_WORKFLOW: Final = LINK_WORKFLOW_TYPE
REMOTE_DELETED_SIGNAL: Final = "remote_deleted"


def event_workflow_id(event_id: str) -> str:
    """One processing workflow per admitted event."""
    return f"event/{event_id}"


def check_event_transition(source: EventStatus, target: EventStatus) -> None:
    check_transition("event", EVENT_TRANSITIONS, source, target)


class InboundErrorType(StrEnum):
    """`ApplicationError.type` of the inbound activities; only the first two never retry."""

    UNKNOWN_EVENT = "UnknownEvent"
    UNKNOWN_EXECUTION = "UnknownExecution"
    EVENT_NOT_SETTLED = "EventNotSettled"
    CALLBACK_NOT_DELIVERED = "CallbackNotDelivered"


INBOUND_NON_RETRYABLE: Final = frozenset(
    {InboundErrorType.UNKNOWN_EVENT.value, InboundErrorType.UNKNOWN_EXECUTION.value}
)


class EventReason(StrEnum):
    """Why an event ended as it did: one closed set, stored as `status_reason`."""

    LINK_SUSPEND_SIGNALLED = "link_suspend_signalled"
    NO_FINALIZED_LINK = "no_finalized_link"
    NO_INBOUND_MAPPING = "no_inbound_mapping"
    NO_HANDLER = "no_handler"
    MISSING_OBJECT_ID = "missing_object_id"
    MISSING_TARGET_OBJECT = "missing_target_object"
    UNMAPPED_REMOTE_SCOPE = "unmapped_remote_scope"
    PROCESSING_FAILED = "processing_failed"


class EventView(Message):
    """An event row as processing sees it."""

    event_id: str
    handler: str
    status: EventStatus
    status_reason: str | None = None
    target_object: str | None = None
    remote_object_id: str | None = None
    remote_scope: str | None = None


class PlanKind(StrEnum):
    SETTLE = "settle"  # end the event now with `status` / `reason`
    SUSPEND_LINKS = "suspend_links"  # signal each link's workflow, then end `processed`
    ALREADY_SETTLED = "already_settled"  # a re-run: nothing to do


class EventPlan(Message):
    kind: PlanKind
    status: EventStatus
    reason: EventReason | None = None
    link_keys: tuple[str, ...] = ()


def _settle(status: EventStatus, reason: EventReason) -> EventPlan:
    return EventPlan(kind=PlanKind.SETTLE, status=status, reason=reason)


def _remote_deletion(event: EventView, owning_links: Sequence[str]) -> EventPlan:
    if event.remote_object_id is None:
        return _settle(EventStatus.DEAD, EventReason.MISSING_OBJECT_ID)
    if event.target_object is None:
        return _settle(EventStatus.DEAD, EventReason.MISSING_TARGET_OBJECT)
    if event.remote_scope is None:
        # The account is not mapped to a remote scope: suspending by object id alone
        # could hit another account's link (fail closed: suspend nothing).
        return _settle(EventStatus.SKIPPED, EventReason.UNMAPPED_REMOTE_SCOPE)
    if not owning_links:
        return _settle(EventStatus.SKIPPED, EventReason.NO_FINALIZED_LINK)
    return EventPlan(
        kind=PlanKind.SUSPEND_LINKS,
        status=EventStatus.PROCESSED,
        reason=EventReason.LINK_SUSPEND_SIGNALLED,
        link_keys=tuple(sorted(owning_links)),
    )


def plan_event(event: EventView, owning_links: Sequence[str]) -> EventPlan:
    """What processing does with `event`, given the finalized links owning its remote object.

    A property change would apply the pack's inbound mapping, but the pack
    manifest declares none, so every such event is skipped with that reason.
    """
    if event.status is not EventStatus.ADMITTED:
        return EventPlan(kind=PlanKind.ALREADY_SETTLED, status=event.status)
    match _handler(event.handler):
        case InboundHandler.REMOTE_DELETION:
            return _remote_deletion(event, owning_links)
        case InboundHandler.REMOTE_PROPERTY_CHANGE:
            return _settle(EventStatus.SKIPPED, EventReason.NO_INBOUND_MAPPING)
        case None:
            return _settle(EventStatus.SKIPPED, EventReason.NO_HANDLER)


def _handler(value: str) -> InboundHandler | None:
    try:
        return InboundHandler(value)
    except ValueError:
        return None


# -- workflow and activity messages (STYLE rule 4) ------------------------------


class InboundEventInput(Message):
    event_id: str


class InboundEventResult(Message):
    event_id: str
    status: EventStatus
    reason: str | None = None


class EventIdInput(Message):
    event_id: str


class ClassifiedEvent(Message):
    """An activity result: the event as read, and the plan for it."""

    event: EventView
    plan: EventPlan


class SignalLinksInput(Message):
    event_id: str
    link_keys: tuple[str, ...]
    target_object: str
    remote_object_id: str


class SettleEventInput(Message):
    event_id: str
    status: EventStatus
    reason: str
