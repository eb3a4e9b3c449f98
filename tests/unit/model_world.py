"""The state the model-based test of the rules keeps (tests/unit/test_model_rules.py): the
configuration, the rows (links, attempts, PATCHes and their send journals) and the remote
(objects created, idempotency keys that expire). Nothing here decides: every decision is
a call into `protocol/`, made by the state machine; this module only stores what those
functions read and write, and moves rows through the transition tables of
`protocol.states` (an illegal move raises `ProtocolError`, failing the run)."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import (
    AdmissionContext,
    AttemptSummary,
    PackSlots,
    RecordOwnershipRow,
    RecordView,
    Reservation,
    SaveRequest,
)
from protocol.authority import PermissionFacts
from protocol.identity import link_key
from protocol.landing import landing
from protocol.manifest import PackManifest, parse_manifest
from protocol.messages import LinkView
from protocol.recovery import JournalEntry, SendKind, may_have_landed
from protocol.snapshots import (
    AttemptSnapshot,
    CreateRequestSnapshot,
    LinkSnapshot,
    ProfileSnapshot,
)
from protocol.states import (
    AttemptStatus,
    LinkStatus,
    PatchStatus,
    check_attempt_transition,
    check_link_transition,
    check_patch_transition,
)
from tests.unit.factories import CONTACT_FIELDS, NOW, demo_document

OWNER, RECORD, USER = "demo-owner", "003A", "user-1"
SLOT_A, SLOT_B = "push-contact", "push-contact-2"
DEST_A, DEST_B = "remote-contacts", "remote-contacts-2"
FIELDS = {"Email": "a@example.com", "FirstName": "Ada", "LastName": "L", "Phone": "1"}
PERMISSIONS = PermissionFacts(
    object_readable=True, record_readable=True, readable_fields=CONTACT_FIELDS
)
RemoteDestination = tuple[str, str]  # (remote scope, target object)


@dataclass(frozen=True)
class Config:
    """The pack as the operator last applied it: the demo pack's contact slot, a second
    contact slot (on the same destination slot, or on a second one with the same remote
    scope and target), optionally declared separate owners, and the edits applied since."""

    two_slots: bool
    second_destination: bool
    separate: bool
    profile: str
    mapping: int = 0
    credential: int = 0
    endpoint: int = 0
    removed: frozenset[str] = frozenset()

    def slots(self) -> tuple[str, ...]:
        present = (SLOT_A, SLOT_B) if self.two_slots else (SLOT_A,)
        return tuple(s for s in present if s not in self.removed)

    def destination_of(self, slot: str) -> str:
        return DEST_B if slot == SLOT_B and self.second_destination else DEST_A

    def in_pack(self, action_slot: str, destination_slot: str) -> bool:
        """Rule 1 of G-4 read off the configuration itself (the invariant's own reading)."""
        return action_slot in self.slots() and self.destination_of(action_slot) == destination_slot


@functools.cache
def _demo() -> dict[str, Any]:
    return demo_document()  # parsed once: YAML is slow next to everything else here


@functools.lru_cache(maxsize=256)
def manifest(config: Config) -> PackManifest:
    """The pack `config` describes, parsed as `pack apply` parses it (not refused for G-2:
    a legacy install from before that check, as tests/db/test_one_creator.py installs)."""
    document = copy.deepcopy(_demo())
    contact = document["actionSlots"][0]
    for mapping in contact["mappings"]:
        if mapping["sourceField"] == "LastName" and config.mapping:
            mapping["remoteProperty"] = f"lastname_v{config.mapping}"
    [destination] = [d for d in document["destinationSlots"] if d["id"] == DEST_A]
    destination["profile"] = config.profile
    [profile] = [p for p in document["profiles"] if p["name"] == config.profile]
    profile["credentialGeneration"] = str(1 + config.credential)
    if config.endpoint:
        profile["endpointClass"] = f"objects-api-v{config.endpoint}"
    if config.two_slots:
        second = copy.deepcopy(contact) | {"id": SLOT_B, "destinationSlot": DEST_A}
        if config.second_destination:
            document["destinationSlots"].append({**destination, "id": DEST_B})
            second["destinationSlot"] = DEST_B
        document["actionSlots"].append(second)
    slots = config.slots()
    # The deal slot keeps the pack valid when both contact slots are removed; the company
    # slot goes, its association naming the contact slot.
    document["actionSlots"] = [
        s for s in document["actionSlots"] if s["id"] in slots or s["id"] == "push-deal"
    ]
    if config.separate and set(slots) == {SLOT_A, SLOT_B}:
        document["separateOwnership"] = [{"actionSlots": [SLOT_A, SLOT_B], "reason": "two"}]
    return parse_manifest(document)


@dataclass(frozen=True)
class Install:
    config: Config
    install_id: str
    ancestors: frozenset[str]

    def active(self, action_slot: str, destination_slot: str | None = None) -> ActiveMetadata:
        return resolve_active(
            manifest(self.config),
            self.install_id,
            action_slot,
            destination_slot,
            install_ancestors=self.ancestors,
        )

    def active_for(self, row: LinkSnapshot | AttemptSnapshot) -> ActiveMetadata:
        return self.active(row.slot.action_slot_id, row.slot.destination_slot_id)


# -- the remote --------------------------------------------------------------------


@dataclass
class RemoteObject:
    remote_id: str
    destination: RemoteDestination
    action_slot: str
    attempt_id: str


@dataclass
class Remote:
    """What the remote holds: objects, and the creates it de-duplicates by key, for as long
    as the profile says it keeps a key (G-5), counted from the key's first use."""

    objects: list[RemoteObject] = field(default_factory=list)
    keys: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    patches_applied: int = 0

    def create(self, attempt: AttemptSnapshot, at: datetime) -> str:
        request = attempt.request
        kept = request.profile.post_key_retention_seconds
        remembered = self.keys.get(request.idempotency_key)
        if request.profile.post_idempotency_header and remembered and kept is not None:
            remote_id, first = remembered
            if at - first <= timedelta(seconds=kept):
                return remote_id
        remote_id = str(1001 + len(self.objects))
        where = (request.remote_scope, request.target_object)
        self.objects.append(
            RemoteObject(remote_id, where, attempt.slot.action_slot_id, attempt.attempt_id)
        )
        if request.profile.post_idempotency_header:
            self.keys[request.idempotency_key] = (remote_id, at)
        return remote_id

    def created_by(self, attempt_id: str) -> str | None:
        return next((o.remote_id for o in self.objects if o.attempt_id == attempt_id), None)


# -- the rows ----------------------------------------------------------------------


@dataclass
class Sendable:
    """What attempts and PATCHes share: a send journal and the try awaiting its answer."""

    journal: list[JournalEntry] = field(default_factory=list)
    checkpoint: bool = False
    in_flight: int | None = None  # index in `journal` of the try awaiting its answer

    def sent(self, journal_id: int, at: datetime, not_applied: tuple[int, ...]) -> None:
        entry = JournalEntry(journal_id=journal_id, sending_at=at, not_applied_statuses=not_applied)
        self.journal.append(entry)
        self.checkpoint, self.in_flight = True, len(self.journal) - 1

    def answered(self, **outcome: Any) -> JournalEntry:
        assert self.in_flight is not None
        entry = self.journal[self.in_flight].model_copy(update=outcome)
        self.journal[self.in_flight], self.in_flight = entry, None
        return entry


@dataclass
class AttemptRow(Sendable):
    snap: AttemptSnapshot = field(kw_only=True)

    @property
    def status(self) -> AttemptStatus:
        return self.snap.status

    def move(self, target: AttemptStatus) -> None:
        check_attempt_transition(self.snap.status, target)
        self.snap = self.snap.model_copy(update={"status": target})


@dataclass
class PatchRow(Sendable):
    status: PatchStatus = field(default=PatchStatus.PENDING, kw_only=True)
    # Frozen at planning: the source fields its body carries, and the profile it is sent
    # under (PROF-1, PROF-2).
    fields_sent: frozenset[str] = field(default=frozenset(), kw_only=True)
    contract: ProfileSnapshot | None = field(default=None, kw_only=True)

    def move(self, target: PatchStatus) -> None:
        check_patch_transition(self.status, target)
        self.status = target


@dataclass
class LinkRow:
    snap: LinkSnapshot

    @property
    def status(self) -> LinkStatus:
        return self.snap.status

    def move(self, target: LinkStatus, **values: Any) -> None:
        check_link_transition(self.snap.status, target)
        self.snap = self.snap.model_copy(update={"status": target, **values})


@dataclass
class Rows:
    """Links, attempts (newest last) and PATCHes (oldest first), by link key."""

    links: dict[str, LinkRow] = field(default_factory=dict)
    attempts: dict[str, list[AttemptRow]] = field(default_factory=dict)
    patches: dict[str, list[PatchRow]] = field(default_factory=dict)

    def link_keys(self) -> list[str]:
        return sorted({*self.links, *self.attempts})

    def newest_attempt(self, key: str) -> AttemptRow | None:
        found = self.attempts.get(key)
        return found[-1] if found else None

    def all_attempts(self) -> list[AttemptRow]:
        return [a for key in sorted(self.attempts) for a in self.attempts[key]]

    def record_rows(self, own_key: str) -> tuple[RecordOwnershipRow, ...]:
        """The record's rows under other link keys, as the gate reads them (GATE-1)."""
        rows = []
        for key in self.link_keys():
            if key == own_key:
                continue
            link, attempt = self.links.get(key), self.newest_attempt(key)
            frozen = link.snap if link is not None else attempt.snap if attempt else None
            assert frozen is not None, "a key has a link or an attempt"
            slot = frozen.slot
            rows.append(
                RecordOwnershipRow(
                    link_key=key,
                    action_slot_id=slot.action_slot_id,
                    destination_slot_id=slot.destination_slot_id,
                    link_status=link.status if link else None,
                    attempt_status=attempt.status if attempt else None,
                    remote_id=link.snap.remote_id if link else None,
                )
            )
        return tuple(rows)

    def view(self, key: str) -> LinkView:
        """The durable view the workflow publishes and the operator guards read."""
        link, attempt = self.links.get(key), self.newest_attempt(key)
        patches = self.patches.get(key, [])
        queued = [
            p.status for p in patches if p.status in (PatchStatus.PENDING, PatchStatus.PROCESSING)
        ]
        ambiguous = attempt is not None and attempt.status is AttemptStatus.AMBIGUOUS_REMOTE_EFFECT
        return LinkView(
            link_key=key,
            link_status=link.status if link else None,
            remote_id=link.snap.remote_id if link else None,
            attempt_id=attempt.snap.attempt_id if attempt else None,
            attempt_status=attempt.status if attempt else None,
            pending_patches=queued,
            suspend_reason=link.snap.suspend_reason if link else None,
            last_patch_status=patches[-1].status if patches else None,
            attempt_tries_may_have_landed=(
                may_have_landed(attempt.journal, SendKind.CREATE) if attempt else 0
            ),
            attempt_landing=landing(attempt.journal, SendKind.CREATE)
            if attempt and ambiguous
            else None,
        )


def save_request(action_slot: str, destination_slot: str) -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=action_slot,
        destination_slot_id=destination_slot,
        source_object="Contact",
        source_record_id=RECORD,
        originating_user_id=USER,
    )


