"""A compare-and-set that matched no row (ARCH-2): the one error every operation that
moves a link or attempt row raises alike, typed for the workflow's non-retryable list."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from protocol.errors import ActivityErrorType as E


def require_cas(applied: object, what: str) -> None:
    """ARCH-2: a compare-and-set that matched no row is a conflict, never ignored."""
    if not applied:
        raise ApplicationError(
            f"{what}: the row was not in the expected state (concurrent change)",
            type=E.TRANSITION_CONFLICT.value,
            non_retryable=True,
        )
