"""When a bulk tool or an operator action may put a link to work under the active pack
(SPEC G-4, C-9).

`revalidate owner`, `revalidate-link`, backfill adoption and reconcile each finalize,
restore or adopt links. Each asks `refusal` first, for the link as the path would leave
it, so no path (and no new one) can skip the rule:

1. The link's action slot and destination slot are both in the active pack, and the
   action slot still names that destination (C-9). A link under a slot the pack removed,
   or recreated under a new id, stays as it is: rebind the slot through a declared lineage
   (then retire the link and `backfill apply` adopts its remote object under the new
   slot), or retire it.
2. Classified against the active pack (DRIFT-1, the finalized-link column), the link has
   no fail-closed finding but those the path settles itself (`SETTLES`).

A refused link is reported once, as skipped, with its `Refusal` (detail and remedy), and
nothing is written for it. `active_slot_pairs` is rule 1 as a set, for the SQL that
restores links to check again under the pack lock.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict

from protocol.active import ActiveMetadata
from protocol.drift import INSTALL_SURFACES, Disposition, DriftSurface, classify
from protocol.link_row import LinkRowState
from protocol.manifest import MirrorSpec, PackManifest
from protocol.snapshots import (
    ActionConfigSnapshot,
    AttemptSnapshot,
    LinkSnapshot,
    ProfileSnapshot,
    SlotNames,
    StableSlot,
)
from protocol.states import LinkStatus


class RestorePath(StrEnum):
    """The paths that finalize, restore or adopt a link (G-4)."""

    REVALIDATE_OWNER = "revalidate owner"
    REVALIDATE_LINK = "revalidate-link"
    BACKFILL_ADOPT = "backfill apply"
    RECONCILE = "reconcile"


class Blocker(StrEnum):
    SLOT_NOT_IN_ACTIVE_PACK = "slot_not_in_active_pack"
    FAIL_CLOSED_FINDING = "fail_closed_finding"
    # G-8: the remote reported the link's object deleted (a recorded deletion event).
    REMOTE_OBJECT_DELETED = "remote_object_deleted"


# The fail-closed surfaces each path settles itself, so a finding on them does not refuse.
SETTLES: Final[dict[RestorePath, frozenset[DriftSurface]]] = {
    # Its §9 receipts move the install and (--include-mapping-changes) the fingerprints.
    RestorePath.REVALIDATE_OWNER: INSTALL_SURFACES | {DriftSurface.MAPPING},
    # Judged after its refresh (install, names, profile, paths: `revalidated_link`); the
    # fingerprints move only by a §9 receipt (REV-1), which follows it.
    RestorePath.REVALIDATE_LINK: frozenset({DriftSurface.MAPPING}),
    # Born from the active pack: nothing may fail closed.
    RestorePath.BACKFILL_ADOPT: frozenset(),
    # Rule 1 only here: reconcile is an ambiguous attempt's one exit (G-6), so a recovered
    # remote id proceeds whatever else drifted (C-5); the link it makes is suspended in the
    # same transaction with the other fail-closed findings (services.operator), never
    # left finalized.
    RestorePath.RECONCILE: frozenset(DriftSurface),
}

_RETIRE = "or retire it (`retire KEY`)"
SLOT_REMEDY: Final = (
    "rebind the slot through a declared lineage (`pack apply`), retire this link and "
    "`backfill apply` adopts its remote object under the new slot; " + _RETIRE
)
REMEDIES: Final[dict[tuple[RestorePath, Blocker], str]] = {
    (RestorePath.REVALIDATE_OWNER, Blocker.FAIL_CLOSED_FINDING): (
        "check the change, then `revalidate-link KEY` (once the link is suspended: its next "
        "save fails closed) takes the active pack's names and profile; " + _RETIRE
    ),
    (RestorePath.REVALIDATE_LINK, Blocker.FAIL_CLOSED_FINDING): (
        "revalidation does not settle this; apply a pack that matches the link again, " + _RETIRE
    ),
    (RestorePath.REVALIDATE_OWNER, Blocker.REMOTE_OBJECT_DELETED): (
        "check the event (`links show KEY`); the link's object is gone: " + _RETIRE
    ),
    (RestorePath.RECONCILE, Blocker.SLOT_NOT_IN_ACTIVE_PACK): (
        "the attempt stays ambiguous_remote_effect with its evidence; apply a pack that "
        "has the slot again, then reconcile"
    ),
}


class Refusal(BaseModel):
    """Why `path` leaves the link `link_key` as it is, and what to do instead."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    link_key: str
    path: RestorePath
    blocker: Blocker
    detail: str
    remedy: str

    def message(self) -> str:
        """One line for an operator (`KEY` in the remedy is the link key)."""
        remedy = self.remedy.replace("KEY", self.link_key) if self.link_key else self.remedy
        return f"{self.path.value} does not apply (G-4): {self.detail}; {remedy}"


