"""Which operator action applies in which durable state (SPEC WF-3).

The workflow's update validators and the activity that applies the action
under compare-and-set both ask this module, so the UI's immediate answer and
the database's final word cannot disagree.
"""

from __future__ import annotations

from enum import StrEnum

from protocol.errors import SuspendReason
from protocol.messages import LinkView
from protocol.states import AttemptStatus, LinkStatus, ProtocolError


class OperatorAction(StrEnum):
    SUPERSEDE = "supersede"
    RECONCILE = "reconcile"
    RETIRE = "retire"
    MARK_TERMINAL = "mark_terminal"
    REVALIDATE = "revalidate"


# Only an attempt that provably sent nothing may be closed by hand: marking a
# processing or writeback attempt terminal would let `supersede` POST a duplicate.
_MARKABLE = frozenset({AttemptStatus.PENDING})


def check_operator_action(action: OperatorAction, view: LinkView) -> None:
    """Raise `ProtocolError` (a `ValueError` the UI shows) when `action` does not apply."""
    attempt, link = view.attempt_status, view.link_status
    match action:
        case OperatorAction.SUPERSEDE:
            _require(attempt is AttemptStatus.TERMINAL_FAILED, action, "attempt", attempt)
        case OperatorAction.RECONCILE:
            _require(attempt is AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, action, "attempt", attempt)
        case OperatorAction.RETIRE:
            allowed = {LinkStatus.FINALIZED, LinkStatus.SUSPENDED_DRIFT}
            _require(link in allowed, action, "link", link)
        case OperatorAction.MARK_TERMINAL:
            _require(attempt in _MARKABLE, action, "attempt", attempt)
        case OperatorAction.REVALIDATE:
            _require(link is LinkStatus.SUSPENDED_DRIFT, action, "link", link)
            if view.suspend_reason == SuspendReason.REMOTE_DELETED.value:
                # The object is gone: revalidating would PATCH nothing, or worse invite a
                # re-create. Retire the link (or rebind it with evidence) instead.
                raise ProtocolError(
                    "revalidate does not apply: the remote object was deleted "
                    "(remote_deleted); retire the link instead"
                )


def _require(ok: bool, action: OperatorAction, row: str, status: object) -> None:
    if not ok:
        shown = status.value if isinstance(status, StrEnum) else "none"
        raise ProtocolError(f"{action.value} does not apply: the {row} is {shown}")


class OperatorErrorType(StrEnum):
    """`ApplicationError.type` of an update's refusal: read by a person in the UI or CLI,
    so it travels as one line with no stack trace (the worker's failure converter)."""

    REFUSED = "OperatorRefused"  # the action does not apply in the link's state
    INVALID_INPUT = "InvalidUpdateInput"  # the update's JSON is missing or has bad fields


OPERATOR_FACING_ERROR_TYPES: frozenset[str] = frozenset(t.value for t in OperatorErrorType)
