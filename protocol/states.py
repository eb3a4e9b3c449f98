"""Lifecycle states and their transition tables (SPEC §4).

Rules kept in this module:
1. Every lifecycle has one `StrEnum` of states and one module-level table
   mapping a state to the set of states it may move to.
2. `check_transition` is the only way code asks "may this row move?"; it raises
   `ProtocolError` naming the lifecycle and both states.
3. The database triggers are generated from these same tables
   (`transition_pairs`), so SQL and Python cannot disagree (ARCH-3).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Final, TypeVar

S = TypeVar("S", bound=StrEnum)


class ProtocolError(ValueError):
    """A move the protocol does not allow (a ValueError, so update validators show it)."""


class LinkStatus(StrEnum):
    FINALIZED = "finalized"
    SUSPENDED_DRIFT = "suspended_drift"
    RETIRED = "retired"


class AttemptStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    POST_SENT = "post_sent"
    AMBIGUOUS_REMOTE_EFFECT = "ambiguous_remote_effect"
    WRITEBACK_PENDING = "writeback_pending"
    FINALIZED = "finalized"
    TERMINAL_FAILED = "terminal_failed"
    SUPERSEDED = "superseded"


class PatchStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    AMBIGUOUS_REMOTE_EFFECT = "ambiguous_remote_effect"
    FAILED = "failed"
    SUPERSEDED = "superseded"


class EventStatus(StrEnum):
    """An admitted inbound event (ING-6): processed exactly once in effect."""

    ADMITTED = "admitted"
    PROCESSED = "processed"
    SKIPPED = "skipped"
    DEAD = "dead"


class DispatchLane(StrEnum):
    """Lanes this runtime recognises (LANE-1). The column accepts any text so an
    unknown lane can be left untouched rather than rejected or normalised."""

    CONFIGURED = "configured"
    DEFERRED_ASSOCIATION = "deferred_association"


LINK_TRANSITIONS: Final[Mapping[LinkStatus, frozenset[LinkStatus]]] = {
    LinkStatus.FINALIZED: frozenset({LinkStatus.SUSPENDED_DRIFT, LinkStatus.RETIRED}),
    # -> finalized only through explicit revalidation (WF-3); the caller proves that.
    LinkStatus.SUSPENDED_DRIFT: frozenset({LinkStatus.FINALIZED, LinkStatus.RETIRED}),
    LinkStatus.RETIRED: frozenset(),
}

ATTEMPT_TRANSITIONS: Final[Mapping[AttemptStatus, frozenset[AttemptStatus]]] = {
    AttemptStatus.PENDING: frozenset({AttemptStatus.PROCESSING, AttemptStatus.TERMINAL_FAILED}),
    AttemptStatus.PROCESSING: frozenset(
        {
            AttemptStatus.POST_SENT,
            AttemptStatus.WRITEBACK_PENDING,
            AttemptStatus.AMBIGUOUS_REMOTE_EFFECT,
            AttemptStatus.TERMINAL_FAILED,
            # Lease lost before any remote I/O (RemoteIOStartedAt null) only.
            AttemptStatus.PENDING,
        }
    ),
    AttemptStatus.POST_SENT: frozenset(
        {
            AttemptStatus.WRITEBACK_PENDING,
            AttemptStatus.AMBIGUOUS_REMOTE_EFFECT,
            AttemptStatus.TERMINAL_FAILED,
        }
    ),
    # Explicit reconciliation only.
    AttemptStatus.AMBIGUOUS_REMOTE_EFFECT: frozenset({AttemptStatus.WRITEBACK_PENDING}),
    AttemptStatus.WRITEBACK_PENDING: frozenset(
        {AttemptStatus.FINALIZED, AttemptStatus.TERMINAL_FAILED}
    ),
    AttemptStatus.FINALIZED: frozenset(),
    # Explicit operator / migration policy only.
    AttemptStatus.TERMINAL_FAILED: frozenset({AttemptStatus.SUPERSEDED}),
    AttemptStatus.SUPERSEDED: frozenset(),
}

PATCH_TRANSITIONS: Final[Mapping[PatchStatus, frozenset[PatchStatus]]] = {
    PatchStatus.PENDING: frozenset({PatchStatus.PROCESSING, PatchStatus.SUPERSEDED}),
    PatchStatus.PROCESSING: frozenset(
        {
            PatchStatus.SUCCEEDED,
            PatchStatus.AMBIGUOUS_REMOTE_EFFECT,
            PatchStatus.FAILED,
            # Lease lost with the checkpoint null only.
            PatchStatus.PENDING,
        }
    ),
    PatchStatus.SUCCEEDED: frozenset(),
    PatchStatus.AMBIGUOUS_REMOTE_EFFECT: frozenset(),
    PatchStatus.FAILED: frozenset({PatchStatus.SUPERSEDED}),
    PatchStatus.SUPERSEDED: frozenset(),
}

EVENT_TRANSITIONS: Final[Mapping[EventStatus, frozenset[EventStatus]]] = {
    EventStatus.ADMITTED: frozenset({EventStatus.PROCESSED, EventStatus.SKIPPED, EventStatus.DEAD}),
    EventStatus.PROCESSED: frozenset(),
    EventStatus.SKIPPED: frozenset(),
    EventStatus.DEAD: frozenset(),
}

LINK_INITIAL: Final = LinkStatus.FINALIZED
ATTEMPT_INITIAL: Final = AttemptStatus.PENDING
PATCH_INITIAL: Final = PatchStatus.PENDING

# Attempts in these states do not occupy the create slot of their link key (ID-5).
ATTEMPT_RELEASED: Final[frozenset[AttemptStatus]] = frozenset(
    {AttemptStatus.FINALIZED, AttemptStatus.SUPERSEDED}
)

# Lifecycle name -> (table name in Postgres, status enum, transition table, initial state).
LIFECYCLES: Final = {
    "link": ("connector_remote_link", LinkStatus, LINK_TRANSITIONS, LINK_INITIAL),
    "attempt": ("connector_push_attempt", AttemptStatus, ATTEMPT_TRANSITIONS, ATTEMPT_INITIAL),
    "patch": ("connector_patch_dispatch", PatchStatus, PATCH_TRANSITIONS, PATCH_INITIAL),
    "event": ("connector_event", EventStatus, EVENT_TRANSITIONS, EventStatus.ADMITTED),
}


def check_transition(
    lifecycle: str, table: Mapping[S, frozenset[S]], current: S, target: S
) -> None:
    """Raise `ProtocolError` unless `current -> target` is in `table`."""
    if target not in table[current]:
        raise ProtocolError(f"{lifecycle}: illegal transition {current.value} -> {target.value}")


def check_link_transition(current: LinkStatus, target: LinkStatus) -> None:
    check_transition("link", LINK_TRANSITIONS, current, target)


def check_attempt_transition(current: AttemptStatus, target: AttemptStatus) -> None:
    check_transition("attempt", ATTEMPT_TRANSITIONS, current, target)


def check_patch_transition(current: PatchStatus, target: PatchStatus) -> None:
    check_transition("patch", PATCH_TRANSITIONS, current, target)


def transition_pairs(table: Mapping[S, frozenset[S]]) -> Iterator[tuple[S, S]]:
    """Every legal (from, to) pair of one table, in a stable order."""
    for source in sorted(table):
        for target in sorted(table[source]):
            yield source, target
