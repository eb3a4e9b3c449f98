"""Typed errors for the invariants the schema enforces, mapped from asyncpg exceptions.

Triggers raise our own SQLSTATEs (class `CP`) with a JSON detail; unique indexes
are recognised by name. `invariant_errors()` re-raises either as the typed error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import asyncpg

# SQLSTATEs raised by our triggers (class CP is unused by Postgres itself).
ILLEGAL_TRANSITION: Final = "CP001"
ILLEGAL_INITIAL_STATUS: Final = "CP002"
APPEND_ONLY: Final = "CP003"
EVIDENCE_GUARD: Final = "CP004"


class DatabaseInvariantError(Exception):
    """The database refused a write that would break a schema invariant."""


class IllegalTransitionError(DatabaseInvariantError):
    """ARCH-3: a status change the `protocol/` table does not allow."""

    def __init__(self, message: str, lifecycle: str, from_status: str, to_status: str) -> None:
        super().__init__(message)
        self.lifecycle = lifecycle
        self.from_status = from_status
        self.to_status = to_status


class IllegalInitialStatusError(DatabaseInvariantError):
    """ARCH-3: a new row must start in its lifecycle's initial state."""

    def __init__(self, message: str, lifecycle: str, status: str) -> None:
        super().__init__(message)
        self.lifecycle = lifecycle
        self.status = status


class AppendOnlyViolationError(DatabaseInvariantError):
    """STO-4: an UPDATE, DELETE or TRUNCATE on an append-only table."""


class EvidenceGuardError(DatabaseInvariantError):
    """JRN-2: a write that would shrink the evidence of a possible remote effect (clear a
    checkpoint, end terminal without a definite rejection, delete, change identity)."""


class AttemptSlotOccupiedError(DatabaseInvariantError):
    """ID-5: the link key already has an attempt that is not finalized or superseded."""


class DuplicateAttemptOrdinalError(DatabaseInvariantError):
    """ID-5: `(link_key, attempt_ordinal)` already exists."""


class RemoteLocatorClaimedError(DatabaseInvariantError):
    """ID-4: another non-retired link already owns this remote locator."""


class DuplicateIdempotencyKeyError(DatabaseInvariantError):
    """Another attempt already uses this `request_idempotency_key`."""


class ActivePackInstallExistsError(DatabaseInvariantError):
    """The connector owner key already has an active pack install."""


UNIQUE_INDEX_ERRORS: Final[dict[str, type[DatabaseInvariantError]]] = {
    "connector_push_attempt_one_occupying_uq": AttemptSlotOccupiedError,
    "connector_push_attempt_ordinal_uq": DuplicateAttemptOrdinalError,
    "connector_push_attempt_request_idempotency_key_uq": DuplicateIdempotencyKeyError,
    "connector_remote_link_locator_uq": RemoteLocatorClaimedError,
    "pack_install_one_active_uq": ActivePackInstallExistsError,
}


def translate(exc: asyncpg.PostgresError) -> DatabaseInvariantError | None:
    """The typed error for `exc`, or None when it is not one of our invariants."""
    message = str(exc)
    if exc.sqlstate == ILLEGAL_TRANSITION:
        detail = _detail(exc)
        return IllegalTransitionError(message, detail["lifecycle"], detail["from"], detail["to"])
    if exc.sqlstate == ILLEGAL_INITIAL_STATUS:
        detail = _detail(exc)
        return IllegalInitialStatusError(message, detail["lifecycle"], detail["to"])
    if exc.sqlstate == APPEND_ONLY:
        return AppendOnlyViolationError(message)
    if exc.sqlstate == EVIDENCE_GUARD:
        return EvidenceGuardError(message)
    if isinstance(exc, asyncpg.UniqueViolationError):
        error_type = UNIQUE_INDEX_ERRORS.get(exc.constraint_name or "")
        return error_type(message) if error_type else None
    return None


@contextmanager
def invariant_errors() -> Iterator[None]:
    """Re-raise invariant violations from the block as typed errors (cause kept)."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        typed = translate(exc)
        if typed is None:
            raise
        raise typed from exc


def _detail(exc: asyncpg.PostgresError) -> dict[str, str]:
    parsed = json.loads(exc.detail or "{}")
    return {key: str(value) for key, value in parsed.items()}
