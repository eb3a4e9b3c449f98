"""Builders for pure protocol tests: the demo pack and snapshots derived from it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from protocol.active import ActiveMetadata, resolve_active
from protocol.admission import (
    AdmissionContext,
    CreateReserved,
    RecordView,
    SaveRequest,
)
from protocol.authority import PermissionFacts
from protocol.gates import decide_admission
from protocol.manifest import PackManifest, parse_manifest
from protocol.snapshots import AttemptSnapshot, LinkSnapshot
from protocol.states import AttemptStatus, LinkStatus

DEMO_PATH = Path(__file__).resolve().parents[2] / "examples" / "demo-pack.yaml"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
INSTALL = "install-1"
CONTACT_FIELDS = frozenset({"Email", "FirstName", "LastName", "Phone"})


def demo_document() -> dict[str, Any]:
    with DEMO_PATH.open() as handle:
        loaded: dict[str, Any] = yaml.safe_load(handle)
    return loaded


def demo_manifest(mutate: Any = None) -> PackManifest:
    document = copy.deepcopy(demo_document())
    if mutate is not None:
        mutate(document)
    return parse_manifest(document)


def contact_active(manifest: PackManifest | None = None, install: str = INSTALL) -> ActiveMetadata:
    return resolve_active(manifest or demo_manifest(), install, "push-contact")


def contact_context(**overrides: Any) -> AdmissionContext:
    values: dict[str, Any] = {
        "save": SaveRequest(
            connector_owner_key="demo-owner",
            action_slot_id="push-contact",
            destination_slot_id="remote-contacts",
            source_object="Contact",
            source_record_id="003A",
            originating_user_id="user-1",
        ),
        "active": contact_active(),
        "record": RecordView(
            exists=True,
            fields={"Email": "a@example.com", "FirstName": "Ada", "LastName": "L", "Phone": "1"},
        ),
        "permissions": PermissionFacts(
            object_readable=True, record_readable=True, readable_fields=CONTACT_FIELDS
        ),
        "idempotency_key": "idem-1",
        "decided_at": NOW,
    }
    values.update(overrides)
    return AdmissionContext(**values)


def reserved_contact() -> CreateReserved:
    decision = decide_admission(contact_context())
    assert isinstance(decision, CreateReserved), decision
    return decision


def contact_link(status: LinkStatus = LinkStatus.FINALIZED, remote_id: str = "901") -> LinkSnapshot:
    r = reserved_contact().reservation
    return LinkSnapshot(
        link_key=r.link_key,
        slot=r.slot,
        source_record_id=r.source_record_id,
        names=r.names,
        created_pack_install_id=r.pack_install_id,
        last_validated_pack_install_id=r.pack_install_id,
        profile=r.request.profile,
        action=r.action,
        remote_id=remote_id,
        remote_scope=r.remote_scope,
        status=status,
    )


def contact_attempt(status: AttemptStatus = AttemptStatus.PENDING) -> AttemptSnapshot:
    r = reserved_contact().reservation
    return AttemptSnapshot(
        attempt_id="att-1",
        link_key=r.link_key,
        slot=r.slot,
        source_record_id=r.source_record_id,
        names=r.names,
        pack_install_id=r.pack_install_id,
        remote_scope=r.remote_scope,
        status=status,
        action=r.action,
        request=r.request,
        authority=r.authority,
        association_vector=r.association_vector,
        writeback=r.writeback,
    )