def key_of(action_slot: str, destination_slot: str) -> str:
    return link_key(OWNER, action_slot, "Contact", RECORD, destination_slot)


def admission_context(
    rows: Rows, install: Install, active: ActiveMetadata, save: SaveRequest, idem: str
) -> AdmissionContext:
    """What admission loads for one save (or a PATCH's planning), from the model's rows."""
    key = key_of(save.action_slot_id, save.destination_slot_id)
    link = rows.links.get(key)
    attempts = tuple(
        AttemptSummary(attempt_id=a.snap.attempt_id, status=a.status, attempt_ordinal=i + 1)
        for i, a in enumerate(rows.attempts.get(key, []))
    )
    return AdmissionContext(
        save=save,
        active=active,
        link=link.snap if link else None,
        attempts=attempts,
        record_rows=rows.record_rows(key),
        pack_slots=PackSlots.of(manifest(install.config)),
        record=RecordView(exists=True, fields=dict(FIELDS)),
        permissions=PERMISSIONS,
        idempotency_key=idem,
        decided_at=NOW,
    )


def attempt_of(reservation: Reservation, attempt_id: str, ordinal: int) -> AttemptSnapshot:
    r = reservation
    return AttemptSnapshot(
        attempt_id=attempt_id,
        link_key=r.link_key,
        slot=r.slot,
        source_record_id=r.source_record_id,
        names=r.names,
        pack_install_id=r.pack_install_id,
        remote_scope=r.remote_scope,
        status=AttemptStatus.PENDING,
        attempt_ordinal=ordinal,
        action=r.action,
        request=r.request,
        authority=r.authority,
        association_vector=r.association_vector,
        writeback=r.writeback,
    )


def link_of(attempt: AttemptSnapshot, remote_id: str) -> LinkSnapshot:
    """The link a create's finalize (or reconcile) writes from the attempt's frozen rows."""
    request: CreateRequestSnapshot = attempt.request
    return LinkSnapshot(
        link_key=attempt.link_key,
        slot=attempt.slot,
        source_record_id=attempt.source_record_id,
        names=attempt.names,
        created_pack_install_id=attempt.pack_install_id,
        last_validated_pack_install_id=attempt.pack_install_id,
        profile=request.profile,
        action=attempt.action,
        remote_id=remote_id,
        remote_scope=attempt.remote_scope,
        status=LinkStatus.FINALIZED,
    )


@dataclass
class World:
    """Everything the model keeps: the active install, the rows, the remote, the clock."""

    install: Install
    rows: Rows = field(default_factory=Rows)
    remote: Remote = field(default_factory=Remote)
    now: datetime = NOW
    counter: int = 0

    def next_id(self) -> int:
        self.counter += 1
        return self.counter
