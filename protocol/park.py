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
from protocol.landing import PROOF, Landing
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
    if view.patch_failed:
        return ParkReason.PATCH_FAILED
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
    """What to do, the update that does it (None: no update is the way forward; act
    elsewhere), and the evidence that decides between the actions named (G-6)."""

    what: str
    update: OperatorAction | None
    alternatives: tuple[OperatorAction, ...] = ()
    evidence: str = ""

    @property
    def actions(self) -> tuple[OperatorAction, ...]:
        """Every update the remedy names, the primary one first."""
        return (self.update, *self.alternatives) if self.update else self.alternatives


REMEDIES: Final[dict[ParkReason, Remedy]] = {
    ParkReason.AMBIGUOUS_REMOTE_EFFECT: Remedy(
        "The create may have reached the remote, whatever a later try answered. Find the"
        " object at the remote (by the record, or the request's idempotency key), then"
        " reconcile with its id. Supersede is refused: it could create a second object.",
        OperatorAction.RECONCILE,
        evidence="the object at the remote and its id; the send journal says which tries"
        " may have landed",
    ),
    ParkReason.TERMINAL_FAILED: Remedy(
        "The remote refused the create for good and no try of it can have landed (an"
        " attempt that may have landed parks ambiguous instead, C-1). Fix the cause (record"
        " data, mapping or pack), then supersede: the next attempt POSTs once.",
        OperatorAction.SUPERSEDE,
        evidence="the definite rejection in the send journal and the attempt's last error",
    ),
    ParkReason.DRIFT: Remedy(
        "The pack changed under this link (the surface is in the suspend reason and the"
        " drift findings). If the change is intended revalidate, otherwise restore the pack"
        " or retire the link.",
        OperatorAction.REVALIDATE,
        (OperatorAction.RETIRE,),
        evidence="the suspend reason and the drift findings against the active pack",
    ),
    ParkReason.REMOTE_CONFLICT: Remedy(
        "The remote object changed under us (409/412). Compare it with the record, then"
        " revalidate (re-reads its entity tag) or retire the link.",
        OperatorAction.REVALIDATE,
        (OperatorAction.RETIRE,),
        evidence="the object at the remote (by the link's remote id) compared with the record",
    ),
    ParkReason.REMOTE_DELETED: Remedy(
        "The remote object was deleted. Retire the link, or rebind the slot in the pack"
        " (slot lineage); revalidate does not apply.",
        OperatorAction.RETIRE,
        evidence="the remote deletion event recorded for the link's remote id",
    ),
    ParkReason.STALE_REMOTE_LOCATOR: Remedy(
        "Another link owns this remote id (ID-4). Decide which link owns the object and"
        " retire the other.",
        OperatorAction.RETIRE,
        evidence="the links holding the remote id (`connector-push links find --remote-id`)",
    ),
    ParkReason.PATCH_OUTCOME_UNKNOWN: Remedy(
        "The last PATCH's outcome is not settled (its send journal says whether a try may"
        " have landed). Save the record again to send its full state (`connector-push save"
        " ...`: a new PATCH, C-2'), or check the object at the remote. Retire the link only"
        " if that object no longer belongs to this record.",
        None,
        (OperatorAction.RETIRE,),
        evidence="the PATCH's send journal and the object at the remote (by the link's remote id)",
    ),
    ParkReason.PATCH_FAILED: Remedy(
        "The last PATCH failed with no effect at the remote (its retries ran out, or the"
        " remote refused it for good: the last error says which), so the remote lags the"
        " record (REC-3). Fix the cause, then save the record again to send its full state"
        " (`connector-push save ...`: a new PATCH). Retire the link only if the remote"
        " object no longer belongs to this record.",
        None,
        (OperatorAction.RETIRE,),
        evidence="the PATCH's last error and send journal (`connector-push links show KEY`)",
    ),
}

# G-6: an ambiguous attempt whose send journal has since proved that no try landed (a late
# answer to a try that had timed out said "refused" or "not applied"). The seed lets the
# attempt leave only by reconciliation to a known remote id, and no object of ours exists
# to reconcile to: the way forward is the migration policy, with the journal kept for it.
PROVED_NOT_LANDED: Final = Remedy(
    PROOF[0].upper() + PROOF[1:] + ", so there is no object of ours at the remote to find."
    " The attempt stays `ambiguous_remote_effect` and keeps its journal as the evidence:"
    " the seed lets it leave only by reconciliation to a known remote id, and blocks a"
    " second create of this record under this slot meanwhile. The way forward is the"
    " migration policy (SPEC §10; a migration decision, not an update of this link):"
    " retire this slot's ownership of the record, or declare a rebind in the pack's slot"
    " lineage, with this journal as the evidence. Reconcile"
    " only if an object for this record exists at the remote for another reason (made"
    " outside this runtime): reconcile with its id.",
    None,
    (OperatorAction.RECONCILE,),
    evidence="the send journal (`connector-push links show KEY`): every try refused for good"
    " or declared not applied, none unanswered; for reconcile, an object made elsewhere",
)

# C-9: the link's action slot is not in the active pack (removed, or recreated under a new
# id with no declared rebind). Revalidation resolves the slot in the active pack, so it
# refuses this link: the remedy must not offer it.
SLOT_GONE: Final = Remedy(
    "The active pack no longer has this link's action slot (removed, or recreated under a"
    " new id without a declared rebind, C-9); revalidate does not apply. Declare the"
    " rebind in the pack (slot lineage) and apply it, then revalidate; or retire the link.",
    OperatorAction.RETIRE,
    evidence="the drift finding naming the slot and the active pack's slot lineage",
)
_SLOT_GONE_REASONS: Final = frozenset({drift_reason(DriftSurface.ACTION_RECREATED.value)})


def remedy_for(
    reason: ParkReason, suspend_reason: str | None, attempt_landing: Landing | None = None
) -> Remedy:
    """The remedy shown for a parked link: its reason's, unless the suspension names a
    surface whose usual update the guards refuse, or the parked attempt's journal proves
    that no try landed (G-6; `attempt_landing` as the view carries it)."""
    if reason is ParkReason.DRIFT and suspend_reason in _SLOT_GONE_REASONS:
        return SLOT_GONE
    if reason is ParkReason.AMBIGUOUS_REMOTE_EFFECT and proves_no_landing(attempt_landing):
        return PROVED_NOT_LANDED
    return REMEDIES[reason]


def proves_no_landing(attempt_landing: Landing | None) -> bool:
    """The journal of a parked ambiguous attempt proves no try landed (G-6): only that
    verdict; no try at all, or none judged, proves nothing (fail closed)."""
    return attempt_landing is Landing.PROVED_NOT_LANDED


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
