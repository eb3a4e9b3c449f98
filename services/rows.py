"""Mapping between Postgres rows and the `protocol/` snapshots (one home for both directions)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import asyncpg

from protocol.admission import AttemptSummary, Reservation
from protocol.errors import MirrorStatus
from protocol.identity import ACTION_TYPE
from protocol.messages import LinkView
from protocol.recovery import JournalEntry, SendOutcome
from protocol.snapshots import (
    ActionConfigSnapshot,
    AttemptSnapshot,
    AuthoritySnapshot,
    CreateRequestSnapshot,
    LinkSnapshot,
    ProfileSnapshot,
    SlotNames,
    StableSlot,
    WritebackSnapshot,
)
from protocol.states import AttemptStatus, LinkStatus, PatchStatus

# A database row or the same columns decoded from JSON (`db.links.view_rows`).
RowLike = Mapping[str, Any] | asyncpg.Record


def jsonb(value: Any) -> Any:
    """asyncpg returns jsonb as text by default."""
    return json.loads(value) if isinstance(value, str) else value


def attempt_values(reservation: Reservation, ordinal: int) -> dict[str, Any]:
    """Columns of a new `pending` attempt row: everything frozen at reservation (STO-2)."""
    r = reservation
    return {
        "link_key": r.link_key,
        "connector_owner_key": r.slot.connector_owner_key,
        "action_slot_id": r.slot.action_slot_id,
        "action_type": ACTION_TYPE,
        "source_object": r.slot.source_object,
        "source_record_id": r.source_record_id,
        "destination_slot_id": r.slot.destination_slot_id,
        **_names(r.names),
        "pack_install_id": r.pack_install_id,
        "dispatch_lane": r.dispatch_lane.value,
        "status": AttemptStatus.PENDING.value,
        "attempt_ordinal": ordinal,
        "request_idempotency_key": r.request.idempotency_key,
        "request_snapshot": r.request.model_dump(mode="json"),
        "action_snapshot": r.action.model_dump(mode="json"),
        "authority_snapshot": r.authority.model_dump(mode="json"),
        "association_source_ids": list(r.association_vector),
        "writeback_snapshot": r.writeback.model_dump(mode="json"),
    }


def _names(names: SlotNames) -> dict[str, Any]:
    return names.model_dump(mode="json")


def profile_and_path_columns(
    profile: ProfileSnapshot, action: ActionConfigSnapshot
) -> dict[str, Any]:
    """The link's profile and path snapshot columns (STO-1), set at create and revalidation."""
    return {
        "credential_ref": profile.credential_ref,
        "credential_generation_hash": profile.credential_generation_hash,
        "endpoint_class": profile.endpoint_class,
        "endpoint_binding_hash": profile.endpoint_binding_hash,
        "retry_policy_hash": profile.retry_policy_hash,
        "profile_payload_hash": profile.profile_payload_hash,
        "profile_snapshot": profile.model_dump(mode="json"),
        "create_path_template": action.create_path_template,
        "update_path_template": action.update_path_template,
        "response_id_path": action.response_id_path,
    }


def link_values(attempt: asyncpg.Record, remote_id: str) -> dict[str, Any]:
    """Columns of the `finalized` link created from an attempt that learned its remote id."""
    request = CreateRequestSnapshot.model_validate(jsonb(attempt["request_snapshot"]))
    action = ActionConfigSnapshot.model_validate(jsonb(attempt["action_snapshot"]))
    profile = request.profile
    stable = [
        "connector_owner_key",
        "action_slot_id",
        "action_type",
        "source_object",
        "source_record_id",
        "destination_slot_id",
        "connector_namespace",
        "flow_developer_name",
        "flow_action_name",
        "flow_version",
        "target_object",
        "profile_name",
    ]
    return {
        "link_key": attempt["link_key"],
        **{column: attempt[column] for column in stable},
        "created_pack_install_id": attempt["pack_install_id"],
        "last_validated_pack_install_id": attempt["pack_install_id"],
        **profile_and_path_columns(profile, action),
        "mirror_source_object": attempt["source_object"],
        "mirror_remote_id_field": action.mirror.remote_id_field,
        "mirror_provenance_field": action.mirror.provenance_field,
        "mapping_fingerprint": action.mapping_fingerprint,
        "body_fingerprint": action.body_fingerprint,
        "remote_id": remote_id,
        "remote_scope": request.remote_scope,
        "status": LinkStatus.FINALIZED.value,
        "mirror_status": MirrorStatus.PENDING.value,
        "remote_etag": (jsonb(attempt["response_snapshot"]) or {}).get("etag"),
    }


