"""SPEC WF-3: which operator action applies in which durable state, every row.

`check_operator_action` is what both the workflow's update validators and the
activity's compare-and-set ask, so this table is the whole rule. The rows that
matter most refuse: `mark-terminal` on an attempt that may have sent its POST
would let `supersede` create a second remote object, and `revalidate` on a link
whose remote object was deleted would invite a re-create.
"""

from __future__ import annotations

import pytest

from protocol.errors import SuspendReason
from protocol.messages import LinkView
from protocol.operator import OperatorAction, check_operator_action
from protocol.states import AttemptStatus, LinkStatus, ProtocolError

A, L = AttemptStatus, LinkStatus

# The one attempt status (or link status) each attempt (link) action applies in.
ATTEMPT_ACTIONS = {
    OperatorAction.SUPERSEDE: {A.TERMINAL_FAILED},
    OperatorAction.RECONCILE: {A.AMBIGUOUS_REMOTE_EFFECT},
    OperatorAction.MARK_TERMINAL: {A.PENDING},
}
LINK_ACTIONS = {
    OperatorAction.RETIRE: {L.FINALIZED, L.SUSPENDED_DRIFT},
    OperatorAction.REVALIDATE: {L.SUSPENDED_DRIFT},
}


def applies(action: OperatorAction, view: LinkView) -> bool:
    try:
        check_operator_action(action, view)
    except ProtocolError:
        return False
    return True


# Every action against every status of the row it acts on (None: no such row yet).
TABLE = [
    (action, "attempt_status", status)
    for action in ATTEMPT_ACTIONS
    for status in [None, *AttemptStatus]
] + [(action, "link_status", status) for action in LINK_ACTIONS for status in [None, *LinkStatus]]


@pytest.mark.parametrize(("action", "field", "status"), TABLE)
def test_each_action_applies_only_in_its_states(
    action: OperatorAction, field: str, status: AttemptStatus | LinkStatus | None
) -> None:
    allowed = {**ATTEMPT_ACTIONS, **LINK_ACTIONS}[action]
    view = LinkView.model_validate({"link_key": "k", field: status})
    assert applies(action, view) is (status in allowed)


@pytest.mark.parametrize(
    "status", [A.PROCESSING, A.POST_SENT, A.WRITEBACK_PENDING, A.AMBIGUOUS_REMOTE_EFFECT]
)
def test_mark_terminal_refuses_an_attempt_that_may_have_sent(status: AttemptStatus) -> None:
    """Terminal would free the slot for `supersede`: a second POST for one record."""
    with pytest.raises(ProtocolError, match="does not apply"):
        check_operator_action(
            OperatorAction.MARK_TERMINAL, LinkView(link_key="k", attempt_status=status)
        )


def test_revalidate_refuses_a_link_whose_remote_object_was_deleted() -> None:
    view = LinkView(
        link_key="k",
        link_status=L.SUSPENDED_DRIFT,
        suspend_reason=SuspendReason.REMOTE_DELETED.value,
    )
    with pytest.raises(ProtocolError, match="remote_deleted"):
        check_operator_action(OperatorAction.REVALIDATE, view)
    assert applies(OperatorAction.RETIRE, view)
