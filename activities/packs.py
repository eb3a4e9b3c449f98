"""Pack installs (SPEC PACK-1, ID-3, ID-6): validate a manifest and activate it.

Each apply that changes anything creates a new install incarnation
(`PackInstallId`); links and attempts freeze that id and compare it on use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, JsonValue

from db import audit as audit_q
from db import packs as q
from db.records import Conn
from protocol.audit import AuditCommand, AuditEntry
from protocol.manifest import PackManifest, parse_manifest
from protocol.snapshots import manifest_digest

# Manifest lineage entries name action slots (protocol/manifest.py checks them so).
ACTION_SLOT: str = "action"


class PackApplyConflict(Exception):
    """The active install changed under the owner-key lock (someone bypassed it)."""


class ApplyOutcome(StrEnum):
    INSTALLED = "installed"
    UNCHANGED = "unchanged"


class ApplyPackResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: ApplyOutcome
    pack_install_id: str
    connector_owner_key: str
    manifest_digest: str
    replaced_pack_install_id: str | None = None
    lineage_entries: int = 0


class ActivePack(BaseModel):
    """The active install of one owner key, with its manifest re-validated."""

    model_config = ConfigDict(frozen=True)

    pack_install_id: str
    connector_owner_key: str
    manifest_digest: str
    manifest: PackManifest
    activated_at: datetime | None
    lineage: tuple[q.LineageRow, ...]
    ancestors: tuple[str, ...] = ()


def _lineage_rows(install_id: str, manifest: PackManifest) -> list[q.LineageRow]:
    return [
        q.LineageRow(install_id, ACTION_SLOT, entry.kind.value, entry.from_slot, entry.to_slot)
        for entry in manifest.lineage
    ]


def _manifest_json(manifest: PackManifest) -> str:
    return json.dumps(manifest.model_dump(mode="json", by_alias=True), separators=(",", ":"))


async def apply_pack(
    conn: Conn,
    document: Mapping[str, object] | PackManifest,
    *,
    reinstall: bool = False,
    operator: str | None = None,
    reason: str = "",
) -> ApplyPackResult:
    """Validate `document` and make it the owner key's active install, in one transaction.

    Raises `ManifestInvalid` before touching the database. Idempotent on the
    manifest digest: re-applying the active manifest writes nothing. A normal
    apply upgrades the active install (links validate surface by surface); a
    `reinstall` starts a new incarnation with no lineage, so links frozen under
    the old one fail closed until revalidated.

    With an `operator`, an install is also appended to the audit trail (OPS-2) in
    the same transaction; the CLI always passes one.
    """
    manifest = document if isinstance(document, PackManifest) else parse_manifest(document)
    digest = manifest_digest(manifest)
    owner = manifest.connector_owner_key
    async with conn.transaction():
        await q.lock_owner_key(conn, owner)
        current = await q.select_active_install(conn, owner)
        if current is not None and current.manifest_digest == digest and not reinstall:
            return ApplyPackResult(
                outcome=ApplyOutcome.UNCHANGED,
                pack_install_id=current.pack_install_id,
                connector_owner_key=owner,
                manifest_digest=digest,
            )
        if current is not None and not await q.deactivate_install(conn, current.pack_install_id):
            raise PackApplyConflict(f"install {current.pack_install_id} stopped being active")
        previous = current.pack_install_id if current and not reinstall else None
        new = await q.insert_active_install(
            conn, owner, manifest.namespace, _manifest_json(manifest), digest, previous
        )
        lineage = _lineage_rows(new.pack_install_id, manifest)
        await q.insert_lineage(conn, new.pack_install_id, lineage)
        if operator is not None:
            entry = _audit_entry(operator, reason, reinstall, current, new)
            await audit_q.append(conn, entry)
    return ApplyPackResult(
        outcome=ApplyOutcome.INSTALLED,
        pack_install_id=new.pack_install_id,
        connector_owner_key=owner,
        manifest_digest=digest,
        replaced_pack_install_id=current.pack_install_id if current else None,
        lineage_entries=len(lineage),
    )


def _audit_entry(
    operator: str,
    reason: str,
    reinstall: bool,
    before: q.PackInstallRow | None,
    after: q.PackInstallRow,
) -> AuditEntry:
    def state(row: q.PackInstallRow | None) -> JsonValue:
        if row is None:
            return None
        return {
            "active_pack_install_id": row.pack_install_id,
            "manifest_digest": row.manifest_digest,
        }

    return AuditEntry(
        operator=operator,
        reason=reason,
        command=AuditCommand.PACK_APPLY,
        arguments={"connector_owner_key": after.connector_owner_key, "reinstall": reinstall},
        state_before=state(before),
        state_after=state(after),
        outcome="reinstalled (new incarnation)" if reinstall else "installed",
    )


# An install's manifest, lineage and ancestors never change once written, so the
# parsed install is cached by its id; only "which install is active" is read per call.
_INSTALLS: dict[str, ActivePack] = {}
_INSTALLS_MAX = 64


async def _active_pack(conn: Conn, row: q.PackInstallRow) -> ActivePack:
    cached = _INSTALLS.get(row.pack_install_id)
    if cached is not None:
        return cached
    pack = ActivePack(
        pack_install_id=row.pack_install_id,
        connector_owner_key=row.connector_owner_key,
        manifest_digest=row.manifest_digest,
        manifest=parse_manifest(row.manifest),
        activated_at=row.activated_at,
        lineage=tuple(await q.select_lineage(conn, row.pack_install_id)),
        ancestors=tuple(await q.select_install_ancestors(conn, row.pack_install_id)),
    )
    if len(_INSTALLS) >= _INSTALLS_MAX:
        _INSTALLS.clear()
    _INSTALLS[row.pack_install_id] = pack
    return pack


async def get_active_pack(conn: Conn, owner_key: str) -> ActivePack | None:
    """The owner key's active install, or None when it has none."""
    row = await q.select_active_install(conn, owner_key)
    return None if row is None else await _active_pack(conn, row)


async def get_install(conn: Conn, pack_install_id: str) -> ActivePack | None:
    """One install by id, active or not (its manifest re-validated, then cached)."""
    row = await q.select_install(conn, pack_install_id)
    return None if row is None else await _active_pack(conn, row)


async def install_cached(conn: Conn, pack_install_id: str) -> ActivePack | None:
    """`get_install` without a statement when the install was parsed before (its manifest,
    lineage and ancestors never change)."""
    cached = _INSTALLS.get(pack_install_id)
    return cached if cached is not None else await get_install(conn, pack_install_id)


async def active_manifests(conn: Conn) -> list[PackManifest]:
    """The manifest of every owner key's active install."""
    packs = [await get_active_pack(conn, owner) for owner in await q.select_active_owner_keys(conn)]
    return [pack.manifest for pack in packs if pack is not None]
