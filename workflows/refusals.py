"""How an operator update says no: one readable line, an `OperatorErrorType`, no trace.

The worker's failure converter sends these `ApplicationError`s without a stack
trace or cause (worker/failures.py), so the Temporal UI's update dialog and the
CLI show just the sentence, not a stack trace.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from protocol.operator import OperatorAction, OperatorErrorType
from protocol.park import update_template
from protocol.update_input import InputT, UpdateInputError, parse_update_input


def parse_input(action: OperatorAction, model: type[InputT], raw: object) -> InputT:
    try:
        return parse_update_input(model, raw, update_template(action))
    except UpdateInputError as error:
        raise ApplicationError(
            f"{action.value}: {error}",
            type=OperatorErrorType.INVALID_INPUT.value,
            non_retryable=True,
        ) from None


def refused(message: str) -> ApplicationError:
    return ApplicationError(message, type=OperatorErrorType.REFUSED.value, non_retryable=True)


def activity_refusal(err: ActivityError) -> str:
    """The refusal's own words: the message the activity raised (not its cause's)."""
    cause = err.cause
    return cause.message if isinstance(cause, FailureError) else str(err)