def slot_problem(active: ActiveMetadata) -> str | None:
    """Rule 1: what the active install lacks of the link's two slots, or None."""
    install = active.pack_install_id
    if active.action is None:
        return f"action slot {active.action_slot_id!r} is not in the active install {install}"
    if active.destination is None or active.profile is None:
        dest = active.destination_slot_id
        return f"destination slot {dest!r} is not in the active install {install}"
    if active.action.destination_slot != active.destination_slot_id:
        return (
            f"action slot {active.action_slot_id!r} now names destination slot "
            f"{active.action.destination_slot!r}, not {active.destination_slot_id!r}"
        )
    return None


def refusal(
    snapshot: LinkSnapshot | AttemptSnapshot, active: ActiveMetadata, path: RestorePath
) -> Refusal | None:
    """Rules 1-2 for `snapshot` (the link as `path` would leave it; reconcile: its attempt)
    against `active`, resolved for the snapshot's own two slot ids; None: it may go on."""
    problem = slot_problem(active)
    if problem is not None:
        return _refused(snapshot.link_key, path, Blocker.SLOT_NOT_IN_ACTIVE_PACK, problem)
    if path is RestorePath.REVALIDATE_LINK and isinstance(snapshot, LinkSnapshot):
        snapshot = revalidated_link(snapshot, active)
    settled = SETTLES[path]
    closed = [
        finding
        for finding in classify(snapshot, active)
        if finding.disposition is Disposition.FAIL_CLOSED and finding.surface not in settled
    ]
    if not closed:
        return None
    detail = "fail-closed drift " + "; ".join(f"{f.surface.value} ({f.detail})" for f in closed)
    return _refused(snapshot.link_key, path, Blocker.FAIL_CLOSED_FINDING, detail)


def deleted_refusal(key: str, path: RestorePath, detail: str) -> Refusal:
    """G-8: the link's remote object was reported deleted; `detail` names the event."""
    return _refused(key, path, Blocker.REMOTE_OBJECT_DELETED, detail)


def _refused(key: str, path: RestorePath, blocker: Blocker, detail: str) -> Refusal:
    remedy = REMEDIES.get((path, blocker), SLOT_REMEDY)
    return Refusal(link_key=key, path=path, blocker=blocker, detail=detail, remedy=remedy)


def adoption_refusal(active: ActiveMetadata) -> Refusal | None:
    """Rules 1-2 for every link adopted under `active` (backfill): each is born from the
    active install's snapshots (services.backfill_adopt.adopted_slot_values), so one check
    answers for the slot."""
    path, problem = RestorePath.BACKFILL_ADOPT, slot_problem(active)
    if problem is not None:
        return _refused("", path, Blocker.SLOT_NOT_IN_ACTIVE_PACK, problem)
    action = active.action_snapshot()
    born = LinkSnapshot(
        link_key="",
        slot=active.stable_slot(),
        source_record_id="",
        names=active.names(),
        created_pack_install_id=active.pack_install_id,
        last_validated_pack_install_id=active.pack_install_id,
        profile=active.profile_snapshot(),
        action=action,
        remote_id="",
        remote_scope=active.require()[1].remote_scope,
        status=LinkStatus.FINALIZED,
    )
    return refusal(born, active, path)


