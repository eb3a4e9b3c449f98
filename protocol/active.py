"""The active pack, resolved for one action slot: what admission and drift compare against."""

from __future__ import annotations

from pydantic import Field

from protocol.manifest import (
    ActionSlot,
    DestinationSlot,
    PackManifest,
    Profile,
    lineage_predecessors,
)
from protocol.snapshots import (
    ActionConfigSnapshot,
    ProfileSnapshot,
    SlotNames,
    Snapshot,
    StableSlot,
)


class ActiveMetadata(Snapshot):
    """One active install's view of (owner, action slot, destination slot).

    Missing parts are `None` rather than errors: the drift classifier and the
    gates turn them into findings and named rejections.
    """

    pack_install_id: str
    connector_owner_key: str
    namespace: str
    action_slot_id: str
    destination_slot_id: str
    action: ActionSlot | None
    destination: DestinationSlot | None
    profile: Profile | None
    association_slots: dict[str, ActionSlot] = Field(default_factory=dict)
    lineage_predecessors: tuple[str, ...] = ()
    # Current readable source fields of the originating user, when known (drift row
    # "source field FLS/RLS changes").
    readable_fields: frozenset[str] | None = None
    # Installs the active one upgraded (not across a reinstall): a link frozen under
    # one of them is validated surface by surface instead of failing closed.
    install_ancestors: frozenset[str] = frozenset()
    # C-8 (drift row "create path changes"): the action slot's createPath changed in an
    # apply and nobody has validated it yet: no new create for this slot until then.
    create_path_unvalidated: bool = False

    @property
    def usable(self) -> bool:
        """Action, destination and profile all resolve and agree on the destination."""
        return (
            self.action is not None
            and self.destination is not None
            and self.profile is not None
            and self.action.destination_slot == self.destination_slot_id
        )

    def require(self) -> tuple[ActionSlot, DestinationSlot, Profile]:
        assert self.action and self.destination and self.profile, "check .usable first"
        return self.action, self.destination, self.profile

    def stable_slot(self) -> StableSlot:
        action, _, _ = self.require()
        return StableSlot(
            connector_owner_key=self.connector_owner_key,
            action_slot_id=self.action_slot_id,
            destination_slot_id=self.destination_slot_id,
            source_object=action.source_object,
        )

    def names(self) -> SlotNames:
        action, destination, profile = self.require()
        return SlotNames(
            connector_namespace=self.namespace,
            flow_developer_name=action.flow_developer_name,
            flow_action_name=action.flow_action_name,
            flow_version=action.flow_version,
            target_object=destination.target_object,
            profile_name=profile.name,
        )

    def profile_snapshot(self) -> ProfileSnapshot:
        return ProfileSnapshot.of(self.require()[2])

    def action_snapshot(self) -> ActionConfigSnapshot:
        return ActionConfigSnapshot.of(self.require()[0])


def resolve_active(
    manifest: PackManifest,
    pack_install_id: str,
    action_slot_id: str,
    destination_slot_id: str | None = None,
    install_ancestors: frozenset[str] = frozenset(),
    create_blocked: frozenset[str] = frozenset(),
) -> ActiveMetadata:
    """Resolve a slot by its stable ids only; `destination_slot_id` defaults to the
    action slot's current destination (pass the stored one when validating a link)."""
    action = manifest.action_slot(action_slot_id)
    dest_id = destination_slot_id or (action.destination_slot if action else "")
    destination = manifest.destination_slot(dest_id)
    profile = manifest.profile(destination.profile) if destination else None
    targets = {a.target_action_slot for a in action.associations} if action else set()
    return ActiveMetadata(
        pack_install_id=pack_install_id,
        connector_owner_key=manifest.connector_owner_key,
        namespace=manifest.namespace,
        action_slot_id=action_slot_id,
        destination_slot_id=dest_id,
        action=action,
        destination=destination,
        profile=profile,
        association_slots={t: s for t in targets if (s := manifest.action_slot(t)) is not None},
        lineage_predecessors=lineage_predecessors(manifest, action_slot_id),
        install_ancestors=install_ancestors,
        create_path_unvalidated=action_slot_id in create_blocked,
    )
