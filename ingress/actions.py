"""Workflow actions (SPEC ING-7): exact per-action policy, BLOCK only after commit.

Response bodies follow the automation-v4 action protocol: a state in
`outputFields.hs_execution_state`, and for BLOCK an ISO-8601
`hs_expiration_duration`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from db.ingress_queries import ActionExecutionRow, ReceiptRow
from ingress.admission import Admitter
from ingress.body import parse_document
from ingress.errors import Rejection
from ingress.webhook import remote_object_id, remote_scope
from protocol.action_callback import valid_callback_id
from protocol.event_identity import (
    IdentityError,
    business_identity,
    dump_exact_json,
    lookup,
    receipt_identity,
)
from protocol.ingress_policy import ActionPolicy, ActionRule, WorkflowActionEndpoint

STATE_FIELD: Final = "hs_execution_state"
EXPIRATION_FIELD: Final = "hs_expiration_duration"
FAIL_CONTINUE: Final = "FAIL_CONTINUE"
BLOCK: Final = "BLOCK"


def _action_id(endpoint: WorkflowActionEndpoint, execution: Mapping[str, object]) -> str:
    value = lookup(execution, endpoint.action_id_field)
    if isinstance(value, str) and value:
        return value
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return str(int(value))
    raise Rejection(400, "missing_action_id")


def parse_execution(body: bytes) -> Mapping[str, object]:
    """The execution object, exact and storable (`parse_document`), or a 400."""
    document = parse_document(body)
    if not isinstance(document, Mapping):
        raise Rejection(400, "execution_not_object")
    return document


def select_rule(
    endpoint: WorkflowActionEndpoint, execution: Mapping[str, object]
) -> tuple[str, ActionRule]:
    """The exact action's rule; an action id without one fails closed (nothing stored)."""
    action_id = _action_id(endpoint, execution)
    rule = endpoint.actions.get(action_id)
    if rule is None:
        raise Rejection(422, "unknown_action")
    return action_id, rule


def _callback_id(endpoint: WorkflowActionEndpoint, execution: Mapping[str, object]) -> str:
    value = lookup(execution, endpoint.identity.path)
    if not isinstance(value, str) or not value:
        raise Rejection(400, "missing_callback_id")
    if not valid_callback_id(value):
        # BLOCK would promise a completion the runtime cannot start or address (ING-3).
        raise Rejection(400, "invalid_callback_id")
    return value


def output(state: str, **extra: str) -> dict[str, dict[str, str]]:
    return {"outputFields": {STATE_FIELD: state, **extra}}


@dataclass(frozen=True)
class ActionAnswer:
    body: dict[str, dict[str, str]]
    # The execution this request newly admitted (None: best-effort or a duplicate).
    admitted: ActionExecutionRow | None = None


def _execution_row(
    endpoint: WorkflowActionEndpoint,
    execution: Mapping[str, object],
    action_id: str,
    rule: ActionRule,
    ids: tuple[str, str, str],
) -> ActionExecutionRow:
    callback_id, execution_id, receipt_id = ids
    route = rule.route
    return ActionExecutionRow(
        execution_id,
        endpoint.name,
        callback_id,
        action_id,
        receipt_id,
        dump_exact_json(execution),
        rule.expiration,
        route.handler.value if route else None,
        route.target_object if route else None,
        remote_object_id(route, execution) if route else None,
        remote_scope(route, execution) if route else None,
    )


async def answer(
    endpoint: WorkflowActionEndpoint,
    admitter: Admitter,
    execution: Mapping[str, object],
    request_id: str,
) -> ActionAnswer:
    """FAIL_CONTINUE for best-effort (stores nothing); BLOCK once a must-complete is committed."""
    action_id, rule = select_rule(endpoint, execution)
    if rule.policy is ActionPolicy.BEST_EFFORT:
        return ActionAnswer(output(FAIL_CONTINUE))
    callback_id = _callback_id(endpoint, execution)
    try:
        execution_id = business_identity(endpoint.identity, endpoint.name, execution)
        receipt_id = receipt_identity(endpoint.identity, endpoint.name, execution)
    except IdentityError:
        raise Rejection(400, "unidentifiable_execution") from None
    row = _execution_row(
        endpoint, execution, action_id, rule, (callback_id, execution_id, receipt_id)
    )
    receipt = ReceiptRow(receipt_id, endpoint.name, request_id, None, action_id, None, row.payload)
    # A duplicate callback id was admitted earlier: same answer, nothing new stored.
    admitted = await admitter.admit_action(receipt, row)
    body = output(BLOCK, **{EXPIRATION_FIELD: rule.block_expiration})
    return ActionAnswer(body, row if admitted is not None else None)
