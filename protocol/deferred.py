"""Deferred association lane (SPEC LANE-2, LANE-3): completing a frozen create at claim time.

A create whose create-inline association target had no finalized link was
reserved with its full, position-aligned association source-id vector. Under
its claim, the worker resolves each pending contract's target link *from that
frozen vector* (never from a later lookup value), and freezes the
association-complete body before the first POST.

Once its checkpoint is set and a try may have landed, a deferred create is never
replayed, even under a replay-safe profile (SPEC §15 C-3): the one decision is
`protocol.recovery.next_step` (`RecoveryInput.deferred`), which parks it
`ambiguous_remote_effect`.
"""

from __future__ import annotations

from typing import Literal

from protocol.active import ActiveMetadata
from protocol.admission import AssociationTarget
from protocol.identity import InvalidIdentityPart, link_key
from protocol.request import FreezeFailure, complete_deferred_request
from protocol.snapshots import ActionConfigSnapshot, CreateRequestSnapshot, Snapshot
from protocol.states import LinkStatus


class Waiting(Snapshot):
    kind: Literal["waiting"] = "waiting"
    waiting_on: tuple[str, ...]


def deferred_target_keys(
    active: ActiveMetadata,
    frozen_action: ActionConfigSnapshot,
    vector: tuple[str, ...],
    pending: tuple[str, ...],
) -> dict[str, str] | FreezeFailure:
    """contract id -> target link key for each pending contract, from the frozen vector."""
    if not active.usable:
        return FreezeFailure(detail="the attempt's action slot no longer resolves")
    action = active.require()[0]
    if ActionConfigSnapshot.of(action).mapping_fingerprint != frozen_action.mapping_fingerprint:
        return FreezeFailure(detail="association contracts changed since the save was admitted")
    if len(vector) != len(action.associations):
        return FreezeFailure(detail="association vector is not aligned with the contracts")
    keys: dict[str, str] = {}
    for contract, source_id in zip(action.associations, vector, strict=True):
        target = active.association_slots.get(contract.target_action_slot)
        if contract.id not in pending:
            continue
        if target is None or not source_id:
            return FreezeFailure(detail=f"contract {contract.id} has no frozen target")
        try:
            keys[contract.id] = link_key(
                active.connector_owner_key,
                target.id,
                target.source_object,
                source_id,
                target.destination_slot,
            )
        except InvalidIdentityPart as error:
            return FreezeFailure(detail=f"contract {contract.id}: {error}")
    return keys


def complete_deferred(
    request: CreateRequestSnapshot,
    active: ActiveMetadata,
    targets: dict[str, AssociationTarget],
) -> CreateRequestSnapshot | Waiting | FreezeFailure:
    """The association-complete request, or what it still waits on, or why it cannot be."""
    action = active.require()[0]
    contracts = {c.id: c for c in action.associations}
    resolved: dict[str, tuple[str, str]] = {}
    waiting: list[str] = []
    for contract_id in request.pending_associations:
        target = targets.get(contract_id, AssociationTarget())
        if target.link_status is LinkStatus.FINALIZED and target.remote_id:
            resolved[contract_id] = (contracts[contract_id].remote_property, target.remote_id)
        elif target.link_status in (LinkStatus.SUSPENDED_DRIFT, LinkStatus.RETIRED):
            return FreezeFailure(detail=f"association target {contract_id} is {target.link_status}")
        else:
            waiting.append(contract_id)
    if waiting:
        return Waiting(waiting_on=tuple(waiting))
    return complete_deferred_request(request, action.body_envelope, resolved)
