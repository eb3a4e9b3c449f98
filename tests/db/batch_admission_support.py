"""The demo owner's seeded state the batch admission db tests admit saves against: pack,
records, links, attempts and an adopted legacy link, revalidated after its pack applies."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from db import links as links_q
from db import packs as packs_q
from db.records import Conn
from protocol.admission import (
    SaveRequest,
)
from protocol.identity import link_key
from protocol.manifest import parse_manifest
from protocol.revalidation_manifest import Approval
from protocol.snapshots import manifest_digest
from services.admission import admit_locked
from services.admission_facts import SaveToAdmit
from services.backfill import apply_backfill
from services.packs import ACTION_SLOT, apply_pack
from services.record_loader import load_records, parse_records_document
from services.revalidation_owner import OwnerOutcome, OwnerRequest, revalidate_owner

DEMO_PACK = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
OWNER = "demo-owner"
CONTACT_FIELDS = ["Email", "FirstName", "LastName", "Phone", "remote_id__c", "remote_provenance__c"]
ACCOUNT_FIELDS = ["Name", "Website", "PrimaryContactId", "remote_id__c", "remote_provenance__c"]
ADOPTED = {
    "remote_id__c": "r-linked",
    "remote_provenance__c": f"{OWNER}:push-contact:remote-contacts",  # MIG-1 evidence
}


def pack(*, old_slot: bool = False, rebind: bool = False, drift: bool = False) -> dict[str, Any]:
    """The demo pack; with an extra contact slot `push-contact-old`, or with that slot
    rebound into `push-contact` (ID-6), or with a mapping row added (fail-closed drift)."""
    document = copy.deepcopy(yaml.safe_load(DEMO_PACK.read_text(encoding="utf-8")))
    contact = document["actionSlots"][0]
    if old_slot:
        document["actionSlots"].append({**copy.deepcopy(contact), "id": "push-contact-old"})
    if rebind:
        document["lineage"] = [
            {"kind": "rebind", "fromSlot": "push-contact-old", "toSlot": "push-contact"}
        ]
    if drift:
        contact["mappings"].append({"sourceField": "Title", "remoteProperty": "jobtitle"})
    assert isinstance(document, dict)
    return document


def contact(record_id: str, *, slot: str = "push-contact", user: str = "alice") -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id=slot,
        destination_slot_id="remote-contacts",
        source_object="Contact",
        source_record_id=record_id,
        originating_user_id=user,
    )


def company(record_id: str) -> SaveRequest:
    return SaveRequest(
        connector_owner_key=OWNER,
        action_slot_id="push-company",
        destination_slot_id="remote-companies",
        source_object="Account",
        source_record_id=record_id,
        originating_user_id="alice",
    )


def items(saves: list[SaveRequest]) -> list[SaveToAdmit]:
    return [
        SaveToAdmit(
            link_key(s.connector_owner_key, s.action_slot_id, s.source_object,
                     s.source_record_id, s.destination_slot_id),
            s,
            f"idem-{i}",
            f"cp-idem-{i}",
        )
        for i, s in enumerate(saves)
    ]  # fmt: skip


async def apply_legacy_pack(conn: Conn, document: dict[str, Any]) -> None:
    """Install `document` as an install made before G-2's apply check was: two action
    slots of one source object at one remote destination, with no `separateOwnership`.
    `pack apply` refuses such a pack now; installs from before it still exist, and the
    admission gate (G-2) must hold for them too. Written as an install of that time was:
    the install row and its lineage, under the owner's apply lock, through db.packs."""
    manifest = parse_manifest(document)
    owner = manifest.connector_owner_key
    async with conn.transaction():
        await packs_q.lock_owner_key(conn, owner)
        current = await packs_q.select_active_install(conn, owner)
        previous = current.pack_install_id if current else None
        if previous is not None:
            assert await packs_q.deactivate_install(conn, previous)
        dumped = json.dumps(manifest.model_dump(mode="json", by_alias=True))
        new = await packs_q.insert_active_install(
            conn, owner, manifest.namespace, dumped, manifest_digest(manifest), previous
        )
        lineage = [
            packs_q.LineageRow(new.pack_install_id, ACTION_SLOT, e.kind, e.from_slot, e.to_slot)
            for e in manifest.lineage
        ]
        await packs_q.insert_lineage(conn, new.pack_install_id, lineage)


async def seed(conn: Conn) -> None:
    """Contacts new, adopted (a finalized link), unreadable, incomplete and deleted;
    companies naming an unlinked and a linked primary contact; a lineage attempt."""
    email = {"FirstName": "A", "LastName": "B"}
    records = [
        *({"object": "Contact", "id": f"c-new-{n}", "fields": {**email, "Email": f"{n}@x"}}
          for n in (1, 2)),
        {"object": "Contact", "id": "c-linked", "fields": {**email, "Email": "l@x", **ADOPTED}},
        {"object": "Contact", "id": "c-lineage", "fields": {**email, "Email": "g@x"}},
        {"object": "Contact", "id": "c-secret", "fields": {**email, "Email": "s@x"}},
        {"object": "Contact", "id": "c-noemail", "fields": email},
        {"object": "Contact", "id": "c-deleted", "fields": {**email, "Email": "d@x"},
         "deleted": True},
        {"object": "Account", "id": "a-waits",
         "fields": {"Name": "W", "PrimaryContactId": "c-new-1"}},
        {"object": "Account", "id": "a-linked",
         "fields": {"Name": "L", "PrimaryContactId": "c-linked"}},
    ]  # fmt: skip
    readable = ["c-new-1", "c-new-2", "c-linked", "c-lineage", "c-noemail", "c-deleted"]
    grants = [
        {"user": "alice", "object": "Contact", "records": readable, "fields": CONTACT_FIELDS},
        {"user": "bob", "object": "Contact", "records": readable, "fields": CONTACT_FIELDS},
        {"user": "alice", "object": "Account", "records": "*", "fields": ACCOUNT_FIELDS},
    ]
    await apply_pack(conn, pack())
    await load_records(conn, parse_records_document({"records": records, "grants": grants}))
    await apply_backfill(conn, OWNER, now=NOW)  # adopts c-linked: a finalized link (MIG-1)
    assert await conn.fetchval("SELECT count(*) FROM connector_remote_link") == 1
    await apply_legacy_pack(conn, pack(old_slot=True))
    [old] = items([contact("c-lineage", slot="push-contact-old")])
    async with conn.transaction():
        await links_q.lock_link_key(conn, old.key)
        await admit_locked(conn, old.key, old.save, "idem-old", "cp-idem-old", NOW)
    await apply_pack(conn, pack(rebind=True))
    await revalidate_owner_links(conn)


async def revalidate_owner_links(conn: Conn) -> None:
    """C-4: each apply is a new install, and the adopted link fails closed until the owner
    is revalidated (`connector-push revalidate owner`)."""
    approval = Approval(approved_by="op", approval_reference="CHG", reason="same mapping")
    request = OwnerRequest(connector_owner_key=OWNER, approval=approval)
    result = await revalidate_owner(conn, request, now=NOW)
    assert result.outcome is OwnerOutcome.APPLIED, result
