"""Why a link waits for an operator, and what the operator does about it (SPEC OPS-1, WF-3).

One function names the park reason of a durable view and one table maps each
reason to its remedy and the update that applies it, so the `ParkReason`
search attribute, the workflow's details in the UI and `links find` /
`links show` cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel

from protocol.drift import DriftSurface
from protocol.errors import drift_reason
from protocol.messages import (
    LinkView,
    MarkTerminalInput,
    OperatorInput,
    ReconcileInput,
    RetireInput,
    RevalidateInput,
    SupersedeInput,
)
from protocol.operator import OperatorAction
from protocol.park_reason import ParkReason as ParkReason
from protocol.states import AttemptStatus, LinkStatus


def park_reason(view: LinkView) -> ParkReason | None:
    """The reason this link needs a person, or None (the same rows as `needs_operator`,
    plus a PATCH whose outcome is unknown)."""
    if view.attempt_status is AttemptStatus.AMBIGUOUS_REMOTE_EFFECT:
        return ParkReason.AMBIGUOUS_REMOTE_EFFECT
    if view.attempt_status is AttemptStatus.TERMINAL_FAILED:
        return ParkReason.TERMINAL_FAILED
    if view.link_status is LinkStatus.SUSPENDED_DRIFT:
        return suspended_reason(view.suspend_reason)
    if view.patch_outcome_unknown:
        return ParkReason.PATCH_OUTCOME_UNKNOWN
    return None


def suspended_reason(suspend_reason: str | None) -> ParkReason:
    """A suspended link's reason; any drift surface (`drift`, `drift:endpoint`) is `drift`."""
    head = (suspend_reason or "").split(":", 1)[0]
    return _SUSPENDED.get(head, ParkReason.DRIFT)


_SUSPENDED: Final = {
    r.value: r
    for r in (
        ParkReason.REMOTE_DELETED,
        ParkReason.REMOTE_CONFLICT,
        ParkReason.STALE_REMOTE_LOCATOR,
    )
}


@dataclass(frozen=True)
class Remedy:
    """What to do, and the update that does it (None: no update applies; act elsewhere)."""

    what: str
    update: OperatorAction | None
    alternatives: tuple[OperatorAction, ...] = ()


REMEDIES: Final[dict[ParkReason, Remedy]] = {
    ParkReason.AMBIGUOUS_REMOTE_EFFECT: Remedy(
        "The create may have reached the remote, whatever a later try answered. Find the"
        " object at the remote (by the record, or the request's idempotency key), then"
        " reconcile with its id. Supersede is refused: it could create a second object.",
        OperatorAction.RECONCILE,
    ),
    ParkReason.TERMINAL_FAILED: Remedy(
        "The remote refused the create for good and no try of it can have landed (an"
        " attempt that may have landed parks ambiguous instead, C-1). Fix the cause (record"
        " data, mapping or pack), then supersede: the next attempt POSTs once.",
        OperatorAction.SUPERSEDE,
    ),
    ParkReason.DRIFT: Remedy(
        "The pack changed under this link (the surface is in the suspend reason and the"
        " drift findings). If the change is intended revalidate, otherwise restore the pack"
        " or retire the link.",
        OperatorAction.REVALIDATE,
        (OperatorAction.RETIRE,),
    ),
    ParkReason.REMOTE_CONFLICT: Remedy(
        "The remote object changed under us (409/412). Compare it with the record, then"
        " revalidate (re-reads its entity tag) or retire the link.",
        OperatorAction.REVALIDATE,
        (OperatorAction.RETIRE,),
    ),
    ParkReason.REMOTE_DELETED: Remedy(
        "The remote object was deleted. Retire the link, or rebind the slot in the pack"
        " (slot lineage); revalidate does not apply.",
        OperatorAction.RETIRE,
    ),
    ParkReason.STALE_REMOTE_LOCATOR: Remedy(
        "Another link owns this remote id (ID-4). Decide which link owns the object and"
        " retire the other.",
        OperatorAction.RETIRE,
    ),
    ParkReason.PATCH_OUTCOME_UNKNOWN: Remedy(
        "The last PATCH may or may not have landed. Save the record again to send its full"
        " state (`connector-push save ...`), or check the object at the remote.",
        None,
    ),
}

# C-9: the link's action slot is not in the active pack (removed, or recreated under a new
# id with no declared rebind). Revalidation resolves the slot in the active pack, so it
# refuses this link: the remedy must not offer it.
SLOT_GONE: Final = Remedy(
    "The active pack no longer has this link's action slot (removed, or recreated under a"
    " new id without a declared rebind, C-9); revalidate does not apply. Declare the"
    " rebind in the pack (slot lineage) and apply it, then revalidate; or retire the link.",
    OperatorAction.RETIRE,
)
_SLOT_GONE_REASONS: Final = frozenset({drift_reason(DriftSurface.ACTION_RECREATED.value)})


def remedy_for(reason: ParkReason, suspend_reason: str | None) -> Remedy:
    """The remedy shown for a parked link: its reason's, unless the suspension names a
    surface whose usual update the guards refuse."""
    if reason is ParkReason.DRIFT and suspend_reason in _SLOT_GONE_REASONS:
        return SLOT_GONE
    return REMEDIES[reason]


UPDATE_INPUTS: Final[dict[OperatorAction, type[OperatorInput]]] = {
    OperatorAction.SUPERSEDE: SupersedeInput,
    OperatorAction.RECONCILE: ReconcileInput,
    OperatorAction.RETIRE: RetireInput,
    OperatorAction.MARK_TERMINAL: MarkTerminalInput,
    OperatorAction.REVALIDATE: RevalidateInput,
}

# Filled in by the handler, never by the operator.
_INTERNAL_FIELDS: Final = frozenset({"idempotency_key"})


def update_template(action: OperatorAction) -> dict[str, object]:
    """The JSON an operator pastes into the UI's "Send an Update" Data box for `action`."""
    return _template(UPDATE_INPUTS[action])


def _template(model: type[BaseModel]) -> dict[str, object]:
    template: dict[str, object] = {}
    for name, field in model.model_fields.items():
        if name in _INTERNAL_FIELDS:
            continue
        default = field.get_default()
        template[name] = default if isinstance(default, bool) else f"<{name}>"
    return template
