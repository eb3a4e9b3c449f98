"""LANE-2 under the claim: resolve a deferred attempt's targets from its frozen vector."""

from __future__ import annotations

import asyncpg

from db import links as q
from db.records import Conn
from protocol.active import resolve_active
from protocol.admission import AssociationTarget
from protocol.deferred import Waiting, complete_deferred, deferred_target_keys
from protocol.request import FreezeFailure
from protocol.snapshots import ActionConfigSnapshot, CreateRequestSnapshot
from protocol.states import LinkStatus
from services.packs import get_active_pack
from services.rows import jsonb


async def resolve_deferred(
    conn: Conn, attempt: asyncpg.Record, request: CreateRequestSnapshot
) -> CreateRequestSnapshot | Waiting | FreezeFailure:
    """The association-complete request, or what it waits on, or why it fails closed."""
    vector = jsonb(attempt["association_source_ids"])
    if not isinstance(vector, list):
        return FreezeFailure(detail="deferred attempt without its frozen vector (LANE-3)")
    pack = await get_active_pack(conn, attempt["connector_owner_key"])
    if pack is None:
        return FreezeFailure(detail="no active pack for the attempt's owner key")
    active = resolve_active(
        pack.manifest,
        pack.pack_install_id,
        attempt["action_slot_id"],
        attempt["destination_slot_id"],
    )
    frozen = ActionConfigSnapshot.model_validate(jsonb(attempt["action_snapshot"]))
    keys = deferred_target_keys(active, frozen, tuple(vector), request.pending_associations)
    if isinstance(keys, FreezeFailure):
        return keys
    rows = await q.link_targets(conn, list(keys.values()))
    targets = {
        contract: AssociationTarget(
            link_status=LinkStatus(rows[key]["status"]), remote_id=rows[key]["remote_id"]
        )
        for contract, key in keys.items()
        if key in rows
    }
    return complete_deferred(request, active, targets)
