"""Must-complete workflow actions after BLOCK (SPEC ING-7): phases, outcome, callback verdicts.

Rules kept in this module:
1. An execution moves `admitted -> enqueued -> observed -> delivered`, each
   step persisted before the next starts, or to `stopped` (block expired, or the
   callback was refused for good). `PHASE_TRANSITIONS` is the whole lifecycle.
2. Only a `processed` event makes `SUCCESS` eligible; `skipped` and `dead`
   complete with `FAIL_CONTINUE`. Enqueueing proves nothing about the outcome.
3. `callback_verdict` is the one place a completion response is classified:
   2xx and 409 are done, 429 / 5xx / no response are retried within the
   phase's budget, 401 / 403 and every other status are terminal and need an
   operator.
4. An execution is (endpoint, callbackId) everywhere (C-7): the same callback id
   arriving on two endpoints is two executions, two workflows, two completions.
   `action_workflow_id` is the one place the workflow id is made.
5. Nothing that reaches the workflow from outside chooses where a completion (and its
   credential) goes (S-2): the worker resolves the target from its own ingress policy
   by the endpoint the execution row names (`callback_targets`), and the callback id
   from that row. A target in a workflow's input (runs started before S-2, or by anyone
   who can start a workflow) is never read; an endpoint the worker's policy gives no
   target stops the execution with nothing sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final
from urllib.parse import quote

from protocol.inbound import EventStatus
from protocol.ingress_policy import IngressPolicy, WorkflowActionEndpoint
from protocol.messages import Message
from protocol.states import ProtocolError

ACTION_CALLBACK_WORKFLOW: Final = "ActionCallbackWorkflow"
COMPLETE_PATH: Final = "/automation/v4/actions/callbacks/{callback_id}/complete"


# The callback ids admitted (ING-3: anything else is a 400 at parse, nothing stored). The id
# names a workflow (Temporal refuses ids past ~1,000 bytes) and a path segment of the
# completion URL, so it is bounded and URL-unreserved (plus ':'), starting alphanumeric
# ('.' and '..' would be dot segments). Remote ids seen are short, e.g. 'ap-102-1234-1-0'.
CALLBACK_ID_MAX: Final = 255
_CALLBACK_ID: Final = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._~:-]{{0,{CALLBACK_ID_MAX - 1}}}")


def valid_callback_id(value: str) -> bool:
    """Whether `value` is a callback id this runtime can run a workflow for and complete."""
    return _CALLBACK_ID.fullmatch(value) is not None


def action_workflow_id(endpoint: str, callback_id: str) -> str:
    """One callback workflow per (endpoint, callback id) (C-7): a duplicate delivery on the
    same endpoint finds the same run; the same id on another endpoint is another run.

    The endpoint name is percent-encoded with nothing kept safe but unreserved characters,
    so it never holds a '/' and the id splits back into its two parts unambiguously
    (policy names are `[a-z0-9_-]` today, which encode to themselves)."""
    if not endpoint or not valid_callback_id(callback_id):
        raise ProtocolError("an action workflow id needs an endpoint and an admitted callback id")
    return f"action/{quote(endpoint, safe='')}/{callback_id}"


class ActionPhase(StrEnum):
    ADMITTED = "admitted"
    ENQUEUED = "enqueued"
    OBSERVED = "observed"
    DELIVERED = "delivered"
    STOPPED = "stopped"


PHASE_TRANSITIONS: Final[Mapping[ActionPhase, frozenset[ActionPhase]]] = {
    ActionPhase.ADMITTED: frozenset({ActionPhase.ENQUEUED, ActionPhase.STOPPED}),
    ActionPhase.ENQUEUED: frozenset({ActionPhase.OBSERVED, ActionPhase.STOPPED}),
    ActionPhase.OBSERVED: frozenset({ActionPhase.DELIVERED, ActionPhase.STOPPED}),
    ActionPhase.DELIVERED: frozenset(),
    ActionPhase.STOPPED: frozenset(),
}


def check_phase_transition(source: ActionPhase, target: ActionPhase) -> None:
    if target not in PHASE_TRANSITIONS[source]:
        raise ProtocolError(f"workflow_action_execution: illegal transition {source} -> {target}")


class CompletionState(StrEnum):
    SUCCESS = "SUCCESS"
    FAIL_CONTINUE = "FAIL_CONTINUE"


def completion_for(status: EventStatus) -> CompletionState:
    """The completion an event outcome earns; an unsettled event earns none yet."""
    match status:
        case EventStatus.PROCESSED:
            return CompletionState.SUCCESS
        case EventStatus.SKIPPED | EventStatus.DEAD:
            return CompletionState.FAIL_CONTINUE
        case EventStatus.ADMITTED:
            raise ProtocolError("an admitted event has no outcome yet")


class CallbackVerdict(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    UNAUTHORIZED = "unauthorized"  # 401/403: the credential lacks the automation scope
    REJECTED = "rejected"


def callback_verdict(status: int | None) -> CallbackVerdict:
    """Classify a completion response; `None` means no response arrived."""
    if status is None or status == 429 or status >= 500:
        return CallbackVerdict.RETRY
    if 200 <= status < 300 or status == 409:  # 409: already completed (REMOTE-NOTES)
        return CallbackVerdict.DELIVERED
    if status in (401, 403):
        return CallbackVerdict.UNAUTHORIZED
    return CallbackVerdict.REJECTED


class StopReason(StrEnum):
    EXPIRED = "expired"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CALLBACK_UNAUTHORIZED = "callback_unauthorized"
    CALLBACK_REJECTED = "callback_rejected"
    # S-2: the worker's ingress policy names no callback target for the execution's
    # endpoint (not configured there, or the row names an endpoint it does not have).
    CALLBACK_TARGET_UNKNOWN = "callback_target_unknown"


class PhaseBudget(Message):
    """How long and how often one phase may retry; always cut at the block expiration."""

    max_duration: timedelta
    max_attempts: int = 0  # 0: unlimited within `max_duration`
    initial_interval: timedelta = timedelta(seconds=1)
    maximum_interval: timedelta = timedelta(seconds=60)


class CallbackBudgets(Message):
    enqueue: PhaseBudget = PhaseBudget(max_duration=timedelta(hours=1), max_attempts=50)
    observe: PhaseBudget = PhaseBudget(
        max_duration=timedelta(days=7),
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=30),
    )
    deliver: PhaseBudget = PhaseBudget(max_duration=timedelta(days=7))


def phase_timeout(budget: PhaseBudget, now: datetime, expires_at: datetime) -> timedelta | None:
    """The phase's schedule-to-close timeout, or None when the block has already expired."""
    remaining = expires_at - now
    if remaining <= timedelta(0):
        return None
    return min(budget.max_duration, remaining)


