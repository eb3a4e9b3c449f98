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
from protocol.drift import INSTALL_REASONS, DriftSurface
from protocol.errors import drift_reason
from protocol.installable import check_installable
from protocol.manifest import ManifestInvalid, PackManifest, parse_manifest
from protocol.pack_claims import unverified_claim_problems
from protocol.snapshots import manifest_digest
from services.pack_verify import verifications_for

# Manifest lineage entries name action slots (protocol/manifest.py checks them so).
ACTION_SLOT: str = "action"


class PackApplyConflict(Exception):
    """The active install changed under the owner-key lock (someone bypassed it)."""


class ClaimsUnverified(ManifestInvalid):
    """A profile's replay-safety or precondition claim was found not holding by `pack
    verify` (or, in production, not found holding): nothing is written."""


ACCEPT_FLAG: str = "--accept-unverified-claims"


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
    # C-4: links of the owner that now wait for an explicit revalidation (no PATCH until
    # then), and the one command that revalidates them.
    links_awaiting_revalidation: int = 0
    revalidate_command: str | None = None
    # C-9: finalized links whose action slot this install no longer has, suspended now.
    links_suspended_slot_removed: int = 0
    suspended_examples: tuple[str, ...] = ()
    # C-8: action slots whose createPath changed: creates wait for `revalidate create-path`.
    create_paths_awaiting_validation: tuple[str, ...] = ()
    validate_create_path_command: str | None = None


REMOVED_SLOT_REASON: str = drift_reason(DriftSurface.ACTION_RECREATED.value)
EXAMPLES = 5


def revalidate_owner_command(owner_key: str) -> str:
    """The exact command that revalidates every link of `owner_key` (C-4)."""
    return (
        f"connector-push revalidate owner --owner-key {owner_key} --approved-by WHO "
        "--approval-reference REF --reason WHY"
    )


def validate_create_path_command(owner_key: str) -> str:
    """The exact command that validates the owner's changed create paths (C-8)."""
    return f"connector-push revalidate create-path --owner-key {owner_key} --reason WHY"


def create_path_changes(
    before: PackManifest | None, after: PackManifest
) -> list[tuple[str, str, str]]:
    """(action slot, new createPath, old createPath) for every slot kept with a new path."""
    if before is None:
        return []
    old = {slot.id: slot.create_path for slot in before.action_slots}
    return [
        (slot.id, slot.create_path, old[slot.id])
        for slot in after.action_slots
        if slot.id in old and old[slot.id] != slot.create_path
    ]


def previous_manifest(row: q.PackInstallRow | None) -> PackManifest | None:
    """The manifest of the install `row` names, if there is one and it still parses."""
    if row is None:
        return None
    try:
        return parse_manifest(row.manifest)
    except ManifestInvalid:
        return None


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
    # C-8: action slots whose changed createPath awaits validation (not cached: read with
    # "which install is active").
    create_blocked: frozenset[str] = frozenset()


def _lineage_rows(install_id: str, manifest: PackManifest) -> list[q.LineageRow]:
    return [
        q.LineageRow(install_id, ACTION_SLOT, entry.kind, entry.from_slot, entry.to_slot)
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
    production: bool = False,
    accept_unverified_claims: bool = False,
) -> ApplyPackResult:
    """Validate `document` and make it the owner key's active install, in one transaction.

    Raises `ManifestInvalid` before touching the database. Idempotent on the
    manifest digest: re-applying the active manifest writes nothing. A normal
    apply upgrades the active install (links validate surface by surface); a
    `reinstall` starts a new incarnation with no lineage, so links frozen under
    the old one fail closed until revalidated.

    With an `operator`, an install is also appended to the audit trail (OPS-2) in
    the same transaction; the CLI always passes one.

    A profile whose replay-safety or precondition claim `pack verify` found not holding
    for this digest (in `production`, also one never found holding) raises
    `ClaimsUnverified`, unless `accept_unverified_claims`, which needs an operator and a
    reason and is audited with the claims it accepted.
    """
    manifest = check_installable(
        document if isinstance(document, PackManifest) else parse_manifest(document)
    )
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
        accepted = await _claims_gate(conn, manifest, production, accept_unverified_claims)
        if accepted and (operator is None or not reason.strip()):
            raise ClaimsUnverified((f"{ACCEPT_FLAG} needs an operator and a reason (audited)",))
        if current is not None and not await q.deactivate_install(conn, current.pack_install_id):
            raise PackApplyConflict(f"install {current.pack_install_id} stopped being active")
        previous = current.pack_install_id if current and not reinstall else None
        new = await q.insert_active_install(
            conn, owner, manifest.namespace, _manifest_json(manifest), digest, previous
        )
        lineage = _lineage_rows(new.pack_install_id, manifest)
        await q.insert_lineage(conn, new.pack_install_id, lineage)
        install = new.pack_install_id
        kept = [slot.id for slot in manifest.action_slots]
        suspended = await q.suspend_removed_slot_links(
            conn, owner, kept, REMOVED_SLOT_REASON, DriftSurface.ACTION_RECREATED, install
        )
        changed = create_path_changes(previous_manifest(current), manifest)
        if changed:
            await q.record_create_path_changes(conn, owner, changed, install)
        waiting = sum(await q.count_awaiting_revalidation(conn, owner, install, INSTALL_REASONS))
        if operator is not None:
            entry = _audit_entry(operator, reason, reinstall, current, new, accepted)
            await audit_q.append(conn, entry)
    return ApplyPackResult(
        outcome=ApplyOutcome.INSTALLED,
        pack_install_id=install,
        connector_owner_key=owner,
        manifest_digest=digest,
        replaced_pack_install_id=current.pack_install_id if current else None,
        lineage_entries=len(lineage),
        links_awaiting_revalidation=waiting,
        revalidate_command=revalidate_owner_command(owner) if waiting else None,
        links_suspended_slot_removed=len(suspended),
        suspended_examples=tuple(suspended[:EXAMPLES]),
        create_paths_awaiting_validation=tuple(slot for slot, _, _ in changed),
        validate_create_path_command=validate_create_path_command(owner) if changed else None,
    )


