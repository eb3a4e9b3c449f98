"""Durable snapshots (SPEC STO-1, STO-2): what links and attempts freeze.

`db/` maps rows to these models; the drift classifier and gates compare them
with the active pack. Hashes are computed here, once, from manifest models.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, JsonValue

from protocol.canonical import digest, model_digest
from protocol.errors import MirrorStatus
from protocol.manifest import (
    ActionSlot,
    AnswerMatch,
    DailyLimit,
    DestinationSlot,
    LocatorRecovery,
    MirrorSpec,
    PackManifest,
    Profile,
)
from protocol.states import AttemptStatus, DispatchLane, LinkStatus


class Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- digests: the hashes links and attempts store -----------------------------


# Declarations added after links were first frozen. Left at their default they are
# left out of the digest, so a runtime upgrade alone is not profile drift (a pack that
# declares one is: its links' frozen contract no longer says what the profile says).
LATER_PROFILE_DECLARATIONS: Final = (
    "not_applied_statuses",
    "not_applied_budget_seconds",
    "readback",
    "remote_id_pattern",
    # PROF-5: they decide whether an answer proved no effect and how the
    # budget waits, so a pack that declares one drifts its links' frozen contract.
    "not_applied_answers",
    "daily_limit",
)


def profile_payload_hash(profile: Profile) -> str:
    """Everything a profile declares except its (mutable) name and its pacing: a
    `rateLimit` (PROF-3) changes how fast requests leave, never what a link may send."""
    fields = type(profile).model_fields
    defaults = {
        name
        for name in LATER_PROFILE_DECLARATIONS
        if getattr(profile, name) == fields[name].get_default(call_default_factory=True)
    }
    return model_digest(profile, exclude={"name", "rate_limit", *defaults})


def endpoint_binding_hash(profile: Profile) -> str:
    return digest({"endpointClass": profile.endpoint_class, "baseUrl": profile.base_url})


def retry_policy_hash(profile: Profile) -> str:
    return model_digest(profile.retry_policy)


def credential_generation_hash(profile: Profile) -> str:
    return digest(
        {"credentialRef": profile.credential_ref, "generation": profile.credential_generation}
    )


def mapping_fingerprint(slot: ActionSlot) -> str:
    """The outbound mapping rows and association contracts of one slot."""
    rows: list[JsonValue] = [m.model_dump(mode="json", by_alias=True) for m in slot.mappings]
    assocs: list[JsonValue] = [a.model_dump(mode="json", by_alias=True) for a in slot.associations]
    return digest({"mappings": rows, "associations": assocs})


def body_fingerprint(slot: ActionSlot) -> str:
    """The body *shape* (envelope and remote property set), not its values."""
    props = {m.remote_property for m in slot.mappings} | {
        a.remote_property for a in slot.associations
    }
    ordered: list[JsonValue] = [p for p in sorted(props)]
    return digest({"envelope": slot.body_envelope, "properties": ordered})


def manifest_digest(manifest: PackManifest) -> str:
    # `separateOwnership` (G-2) came after installs were first digested: left empty it is
    # left out, so a runtime upgrade alone does not make the active manifest "changed".
    later = set() if manifest.separate_ownership else {"separate_ownership"}
    return model_digest(manifest, exclude=later)


# -- snapshot models -----------------------------------------------------------


class ProfileSnapshot(Snapshot):
    profile_name: str
    credential_ref: str
    credential_generation_hash: str
    credential_rotation_same_destination: bool
    endpoint_class: str
    base_url: str
    endpoint_binding_hash: str
    retry_policy_hash: str
    profile_payload_hash: str
    post_idempotency_header: str | None
    patch_replay_safe: bool
    precondition_header: str | None
    locator_recovery: LocatorRecovery | None
    # Added with the send journal (§14.2); absent from snapshots frozen before it.
    not_applied_statuses: tuple[int, ...] = ()
    not_applied_budget_seconds: int = 900
    readback: bool = False
    readback_path_template: str | None = None
    remote_id_pattern: str | None = None
    # G-5: how long the remote honours `post_idempotency_header`'s key, counted from the
    # first try's send. None (frozen before it was declared, or by a pack that did not
    # declare it): retention 0, so no re-send of this create is ever replay-safe.
    post_key_retention_seconds: int | None = None
    # PROF-1 by body and PROF-5 (absent from snapshots frozen before them: none declared).
    not_applied_answers: tuple[AnswerMatch, ...] = ()
    daily_limit: DailyLimit | None = None

    @classmethod
    def of(cls, profile: Profile) -> ProfileSnapshot:
        """The snapshot of a (frozen, hashable) manifest profile; computed once per profile
        because every save of a slot freezes it again (bench P7: its digests dominated)."""
        return _profile_snapshot(profile)

    @classmethod
    def build(cls, profile: Profile) -> ProfileSnapshot:
        post = profile.idempotency.post
        return cls(
            profile_name=profile.name,
            credential_ref=profile.credential_ref,
            credential_generation_hash=credential_generation_hash(profile),
            credential_rotation_same_destination=profile.credential_rotation_same_destination,
            endpoint_class=profile.endpoint_class,
            base_url=profile.base_url,
            endpoint_binding_hash=endpoint_binding_hash(profile),
            retry_policy_hash=retry_policy_hash(profile),
            profile_payload_hash=profile_payload_hash(profile),
            post_idempotency_header=post.header if post else None,
            patch_replay_safe=profile.idempotency.patch_replay_safe,
            precondition_header=profile.precondition.header if profile.precondition else None,
            locator_recovery=profile.locator_recovery,
            not_applied_statuses=tuple(sorted(set(profile.not_applied_statuses))),
            not_applied_budget_seconds=profile.not_applied_budget_seconds,
            readback=profile.readback is not None,
            readback_path_template=profile.readback.path if profile.readback else None,
            remote_id_pattern=profile.remote_id_pattern,
            post_key_retention_seconds=post.key_retention if post else None,
            not_applied_answers=profile.not_applied_answers,
            daily_limit=profile.daily_limit,
        )

    @property
    def post_replay_safe(self) -> bool:
        """The remote de-duplicates this create by its key for a declared time (G-5); how
        much of it is left is `protocol.recovery.key_retained`'s question."""
        return self.post_idempotency_header is not None and bool(self.post_key_retention_seconds)