# -- workflow and activity messages (STYLE rule 4) ------------------------------


class CallbackTarget(Message):
    """Where completions go: the remote's base URL and the credential reference to send."""

    base_url: str
    credential_ref: str | None = None


def callback_targets(policy: IngressPolicy) -> dict[str, CallbackTarget]:
    """Rule 5: each workflow-action endpoint's completion target, by endpoint name, as
    the worker resolves it from the policy the ingress runs (endpoints with none omitted)."""
    return {
        endpoint.name: CallbackTarget(
            base_url=endpoint.callback_base_url, credential_ref=endpoint.callback_credential_ref
        )
        for endpoint in policy.endpoints
        if isinstance(endpoint, WorkflowActionEndpoint) and endpoint.callback_base_url
    }


class ActionCallbackInput(Message):
    execution_id: str
    callback_id: str
    # Never read (rule 5): runs started before S-2 carry one, and their histories replay.
    target: CallbackTarget | None = None
    budgets: CallbackBudgets = CallbackBudgets()


class ExecutionView(Message):
    execution_id: str
    callback_id: str
    phase: ActionPhase
    expires_at: datetime
    # The endpoint that admitted it: the one key to its completion target (rule 5).
    endpoint: str | None = None
    event_id: str | None = None
    outcome: CompletionState | None = None
    callback_status: int | None = None
    stop_reason: str | None = None


class ActionCallbackResult(Message):
    execution_id: str
    phase: ActionPhase
    outcome: CompletionState | None = None
    callback_status: int | None = None
    stop_reason: str | None = None
    needs_operator: bool = False


class ExecutionIdInput(Message):
    execution_id: str


class DeliverInput(Message):
    execution_id: str
    callback_id: str  # the delivery uses the stored row's (rule 5)
    target: CallbackTarget | None = None  # never read (rule 5)
    outcome: CompletionState


class StopInput(Message):
    execution_id: str
    reason: StopReason