def link_snapshot(row: asyncpg.Record) -> LinkSnapshot:
    """The stored link as the drift classifier and the PATCH gates see it (STO-1)."""
    return LinkSnapshot(
        link_key=row["link_key"],
        slot=StableSlot(
            connector_owner_key=row["connector_owner_key"],
            action_slot_id=row["action_slot_id"],
            destination_slot_id=row["destination_slot_id"],
            source_object=row["source_object"],
        ),
        source_record_id=row["source_record_id"],
        names=_slot_names(row),
        created_pack_install_id=str(row["created_pack_install_id"]),
        last_validated_pack_install_id=str(row["last_validated_pack_install_id"]),
        profile=ProfileSnapshot.model_validate(jsonb(row["profile_snapshot"])),
        action=ActionConfigSnapshot.model_validate(
            {
                "create_path_template": row["create_path_template"],
                "update_path_template": row["update_path_template"],
                "response_id_path": row["response_id_path"],
                "mirror": {
                    "remote_id_field": row["mirror_remote_id_field"],
                    "provenance_field": row["mirror_provenance_field"],
                },
                "mapping_fingerprint": row["mapping_fingerprint"],
                "body_fingerprint": row["body_fingerprint"],
            }
        ),
        remote_id=row["remote_id"],
        remote_scope=row["remote_scope"],
        status=LinkStatus(row["status"]),
        suspend_reason=row["suspend_reason"],
        mirror_status=MirrorStatus(row["mirror_status"] or MirrorStatus.PENDING),
        last_mapping_revalidation_operation_id=row["last_mapping_revalidation_operation_id"],
        row_version=row["row_version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def attempt_summary(row: asyncpg.Record) -> AttemptSummary:
    return AttemptSummary(
        attempt_id=str(row["attempt_id"]),
        status=AttemptStatus(row["status"]),
        dispatch_lane=row["dispatch_lane"],
        attempt_ordinal=row["attempt_ordinal"],
    )


def _slot_names(row: asyncpg.Record) -> SlotNames:
    return SlotNames(
        connector_namespace=row["connector_namespace"],
        flow_developer_name=row["flow_developer_name"],
        flow_action_name=row["flow_action_name"],
        flow_version=row["flow_version"] or "",
        target_object=row["target_object"],
        profile_name=row["profile_name"],
    )


def attempt_snapshot(row: asyncpg.Record) -> AttemptSnapshot:
    """The stored attempt as the drift classifier sees it before a POST (GATE-2)."""
    request = request_of(row)
    return AttemptSnapshot(
        attempt_id=str(row["attempt_id"]),
        link_key=row["link_key"],
        slot=StableSlot(
            connector_owner_key=row["connector_owner_key"],
            action_slot_id=row["action_slot_id"],
            destination_slot_id=row["destination_slot_id"],
            source_object=row["source_object"],
        ),
        source_record_id=row["source_record_id"],
        names=_slot_names(row),
        pack_install_id=str(row["pack_install_id"]),
        remote_scope=request.remote_scope,
        status=AttemptStatus(row["status"]),
        dispatch_lane=row["dispatch_lane"],
        attempt_ordinal=row["attempt_ordinal"],
        remote_io_started_at=row["remote_io_started_at"],
        action=ActionConfigSnapshot.model_validate(jsonb(row["action_snapshot"])),
        request=request,
        authority=AuthoritySnapshot.model_validate(jsonb(row["authority_snapshot"])),
        association_vector=tuple(jsonb(row["association_source_ids"]) or ()),
        writeback=writeback_of(row),
        retry_count=row["retry_count"],
        last_error=row["last_error"],
    )


def writeback_of(attempt: asyncpg.Record) -> WritebackSnapshot:
    return WritebackSnapshot.model_validate(jsonb(attempt["writeback_snapshot"]))


def request_of(attempt: asyncpg.Record) -> CreateRequestSnapshot:
    return CreateRequestSnapshot.model_validate(jsonb(attempt["request_snapshot"]))


def link_view(
    link_key: str,
    link: RowLike | None,
    attempt: RowLike | None,
    patches: list[str] | None = None,
    last_patch: str | None = None,
    landed: tuple[int, int] = (0, 0),
) -> LinkView:
    """What the workflow publishes: link state, the newest attempt, queued PATCHes."""
    source = link if link is not None else attempt
    return LinkView(
        link_key=link_key,
        connector_owner_key=source["connector_owner_key"] if source else None,
        destination_slot_id=source["destination_slot_id"] if source else None,
        source_object=source["source_object"] if source else None,
        source_record_id=source["source_record_id"] if source else None,
        link_status=LinkStatus(link["status"]) if link else None,
        remote_id=link["remote_id"] if link else (attempt["remote_id"] if attempt else None),
        attempt_id=str(attempt["attempt_id"]) if attempt else None,
        attempt_status=AttemptStatus(attempt["status"]) if attempt else None,
        attempt_ordinal=attempt["attempt_ordinal"] if attempt else None,
        dispatch_lane=attempt["dispatch_lane"] if attempt else None,
        last_error=attempt["last_error"] if attempt else None,
        pending_patches=[PatchStatus(p) for p in patches or []],
        suspend_reason=link["suspend_reason"] if link else None,
        last_patch_status=PatchStatus(last_patch) if last_patch else None,
        attempt_tries_may_have_landed=landed[0],
        patch_tries_may_have_landed=landed[1],
    )


def view_of(link_key: str, row: asyncpg.Record) -> LinkView:
    """`link_view` from the single-statement `db.links.view_rows` answer."""
    return link_view(
        link_key,
        jsonb(row["link"]),
        jsonb(row["attempt"]),
        list(row["pending_patches"]),
        row["last_patch"],
        (row["attempt_landed"], row["patch_landed"]),
    )


def journal_entries(rows: list[asyncpg.Record]) -> tuple[JournalEntry, ...]:
    """The send journal of one attempt or PATCH, oldest try first (JRN-1)."""
    return tuple(
        JournalEntry(
            journal_id=r["journal_id"],
            outcome=SendOutcome(r["outcome"]) if r["outcome"] else None,
            status=r["status"],
            not_applied_statuses=tuple(r["not_applied_statuses"] or ()),
            sending_at=r["sending_at"],
            retry_after_seconds=r["retry_after_seconds"],
            daily_refusal=r["daily_refusal"],
        )
        for r in rows
    )