class ActionConfigSnapshot(Snapshot):
    create_path_template: str
    update_path_template: str
    response_id_path: str
    mirror: MirrorSpec
    mapping_fingerprint: str
    body_fingerprint: str

    @classmethod
    def of(cls, slot: ActionSlot) -> ActionConfigSnapshot:
        """Computed once per (frozen, hashable) action slot, like `ProfileSnapshot.of`."""
        return _action_snapshot(slot)

    @classmethod
    def build(cls, slot: ActionSlot) -> ActionConfigSnapshot:
        return cls(
            create_path_template=slot.create_path,
            update_path_template=slot.update_path,
            response_id_path=slot.response_id_path,
            mirror=slot.mirror,
            mapping_fingerprint=mapping_fingerprint(slot),
            body_fingerprint=body_fingerprint(slot),
        )


@functools.lru_cache(maxsize=512)
def _profile_snapshot(profile: Profile) -> ProfileSnapshot:
    return ProfileSnapshot.build(profile)


@functools.lru_cache(maxsize=512)
def _action_snapshot(slot: ActionSlot) -> ActionConfigSnapshot:
    return ActionConfigSnapshot.build(slot)


class StableSlot(Snapshot):
    """The immutable pack-authored ids (ID-1) plus the source object."""

    connector_owner_key: str
    action_slot_id: str
    destination_slot_id: str
    source_object: str


class SlotNames(Snapshot):
    """Mutable human-readable names: drift evidence, never lookup keys."""

    connector_namespace: str
    flow_developer_name: str
    flow_action_name: str
    flow_version: str
    target_object: str
    profile_name: str

    @classmethod
    def of(
        cls, manifest: PackManifest, slot: ActionSlot, dest: DestinationSlot, profile: Profile
    ) -> SlotNames:
        return cls(
            connector_namespace=manifest.namespace,
            flow_developer_name=slot.flow_developer_name,
            flow_action_name=slot.flow_action_name,
            flow_version=slot.flow_version,
            target_object=dest.target_object,
            profile_name=profile.name,
        )


class AuthoritySnapshot(Snapshot):
    """The frozen #1781 authority decision (PACK-2); retries never widen it."""

    originating_user_id: str
    source_object: str
    source_record_id: str
    allowed_fields: tuple[str, ...]
    excluded_fields: tuple[str, ...]
    decided_at: datetime
    mapping_fingerprint: str


class CreateRequestSnapshot(Snapshot):
    """The exact create request, frozen before the first POST (GATE-2)."""

    method: str = "POST"
    relative_path: str
    headers: dict[str, str]
    body: JsonValue
    body_hash: str
    target_object: str
    remote_scope: str
    profile: ProfileSnapshot
    response_id_path: str
    mirror: MirrorSpec
    idempotency_key: str
    locator_value: str | None
    pending_associations: tuple[str, ...] = ()


class PostResponseSnapshot(Snapshot):
    status: int | None
    recovery_headers: dict[str, str]
    body_hash: str | None
    remote_id: str | None


class WritebackSnapshot(Snapshot):
    source_object: str
    source_record_id: str
    remote_id_field: str
    provenance_field: str
    expected_remote_id: str | None = None
    expected_provenance: str | None = None


class LinkSnapshot(Snapshot):
    """One `connector_remote_link` row (STO-1)."""

    link_key: str
    slot: StableSlot
    source_record_id: str
    names: SlotNames
    created_pack_install_id: str
    last_validated_pack_install_id: str
    profile: ProfileSnapshot
    action: ActionConfigSnapshot
    remote_id: str
    remote_scope: str
    status: LinkStatus
    # A `SuspendReason` value; drift as `drift:<surface>` (protocol/errors.py `drift_reason`).
    suspend_reason: str | None = None
    mirror_status: MirrorStatus = MirrorStatus.PENDING
    last_mapping_revalidation_operation_id: str | None = None
    row_version: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def pack_install_id(self) -> str:
        return self.last_validated_pack_install_id


class AttemptSnapshot(Snapshot):
    """One `connector_push_attempt` row (STO-2)."""

    attempt_id: str
    link_key: str
    slot: StableSlot
    source_record_id: str
    names: SlotNames
    pack_install_id: str
    remote_scope: str
    status: AttemptStatus
    dispatch_lane: str = DispatchLane.CONFIGURED.value
    attempt_ordinal: int = 1
    remote_io_started_at: datetime | None = None
    action: ActionConfigSnapshot
    request: CreateRequestSnapshot
    authority: AuthoritySnapshot
    association_vector: tuple[str, ...] = ()
    response: PostResponseSnapshot | None = None
    writeback: WritebackSnapshot
    retry_count: int = 0
    last_error: str | None = None
    superseded_by: str | None = None

    @property
    def profile(self) -> ProfileSnapshot:
        return self.request.profile
