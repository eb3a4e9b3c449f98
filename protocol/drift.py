"""Drift classifier (SPEC DRIFT-1, the seed's drift matrix).

Compares what a link or an attempt froze with the active metadata and returns
one finding per changed surface. The disposition depends on the column:
finalized links follow the "Existing finalized link" column, attempts the
"Active create attempt" column. Conditional rows (credential contracts, update
path equivalence) are resolved here from the pack's explicit declarations only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import Final

from protocol.active import ActiveMetadata
from protocol.errors import SuspendReason, drift_reason
from protocol.manifest import ActionSlot, DestinationSlot, Profile
from protocol.pack_fields import is_credential_ref
from protocol.snapshots import (
    ActionConfigSnapshot,
    AttemptSnapshot,
    LinkSnapshot,
    ProfileSnapshot,
    Snapshot,
)
from protocol.templates import TemplateError, render


class DriftSurface(StrEnum):
    FLOW_VERSION = "flow_version"
    ACTION_RENAMED = "action_renamed"
    ACTION_RECREATED = "action_recreated"
    NAMESPACE_RENAMED = "namespace_renamed"
    OWNER_IDENTITY = "owner_identity"
    PACK_INSTALL = "pack_install"
    PACK_UPGRADED = "pack_upgraded"
    PROFILE_RENAMED = "profile_renamed"
    PROFILE_REPLACED = "profile_replaced"
    CREDENTIAL_REF = "credential_ref"
    ENDPOINT = "endpoint"
    CREDENTIAL_GENERATION = "credential_generation"
    RETRY_POLICY = "retry_policy"
    MAPPING = "mapping"
    SOURCE_AUTHORITY = "source_authority"
    CREATE_PATH = "create_path"
    UPDATE_PATH = "update_path"
    RESPONSE_ID_PATH = "response_id_path"
    MIRROR_FIELDS = "mirror_fields"
    TARGET_RENAMED = "target_renamed"
    TARGET_NEW_SLOT = "target_new_slot"
    REMOTE_SCOPE = "remote_scope"
    IDEMPOTENCY_SUPPORT = "idempotency_support"
    PROFILE_PAYLOAD = "profile_payload"


class Disposition(StrEnum):
    BENIGN = "benign"  # recorded; the link keeps working
    FROZEN_NO_EFFECT = "frozen_no_effect"  # the attempt keeps using its frozen snapshot
    MIRROR_BLOCKED = "mirror_blocked"  # link authoritative; mirror writeback blocked
    FAIL_CLOSED = "fail_closed"  # link -> suspended_drift; attempt parked before POST


class Finding(Snapshot):
    surface: DriftSurface
    disposition: Disposition
    detail: str


B, F, M, X = (
    Disposition.BENIGN,
    Disposition.FROZEN_NO_EFFECT,
    Disposition.MIRROR_BLOCKED,
    Disposition.FAIL_CLOSED,
)
S = DriftSurface

# surface -> (finalized link, active create attempt); the seed's matrix, row by row.
# Rows marked * are conditional and refined by `_refine`.
MATRIX: Final[dict[DriftSurface, tuple[Disposition, Disposition]]] = {
    S.FLOW_VERSION: (B, F),
    S.ACTION_RENAMED: (B, F),
    S.ACTION_RECREATED: (X, X),
    S.NAMESPACE_RENAMED: (B, F),
    S.OWNER_IDENTITY: (X, X),
    # A reinstall (new incarnation): links fail closed until revalidated; an attempt
    # frozen under the old one never POSTs under the new one (GATE-2).
    S.PACK_INSTALL: (X, X),
    # C-4 (seed drift row "active PackInstallId changes"): an apply on the same lineage
    # is still a new install. The link is found by its stable key, then fails closed
    # until explicitly revalidated (`revalidate owner`, `revalidate-link`); an attempt
    # retries only its frozen request.
    S.PACK_UPGRADED: (X, F),
    S.PROFILE_RENAMED: (B, F),
    S.PROFILE_REPLACED: (X, X),
    S.CREDENTIAL_REF: (X, X),  # * link benign if rotation declared same-destination
    S.ENDPOINT: (X, X),
    S.CREDENTIAL_GENERATION: (X, X),  # * as above; attempt also needs frozen idempotency
    S.RETRY_POLICY: (B, F),
    S.MAPPING: (X, F),
    S.SOURCE_AUTHORITY: (B, F),
    S.CREATE_PATH: (B, F),
    S.UPDATE_PATH: (X, B),  # * link benign if old and new render to the same route
    S.RESPONSE_ID_PATH: (B, F),
    S.MIRROR_FIELDS: (M, F),
    # The frozen request names a target the pack no longer maps this slot to: an
    # attempt never POSTs to it (GATE-2; the seed's target/destination row).
    S.TARGET_RENAMED: (X, X),
    S.TARGET_NEW_SLOT: (X, X),
    # The seed's "target object renamed/rebound with same DestinationSlotId" row: fail
    # closed until the destination contract proves the same remote target. A destination
    # slot whose remote scope (portal, account) changed names another remote target: the
    # link's remote id belongs to the old scope, and the frozen create was bound to it.
    S.REMOTE_SCOPE: (X, X),
    S.IDEMPOTENCY_SUPPORT: (B, F),
    # Every frozen profile declaration without a row of its own, among them PROF-1's
    # `notAppliedStatuses`/`notAppliedAnswers` and PROF-5's `dailyLimit` (how an answer is
    # read: a link re-frozen by revalidation; an attempt keeps the contract it froze).
    S.PROFILE_PAYLOAD: (X, F),
}

Durable = LinkSnapshot | AttemptSnapshot
Change = tuple[DriftSurface, str]


def classify(snapshot: Durable, active: ActiveMetadata | None) -> list[Finding]:
    """Every drift finding between `snapshot` and the active metadata."""
    return [
        Finding(surface=surface, disposition=_refine(surface, snapshot, active), detail=detail)
        for surface, detail in _changes(snapshot, active)
    ]


def fails_closed(findings: list[Finding]) -> bool:
    return any(f.disposition is Disposition.FAIL_CLOSED for f in findings)


# Install surfaces fail closed on every apply (C-4): a suspension names them only when
# nothing more specific failed, so `drift:pack_upgraded` means "revalidate, nothing else".
INSTALL_SURFACES: Final = frozenset({DriftSurface.PACK_UPGRADED, DriftSurface.PACK_INSTALL})
# Links suspended for these surfaces wait only for an install revalidation.
INSTALL_SURFACE_NAMES: Final = tuple(sorted(surface.value for surface in INSTALL_SURFACES))
INSTALL_REASONS: Final = tuple(drift_reason(surface) for surface in INSTALL_SURFACE_NAMES)


def suspend_reason(findings: Iterable[Finding]) -> str:
    """`drift:<surface>` of the first fail-closed finding (the one that suspends the link),
    an install surface only when no other surface failed closed."""
    closed = [f.surface for f in findings if f.disposition is Disposition.FAIL_CLOSED]
    closed.sort(key=lambda surface: surface in INSTALL_SURFACES)  # stable: order kept
    return drift_reason(closed[0].value) if closed else SuspendReason.DRIFT.value


def _changes(snap: Durable, active: ActiveMetadata | None) -> Iterator[Change]:
    owner = snap.slot.connector_owner_key
    if active is None or active.connector_owner_key != owner:
        found = active.connector_owner_key if active else "no active pack"
        yield S.OWNER_IDENTITY, f"owner {owner!r} -> {found!r}"
        return
    yield from _install_and_names(snap, active)
    if active.action is None:
        yield S.ACTION_RECREATED, f"action slot {snap.slot.action_slot_id!r} is not in the pack"
    else:
        yield from _action_changes(snap, active.action, active.readable_fields)
    if active.destination is None or active.profile is None:
        yield S.PROFILE_REPLACED, f"destination slot {snap.slot.destination_slot_id!r} is gone"
    else:
        yield from _destination_changes(snap, active.destination)
        yield from _profile_changes(snap.profile, ProfileSnapshot.of(active.profile))


def _install_and_names(snap: Durable, active: ActiveMetadata) -> Iterator[Change]:
    if active.pack_install_id != snap.pack_install_id:
        upgraded = snap.pack_install_id in active.install_ancestors
        surface = S.PACK_UPGRADED if upgraded else S.PACK_INSTALL
        yield surface, f"{snap.pack_install_id} -> {active.pack_install_id}"
    if active.namespace != snap.names.connector_namespace:
        yield S.NAMESPACE_RENAMED, f"{snap.names.connector_namespace} -> {active.namespace}"
    if active.profile and active.profile.name != snap.names.profile_name:
        yield S.PROFILE_RENAMED, f"{snap.names.profile_name} -> {active.profile.name}"


def _action_changes(
    snap: Durable, action: ActionSlot, readable: frozenset[str] | None
) -> Iterator[Change]:
    names = snap.names
    if action.flow_version != names.flow_version:
        yield S.FLOW_VERSION, f"{names.flow_version} -> {action.flow_version}"
    old_names = (names.flow_developer_name, names.flow_action_name)
    if (action.flow_developer_name, action.flow_action_name) != old_names:
        yield (
            S.ACTION_RENAMED,
            f"{old_names} -> {action.flow_developer_name, action.flow_action_name}",
        )
    if action.destination_slot != snap.slot.destination_slot_id:
        yield S.TARGET_NEW_SLOT, f"{snap.slot.destination_slot_id} -> {action.destination_slot}"
    yield from _config_changes(snap.action, ActionConfigSnapshot.of(action))
    if readable is not None:
        yield from _authority_changes(snap, action, readable)


_CONFIG_SURFACES: Final[
    tuple[tuple[DriftSurface, Callable[[ActionConfigSnapshot], object]], ...]
] = (
    (S.CREATE_PATH, lambda a: a.create_path_template),
    (S.UPDATE_PATH, lambda a: a.update_path_template),
    (S.RESPONSE_ID_PATH, lambda a: a.response_id_path),
    (S.MIRROR_FIELDS, lambda a: a.mirror),
    (S.MAPPING, lambda a: (a.mapping_fingerprint, a.body_fingerprint)),
)


def _config_changes(old: ActionConfigSnapshot, new: ActionConfigSnapshot) -> Iterator[Change]:
    for surface, read in _CONFIG_SURFACES:
        if read(old) != read(new):
            yield surface, f"{read(old)!r} -> {read(new)!r}"


def _authority_changes(
    snap: Durable, action: ActionSlot, readable: frozenset[str]
) -> Iterator[Change]:
    mapped = {m.source_field for m in action.mappings}
    if isinstance(snap, AttemptSnapshot):
        if set(snap.authority.allowed_fields) != mapped & readable:
            yield S.SOURCE_AUTHORITY, "current readable fields differ from the frozen set"
    elif not mapped <= readable:
        yield S.SOURCE_AUTHORITY, f"unreadable now: {sorted(mapped - readable)}"


def _destination_changes(snap: Durable, destination: DestinationSlot) -> Iterator[Change]:
    if destination.target_object != snap.names.target_object:
        yield S.TARGET_RENAMED, f"{snap.names.target_object} -> {destination.target_object}"
    if destination.remote_scope != snap.remote_scope:
        yield S.REMOTE_SCOPE, f"{snap.remote_scope} -> {destination.remote_scope}"


def _profile_changes(old: ProfileSnapshot, new: ProfileSnapshot) -> Iterator[Change]:
    changes: list[Change] = []
    if old.credential_ref != new.credential_ref:
        shown = (_shown_ref(old.credential_ref), _shown_ref(new.credential_ref))
        changes.append((S.CREDENTIAL_REF, f"{shown[0]} -> {shown[1]}"))
    elif old.credential_generation_hash != new.credential_generation_hash:
        changes.append((S.CREDENTIAL_GENERATION, "credential generation changed"))
    if (old.endpoint_class, old.endpoint_binding_hash) != (
        new.endpoint_class,
        new.endpoint_binding_hash,
    ):
        changes.append((S.ENDPOINT, _endpoint_change(old, new)))
    if old.retry_policy_hash != new.retry_policy_hash:
        changes.append((S.RETRY_POLICY, "retry policy changed"))
    if _idempotency(old) != _idempotency(new):
        changes.append((S.IDEMPOTENCY_SUPPORT, f"{_idempotency(old)} -> {_idempotency(new)}"))
    if not changes and old.profile_payload_hash != new.profile_payload_hash:
        changes.append((S.PROFILE_PAYLOAD, "profile declarations changed"))
    yield from changes


def _shown_ref(value: str) -> str:
    # A link frozen before references were enforced may hold a literal token.
    return value if is_credential_ref(value) else "(not a reference; not shown)"


def _endpoint_change(old: ProfileSnapshot, new: ProfileSnapshot) -> str:
    """What moved in the endpoint binding: the class, the base URL, or both (no secrets:
    a base URL carries no credentials, see protocol/manifest.py `_base_url`)."""
    parts = []
    if old.endpoint_class != new.endpoint_class:
        parts.append(f"endpoint class {old.endpoint_class} -> {new.endpoint_class}")
    if old.base_url != new.base_url:
        parts.append(f"base URL {old.base_url} -> {new.base_url}")
    return "; ".join(parts) or "endpoint binding changed"


def _idempotency(p: ProfileSnapshot) -> tuple[object, ...]:
    return (p.post_idempotency_header, p.patch_replay_safe, p.locator_recovery)


def _refine(surface: DriftSurface, snap: Durable, active: ActiveMetadata | None) -> Disposition:
    link_column, attempt_column = MATRIX[surface]
    is_link = isinstance(snap, LinkSnapshot)
    default = link_column if is_link else attempt_column
    profile = active.profile if active else None
    match surface:
        case S.CREDENTIAL_REF if is_link and _rotation_safe(snap.profile, profile):
            return Disposition.BENIGN
        case S.CREDENTIAL_GENERATION if _rotation_safe(snap.profile, profile) and (
            is_link or snap.profile.post_replay_safe
        ):
            return Disposition.BENIGN if is_link else Disposition.FROZEN_NO_EFFECT
        case S.UPDATE_PATH if isinstance(snap, LinkSnapshot) and _same_route(snap, active):
            return Disposition.BENIGN
        case _:
            return default


def _rotation_safe(frozen: ProfileSnapshot, active: Profile | None) -> bool:
    """Both the frozen and the active profile declare rotation keeps the destination."""
    return frozen.credential_rotation_same_destination and bool(
        active and active.credential_rotation_same_destination
    )


def _same_route(link: LinkSnapshot, active: ActiveMetadata | None) -> bool:
    if active is None or active.action is None:
        return False
    values = {"target": link.names.target_object, "remoteId": link.remote_id}
    try:
        old = render(link.action.update_path_template, values)
        return old == render(active.action.update_path, values)
    except TemplateError:
        return False