async def unverified_claims(
    conn: Conn, manifest: PackManifest, production: bool
) -> tuple[str, ...]:
    """The guarded claims of `manifest` that `pack verify` did not find holding for its
    digest (in `production`, also those never verified): what apply refuses or accepts."""
    verified = await verifications_for(conn, manifest)
    return tuple(unverified_claim_problems(manifest, verified, production=production))


def claims_refusal(problems: tuple[str, ...]) -> ClaimsUnverified:
    """The refusal of an install with `problems` the operator did not accept."""
    hint = (
        "run `connector-push pack verify PACK --profile NAME` against a test remote, "
        f"or pass {ACCEPT_FLAG} with --reason (audited)"
    )
    return ClaimsUnverified((*problems, hint))


async def _claims_gate(
    conn: Conn, manifest: PackManifest, production: bool, accept: bool
) -> tuple[str, ...]:
    """The unverified claims an install accepts (empty: none); raises `ClaimsUnverified`
    when there are some and the operator did not accept them."""
    problems = await unverified_claims(conn, manifest, production)
    if problems and not accept:
        raise claims_refusal(problems)
    return problems


def _audit_entry(
    operator: str,
    reason: str,
    reinstall: bool,
    before: q.PackInstallRow | None,
    after: q.PackInstallRow,
    accepted: tuple[str, ...] = (),
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
        arguments={
            "connector_owner_key": after.connector_owner_key,
            "reinstall": reinstall,
            **({"accepted_unverified_claims": list(accepted)} if accepted else {}),
        },
        state_before=state(before),
        state_after=state(after),
        outcome=("reinstalled (new incarnation)" if reinstall else "installed")
        + (f"; {len(accepted)} unverified claim(s) accepted by the operator" if accepted else ""),
    )


# An install's manifest, lineage and ancestors never change once written, so the
# parsed install is cached by its id; only "which install is active" is read per call.
_INSTALLS: dict[str, ActivePack] = {}
_INSTALLS_MAX = 64


async def pack_of_install(conn: Conn, row: q.PackInstallRow) -> ActivePack:
    """The parsed install `row` names, cached by its id (an install never changes)."""
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
    if row is None:
        return None
    pack = await pack_of_install(conn, row)
    if row.create_blocked:
        return pack.model_copy(update={"create_blocked": frozenset(row.create_blocked)})
    return pack


async def get_install(conn: Conn, pack_install_id: str) -> ActivePack | None:
    """One install by id, active or not (its manifest re-validated, then cached)."""
    row = await q.select_install(conn, pack_install_id)
    return None if row is None else await pack_of_install(conn, row)


async def install_cached(conn: Conn, pack_install_id: str) -> ActivePack | None:
    """`get_install` without a statement when the install was parsed before (its manifest,
    lineage and ancestors never change)."""
    cached = _INSTALLS.get(pack_install_id)
    return cached if cached is not None else await get_install(conn, pack_install_id)


async def active_manifests(conn: Conn) -> list[PackManifest]:
    """The manifest of every owner key's active install."""
    packs = [await get_active_pack(conn, owner) for owner in await q.select_active_owner_keys(conn)]
    return [pack.manifest for pack in packs if pack is not None]


async def validate_create_paths(
    conn: Conn, owner_key: str, action_slots: list[str] | None, operator: str, reason: str
) -> list[q.CreatePathBlock]:
    """C-8: the owner's changed create paths (those of `action_slots`, or all) validated, so
    creates for those slots are admitted again; one audit entry per slot, same transaction."""
    async with conn.transaction():
        await q.lock_owner_key(conn, owner_key)  # not while an apply changes the paths
        validated = await q.validate_create_paths(conn, owner_key, action_slots, operator, reason)
        entries = [
            AuditEntry(
                operator=operator,
                reason=reason,
                command=AuditCommand.REVALIDATE_CREATE_PATH,
                arguments={"connector_owner_key": owner_key, "action_slot_id": b.action_slot_id},
                state_before={
                    "create_path": b.create_path_template,
                    "previous_create_path": b.previous_create_path,
                    "pack_install_id": b.pack_install_id,
                    "validated": False,
                },
                state_after={"create_path": b.create_path_template, "validated": True},
                outcome="create path validated; creates for the slot are admitted",
            )
            for b in validated
        ]
        if entries:
            await audit_q.append_many(conn, entries)
    return validated
