"""Admission inputs and decisions (WF-2): plain snapshots passed in and out of the gates."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, JsonValue

from protocol.active import ActiveMetadata
from protocol.authority import PermissionFacts
from protocol.drift import Finding
from protocol.errors import RejectReason
from protocol.manifest import LineageKind, PackManifest, RemoteDestination
from protocol.request import PatchRequest
from protocol.snapshots import (
    ActionConfigSnapshot,
    AuthoritySnapshot,
    CreateRequestSnapshot,
    LinkSnapshot,
    SlotNames,
    Snapshot,
    StableSlot,
    WritebackSnapshot,
)
from protocol.states import ATTEMPT_RELEASED, AttemptStatus, DispatchLane, LinkStatus


class SaveRequest(Snapshot):
    """What the CRM reported for one save (WF-2)."""

    connector_owner_key: str
    action_slot_id: str
    destination_slot_id: str
    source_object: str
    source_record_id: str
    originating_user_id: str | None


class RecordView(Snapshot):
    exists: bool
    # Only meaningful when not `exists`: the store has it marked deleted (`source_deleted`)
    # rather than never having had it (`source_not_found`).
    deleted: bool = False
    fields: dict[str, JsonValue] = Field(default_factory=dict)


class AttemptSummary(Snapshot):
    attempt_id: str
    status: AttemptStatus
    dispatch_lane: str = DispatchLane.CONFIGURED.value
    attempt_ordinal: int = 1


class LineageRow(Snapshot):
    """A link or attempt for this record found under a lineage predecessor slot (ID-6)."""

    slot_id: str
    link_status: LinkStatus | None = None
    attempt_status: AttemptStatus | None = None
    rebound: bool = False

    @property
    def resolved(self) -> bool:
        link_done = self.link_status in (None, LinkStatus.RETIRED)
        attempt_done = self.attempt_status in (None, *ATTEMPT_RELEASED)
        return self.rebound or (link_done and attempt_done)


class RecordOwnershipRow(Snapshot):
    """A link or attempt of this owner for this same source record under another link key
    (any action or destination slot): what the prior-ownership gate weighs (GATE-1)."""

    link_key: str
    action_slot_id: str
    destination_slot_id: str
    link_status: LinkStatus | None = None
    attempt_status: AttemptStatus | None = None
    remote_id: str | None = None


class PackSlots(Snapshot):
    """The slot ids one owner's active pack still knows (SPEC C-6): its action slots, the
    action slots a declared rebind moved into one of them, and its destination slots,
    with where each destination slot creates and the slot pairs declared separate (G-2)."""

    action_slot_ids: frozenset[str]
    destination_slot_ids: frozenset[str]
    remote_destinations: tuple[tuple[str, RemoteDestination], ...] = ()
    separate: frozenset[frozenset[str]] = frozenset()

    @classmethod
    def of(cls, manifest: PackManifest) -> PackSlots:
        rebound = {e.from_slot for e in manifest.lineage if e.kind is LineageKind.REBIND}
        return cls(
            action_slot_ids=frozenset({s.id for s in manifest.action_slots} | rebound),
            destination_slot_ids=frozenset(d.id for d in manifest.destination_slots),
            remote_destinations=tuple(
                (d.id, (d.remote_scope, d.target_object)) for d in manifest.destination_slots
            ),
            separate=manifest.separate_pairs(),
        )

    def knows(self, row: RecordOwnershipRow) -> bool:
        return (
            row.action_slot_id in self.action_slot_ids
            and row.destination_slot_id in self.destination_slot_ids
        )

    def remote_destination(self, destination_slot_id: str) -> RemoteDestination | None:
        return dict(self.remote_destinations).get(destination_slot_id)

    def declared_separate(self, action_slot_id: str, other_action_slot_id: str) -> bool:
        return frozenset((action_slot_id, other_action_slot_id)) in self.separate


class AssociationTarget(Snapshot):
    """The target link found for one association contract's save-time source id."""

    link_status: LinkStatus | None = None
    remote_id: str | None = None


class AdmissionContext(Snapshot):
    save: SaveRequest
    active: ActiveMetadata | None
    active_incarnations: int = 1
    link: LinkSnapshot | None = None
    attempts: tuple[AttemptSummary, ...] = ()
    lineage_rows: tuple[LineageRow, ...] = ()
    record_rows: tuple[RecordOwnershipRow, ...] = ()
    # The active pack's slot ids (C-6): a live row under a slot outside them is from a
    # slot removed or recreated without a declared rebind. None: not read (no check).
    pack_slots: PackSlots | None = None
    record: RecordView
    permissions: PermissionFacts | None
    association_targets: dict[str, AssociationTarget] = Field(default_factory=dict)
    idempotency_key: str
    locator_value: str | None = None
    decided_at: datetime


class Reservation(Snapshot):
    """Everything the attempt row freezes at reservation (STO-2, GATE-2)."""

    link_key: str
    slot: StableSlot
    source_record_id: str
    names: SlotNames
    pack_install_id: str
    remote_scope: str
    dispatch_lane: DispatchLane
    action: ActionConfigSnapshot
    request: CreateRequestSnapshot
    authority: AuthoritySnapshot
    association_vector: tuple[str, ...]
    writeback: WritebackSnapshot


class CreateReserved(Snapshot):
    kind: Literal["create_reserved"] = "create_reserved"
    reservation: Reservation


class DeferredAssociationReserved(Snapshot):
    kind: Literal["deferred_association_reserved"] = "deferred_association_reserved"
    reservation: Reservation
    waiting_on: tuple[str, ...]


class PatchQueued(Snapshot):
    kind: Literal["patch_queued"] = "patch_queued"
    link_key: str
    remote_id: str
    request: PatchRequest
    authority: AuthoritySnapshot
    findings: tuple[Finding, ...] = ()
    # PROF-3: the remote budget the PATCH spends, so the entry can start the link's run
    # already paced (a run that looks it up costs a billed local activity, NF-6).
    budget_key: str | None = None


class ObservedActiveAttempt(Snapshot):
    kind: Literal["observed_active_attempt"] = "observed_active_attempt"
    link_key: str
    attempt_id: str
    status: AttemptStatus
    dispatch_lane: str


class Rejected(Snapshot):
    kind: Literal["rejected"] = "rejected"
    reason: RejectReason
    detail: str = ""
    link_key: str | None = None
    findings: tuple[Finding, ...] = ()


AdmissionDecision = Annotated[
    CreateReserved | DeferredAssociationReserved | PatchQueued | ObservedActiveAttempt | Rejected,
    Field(discriminator="kind"),
]
