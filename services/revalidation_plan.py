"""Planning a §9 revalidation manifest (read-only: release engineers' plan -> validate ->
apply, SPEC REV-1): which finalized links an install's fingerprints would move."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from db import packs as packs_q
from db import revalidation as q
from db.records import Conn
from protocol.link_row import LinkRowState, plan_member
from protocol.manifest import ManifestInvalid
from protocol.manifest import parse_manifest as parse_pack_manifest
from protocol.revalidation import InstallFingerprints
from protocol.revalidation_manifest import (
    Approval,
    RevalidationManifest,
    RevalidationMember,
    build_manifest,
)
from protocol.states import LinkStatus
from services.revalidation import SlotFingerprints, slot_fingerprints


class PlanError(ValueError):
    """The manifest cannot be planned as asked; nothing was read under lock or written."""


class PlanRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: str
    approval: Approval
    new_pack_install_id: str
    # None: every finalized link of the install's owner key that would move.
    link_keys: tuple[str, ...] | None = None


async def plan(conn: Conn, request: PlanRequest) -> RevalidationManifest:
    """A canonical manifest moving the links to the install's current fingerprints."""
    install = await packs_q.select_install(conn, request.new_pack_install_id)
    if install is None:
        raise PlanError(f"no pack install {request.new_pack_install_id}")
    try:
        pack = parse_pack_manifest(install.manifest)
    except ManifestInvalid as error:
        raise PlanError(f"install {install.pack_install_id}: {error}") from error
    rows = await _planned_rows(conn, request, pack.connector_owner_key)
    install_id = install.pack_install_id
    slots: SlotFingerprints = {}
    members = [planned_member(slot_fingerprints(slots, pack, install_id, row), install_id, row)
               for row in rows]  # fmt: skip
    moving = [m for m in members if not m.changes_nothing]
    if request.link_keys is not None and len(moving) != len(members):
        idle = sorted({m.link_key for m in members} - {m.link_key for m in moving})
        raise PlanError(f"already at the install's fingerprints: {', '.join(idle)}")
    if not moving:
        raise PlanError("no finalized link would move")
    return build_manifest(request.operation_id, request.approval, moving)


async def _planned_rows(conn: Conn, request: PlanRequest, owner: str) -> list[LinkRowState]:
    if request.link_keys is None:
        return await q.finalized_link_states(conn, owner)
    rows = await q.link_states(conn, list(request.link_keys))
    missing = sorted(set(request.link_keys) - {row.link_key for row in rows})
    if missing:
        raise PlanError(f"no link {', '.join(missing)}")
    for row in rows:
        if row.status != LinkStatus.FINALIZED or row.connector_owner_key != owner:
            raise PlanError(f"{row.link_key}: {row.status} link of owner {row.connector_owner_key}")
    return rows


def planned_member(
    produced: InstallFingerprints | None, install_id: str, row: LinkRowState
) -> RevalidationMember:
    """The manifest member moving `row` to what its install produces (`produced`)."""
    if produced is None:
        raise PlanError(f"{row.link_key}: action slot {row.action_slot_id!r} is not in the pack")
    try:
        return plan_member(row, produced.mapping_fingerprint, produced.body_fingerprint, install_id)
    except ValidationError as error:
        raise PlanError(f"{row.link_key}: not plannable ({error.errors()[0]['msg']})") from None