def revalidated_link(link: LinkSnapshot, active: ActiveMetadata) -> LinkSnapshot:
    """The link as `revalidate-link` leaves it: the active install's names, profile and
    paths, its own fingerprints (services.patch.plan.validated_values, in snapshot form)."""
    paths = active.action_snapshot()
    return link.model_copy(
        update={
            "last_validated_pack_install_id": active.pack_install_id,
            "names": active.names(),
            "profile": active.profile_snapshot(),
            "action": link.action.model_copy(
                update={
                    "create_path_template": paths.create_path_template,
                    "update_path_template": paths.update_path_template,
                    "response_id_path": paths.response_id_path,
                }
            ),
        }
    )


def active_slot_pairs(manifest: PackManifest) -> tuple[list[str], list[str]]:
    """Rule 1 as a set: (action slot ids, their destination slot ids), position by
    position, of the pack's action slots whose destination slot it declares."""
    pairs = [
        (slot.id, slot.destination_slot)
        for slot in manifest.action_slots
        if manifest.destination_slot(slot.destination_slot) is not None
    ]
    return [action for action, _ in pairs], [destination for _, destination in pairs]


def link_of_row(row: LinkRowState) -> LinkSnapshot:
    """The link a revalidation read (`LinkRowState`) as the drift classifier sees it."""
    # A link without a mirror pair (none was declared when it was made) compares as a
    # placeholder pair: a mirror change blocks only the mirror (MIRROR_BLOCKED), never G-4.
    mirror = {
        "remote_id_field": row.mirror_remote_id_field or "-",
        "provenance_field": row.mirror_provenance_field or "-",
    }
    return LinkSnapshot(
        link_key=row.link_key,
        slot=StableSlot(
            connector_owner_key=row.connector_owner_key,
            action_slot_id=row.action_slot_id,
            destination_slot_id=row.destination_slot_id,
            source_object=row.source_object,
        ),
        source_record_id=row.source_record_id,
        names=SlotNames(
            connector_namespace=row.connector_namespace,
            flow_developer_name=row.flow_developer_name,
            flow_action_name=row.flow_action_name,
            flow_version=row.flow_version or "",
            target_object=row.target_object,
            profile_name=row.profile_name,
        ),
        created_pack_install_id=row.created_pack_install_id,
        last_validated_pack_install_id=row.last_validated_pack_install_id,
        profile=_profile_of_row(row),
        action=ActionConfigSnapshot(
            create_path_template=row.create_path_template,
            update_path_template=row.update_path_template,
            response_id_path=row.response_id_path,
            mirror=MirrorSpec.model_validate(mirror),
            mapping_fingerprint=row.mapping_fingerprint,
            body_fingerprint=row.body_fingerprint,
        ),
        remote_id=row.remote_id,
        remote_scope=row.remote_scope,
        status=LinkStatus(row.status),
        last_mapping_revalidation_operation_id=row.last_mapping_revalidation_operation_id,
    )


def _profile_of_row(row: LinkRowState) -> ProfileSnapshot:
    """The frozen profile; a link frozen before the JSON snapshot (migration 0004) has only
    its columns, and what they do not hold compares as undeclared."""
    if row.profile_snapshot is not None:
        return ProfileSnapshot.model_validate(row.profile_snapshot)
    return ProfileSnapshot(
        profile_name=row.profile_name,
        credential_ref=row.credential_ref,
        credential_generation_hash=row.credential_generation_hash or "",
        credential_rotation_same_destination=False,
        endpoint_class=row.endpoint_class,
        base_url="",
        endpoint_binding_hash=row.endpoint_binding_hash or "",
        retry_policy_hash=row.retry_policy_hash,
        profile_payload_hash=row.profile_payload_hash,
        post_idempotency_header=None,
        patch_replay_safe=False,
        precondition_header=None,
        locator_recovery=None,
    )
