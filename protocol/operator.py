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
            _refuse_after_possible_effect(view)
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


# What would work instead, by the row and state that refused (`KEY` stands for the
# link key; the CLI fills it in), so an operator is never left guessing. Two tables:
# attempt and link statuses share values ("finalized") and StrEnums compare as str.
_IN_FLIGHT = "wait: the attempt is in flight (`links show KEY`)"
_WHAT_WORKS: dict[str, dict[str | None, str]] = {
    "attempt": {
        AttemptStatus.AMBIGUOUS_REMOTE_EFFECT: (
            "find the object at the remote and run `reconcile KEY --remote-id …`; if"
            " `links show KEY` says the send journal proves no try landed there is none to"
            " find, and the migration policy (retire, or a declared rebind) is the way forward"
        ),
        AttemptStatus.TERMINAL_FAILED: "run `supersede KEY` to reserve a new attempt",
        AttemptStatus.PENDING: (
            "wait for the worker, or `mark-terminal KEY` if it provably sent nothing"
        ),
        AttemptStatus.PROCESSING: _IN_FLIGHT,
        AttemptStatus.POST_SENT: _IN_FLIGHT,
        AttemptStatus.WRITEBACK_PENDING: _IN_FLIGHT,
        AttemptStatus.FINALIZED: "nothing to fix; `retire KEY` releases a finalized link",
        AttemptStatus.SUPERSEDED: "a newer attempt exists: see `links show KEY`",
        None: "the link has no attempt yet: report a save first (`save` or `push`)",
    },
    "link": {
        LinkStatus.FINALIZED: "nothing to fix; `retire KEY` releases the remote id",
        LinkStatus.SUSPENDED_DRIFT: "run `revalidate-link KEY` or `retire KEY`",
        LinkStatus.RETIRED: "nothing to do: the link is retired",
        None: "the link is not finalized yet: see `links show KEY`",
    },
}


def _refuse_after_possible_effect(view: LinkView) -> None:
    """C-1: a new attempt after a try that may have landed could create a second object.
    (Postgres refuses the move too: migration 0100.)"""
    landed = view.attempt_tries_may_have_landed
    if landed:
        raise ProtocolError(
            f"supersede does not apply: {landed} try(s) of this attempt may have landed, so"
            " a new attempt could create a second remote object; find the object at the"
            " remote and run `reconcile KEY --remote-id …` (see `links show KEY`)"
        )


def _require(ok: bool, action: OperatorAction, row: str, status: StrEnum | None) -> None:
    if not ok:
        shown = status.value if status is not None else "none"
        hint = _WHAT_WORKS[row].get(status, "see `links show KEY`")
        raise ProtocolError(f"{action.value} does not apply: the {row} is {shown}: {hint}")


class OperatorErrorType(StrEnum):
    """`ApplicationError.type` of an update's refusal: read by a person in the UI or CLI,
    so it travels as one line with no stack trace (the worker's failure converter)."""

    REFUSED = "OperatorRefused"  # the action does not apply in the link's state
    INVALID_INPUT = "InvalidUpdateInput"  # the update's JSON is missing or has bad fields


OPERATOR_FACING_ERROR_TYPES: frozenset[str] = frozenset(t.value for t in OperatorErrorType)
