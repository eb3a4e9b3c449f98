"""Legacy-link adoption (SPEC MIG-1): the vocabulary, what the caller loads and what comes out.

`protocol.backfill_evidence` reads a record's mirror fields, `protocol.backfill`
decides; these are the values both pass around.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pydantic import JsonValue

from protocol.active import ActiveMetadata
from protocol.identity import link_key
from protocol.manifest import MirrorSpec, PackManifest
from protocol.snapshots import Snapshot
from protocol.states import AttemptStatus, LinkStatus


class Outcome(StrEnum):
    ADOPTABLE = "adoptable"  # plan: apply would create the link
    ADOPTED = "adopted"  # apply: the link was created by this run
    ALREADY_ADOPTED = "already_adopted"  # a link with this remote id exists
    SKIPPED = "skipped"  # no legacy evidence: not a candidate
    REJECTED = "rejected"  # evidence, but ambiguous: fails closed, nothing written


class RejectReason(StrEnum):
    NO_REMOTE_ID_AND_NO_PROVENANCE = "no_remote_id_and_no_provenance"  # the skip reason
    INVALID_RECORD_ID = "invalid_record_id"
    SOURCE_DELETED = "source_deleted"
    MALFORMED_MIRROR_VALUE = "malformed_mirror_value"
    MULTIPLE_CANDIDATE_REMOTE_IDS = "multiple_candidate_remote_ids"
    MULTIPLE_CANDIDATE_PROVENANCES = "multiple_candidate_provenances"
    REMOTE_ID_OUTSIDE_CURRENT_FIELD_PAIR = "remote_id_outside_current_field_pair"
    REMOTE_ID_WITHOUT_PROVENANCE = "remote_id_without_provenance"
    PROVENANCE_WITHOUT_REMOTE_ID = "provenance_without_remote_id"
    PROVENANCE_UNRECOGNIZED = "provenance_unrecognized"
    PROVENANCE_KEY_MISMATCH = "provenance_key_mismatch"
    PROVENANCE_FOR_OTHER_OWNER = "provenance_for_other_owner"
    PROVENANCE_FOR_OTHER_SLOT = "provenance_for_other_slot"
    DESTINATION_CHANGED = "destination_changed"
    LINK_EXISTS_WITH_OTHER_REMOTE_ID = "link_exists_with_other_remote_id"
    ATTEMPT_EXISTS = "attempt_exists"
    REMOTE_ID_CLAIMED_TWICE = "remote_id_claimed_twice"
    # G-4 (protocol.restore_rule): the adopted link could not work under the active pack.
    NOT_ADOPTABLE_UNDER_ACTIVE_PACK = "not_adoptable_under_active_pack"
    # G-8: the remote reported this object deleted (a recorded deletion event).
    REMOTE_OBJECT_DELETED = "remote_object_deleted"


class ProvenanceFormat(StrEnum):
    LINK_KEY = "link_key"
    LEGACY_MARKER = "legacy_marker"


# -- inputs ------------------------------------------------------------------------


class BackfillSlot(Snapshot):
    """One action slot of the active install, with everything adoption compares against."""

    connector_owner_key: str
    action_slot_id: str
    destination_slot_id: str
    source_object: str
    remote_scope: str
    current_pair: MirrorSpec
    # Pairs earlier installs declared for this slot or a predecessor, other than the current.
    earlier_pairs: tuple[MirrorSpec, ...] = ()
    # Slots the active pack rebinds (transitively) into this one (ID-6).
    rebound_from: tuple[str, ...] = ()
    # Every action / destination slot id the pack ever named: the link keys a
    # link-key provenance is matched against.
    known_action_slots: tuple[str, ...] = ()
    known_destination_slots: tuple[str, ...] = ()

    def key_for(self, record_id: str, action_slot_id: str | None = None) -> str:
        """This record's link key under this slot (or under `action_slot_id`, same destination)."""
        return link_key(
            self.connector_owner_key,
            action_slot_id or self.action_slot_id,
            self.source_object,
            record_id,
            self.destination_slot_id,
        )


class LegacyRecord(Snapshot):
    """One local record as the store holds it (deleted ones included)."""

    source_object: str
    record_id: str
    fields: dict[str, JsonValue]
    deleted: bool = False


class Locator(Snapshot):
    """The ID-4 remote-locator tuple."""

    connector_owner_key: str
    destination_slot_id: str
    remote_scope: str
    remote_id: str


class LinkFact(Snapshot):
    link_key: str
    action_slot_id: str
    locator: Locator
    status: LinkStatus


class AttemptFact(Snapshot):
    link_key: str
    attempt_id: str
    status: AttemptStatus


class StoredFacts(Snapshot):
    """Rows for the keys and locators `lookups` named (read under the key locks on apply)."""

    links: tuple[LinkFact, ...] = ()
    attempts: tuple[AttemptFact, ...] = ()
    # Non-retired links owning a locator the batch claims, whatever their key.
    locator_owners: tuple[LinkFact, ...] = ()


class Lookups(Snapshot):
    link_keys: tuple[str, ...]  # sorted: the order apply locks them in
    locators: tuple[Locator, ...]


# -- outputs ------------------------------------------------------------------------


class RecordDecision(Snapshot):
    action_slot_id: str
    source_object: str
    record_id: str
    outcome: Outcome
    reason: RejectReason | None = None
    detail: str = ""
    link_key: str | None = None
    remote_id: str | None = None
    provenance_format: ProvenanceFormat | None = None
    # The slot the provenance named: this one, or a predecessor it rebinds.
    via_slot: str | None = None


# -- building the slot ------------------------------------------------------------------


def backfill_slot(
    manifest: PackManifest, active: ActiveMetadata, earlier: Sequence[PackManifest] = ()
) -> BackfillSlot:
    """The slot as adoption sees it; `earlier` are the manifests of the active install's
    ancestors (not across a reinstall), newest first. `active` must be usable."""
    action, destination, _ = active.require()
    lineage_slots = {e.from_slot for m in (manifest, *earlier) for e in m.lineage}
    named = {active.action_slot_id, *active.lineage_predecessors}
    pairs: list[MirrorSpec] = []
    for old in earlier:
        for slot in old.action_slots:
            if slot.id in named and slot.mirror != action.mirror and slot.mirror not in pairs:
                pairs.append(slot.mirror)
    everything = (manifest, *earlier)
    return BackfillSlot(
        connector_owner_key=active.connector_owner_key,
        action_slot_id=active.action_slot_id,
        destination_slot_id=active.destination_slot_id,
        source_object=action.source_object,
        remote_scope=destination.remote_scope,
        current_pair=action.mirror,
        earlier_pairs=tuple(pairs),
        rebound_from=active.lineage_predecessors,
        known_action_slots=tuple(
            sorted({s.id for m in everything for s in m.action_slots} | lineage_slots)
        ),
        known_destination_slots=tuple(
            sorted({d.id for m in everything for d in m.destination_slots})
        ),
    )
