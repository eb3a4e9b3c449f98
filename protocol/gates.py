"""Admission gates as pure decisions (SPEC GATE-1, PATCH-1, LANE-2, LANE-4, WF-2).

The caller loads one `AdmissionContext` inside its admission transaction and
acts on the decision; nothing here reads a clock, an id generator or storage.
A save that finds an occupying non-terminal attempt is *observed*, never
rejected and never POSTed: the attempt's own state machine owns it (LANE-4,
seed "Retry And Recovery" 2).
"""

from __future__ import annotations

from pydantic import JsonValue

from protocol.active import ActiveMetadata
from protocol.admission import (
    AdmissionContext,
    AdmissionDecision,
    AttemptSummary,
    CreateReserved,
    DeferredAssociationReserved,
    ObservedActiveAttempt,
    PatchQueued,
    RecordView,
    Rejected,
    Reservation,
)
from protocol.authority import (
    AuthorityFailure,
    AuthorityFailureReason,
    AuthorityProjection,
    project_authority,
)
from protocol.drift import classify, fails_closed
from protocol.errors import RejectReason
from protocol.identity import InvalidIdentityPart, link_key
from protocol.manifest import ActionSlot, AssociationMode
from protocol.ownership import prior_ownership
from protocol.rate_limit import budget_key
from protocol.request import PatchRequest, build_patch_request, freeze_create_request
from protocol.snapshots import (
    ActionConfigSnapshot,
    AuthoritySnapshot,
    CreateRequestSnapshot,
    LinkSnapshot,
    Snapshot,
    WritebackSnapshot,
)
from protocol.states import ATTEMPT_RELEASED, AttemptStatus, DispatchLane, LinkStatus
from protocol.templates import (
    CREATE_PLACEHOLDERS,
    UPDATE_PLACEHOLDERS,
    TemplateError,
    check_template,
)

R = RejectReason


class _Plan(Snapshot):
    """Association resolution for one save."""

    vector: tuple[str, ...]
    resolved: dict[str, tuple[str, str]]
    pending: tuple[str, ...]
    missing_update_only: tuple[str, ...]


def _missing_source(record: RecordView) -> R:
    return R.SOURCE_DELETED if record.deleted else R.SOURCE_NOT_FOUND


def decide_admission(ctx: AdmissionContext) -> AdmissionDecision:
    """Decide one save: reserve a create, queue a PATCH, observe, or reject (zero I/O)."""
    key = _resolve(ctx)
    if isinstance(key, Rejected):
        return key
    if not ctx.record.exists:
        return Rejected(reason=_missing_source(ctx.record), link_key=key)
    active_attempt = _active_attempt(ctx.attempts)
    if active_attempt is not None:
        return ObservedActiveAttempt(
            link_key=key,
            attempt_id=active_attempt.attempt_id,
            status=active_attempt.status,
            dispatch_lane=active_attempt.dispatch_lane,
        )
    if ctx.link is not None:
        return _decide_patch(ctx, key, ctx.link)
    if any(a.status is AttemptStatus.TERMINAL_FAILED for a in ctx.attempts):
        return Rejected(reason=R.UNSUPERSEDED_TERMINAL_ATTEMPT, link_key=key)
    return _decide_create(ctx, key)


def decide_patch(ctx: AdmissionContext) -> PatchQueued | Rejected:
    """Re-check PATCH-1 at dispatch time and build the PATCH from the latest record."""
    key = _resolve(ctx)
    if isinstance(key, Rejected):
        return key
    if not ctx.record.exists:
        return Rejected(reason=_missing_source(ctx.record), link_key=key)
    if _active_attempt(ctx.attempts) is not None:
        return Rejected(reason=R.ACTIVE_ATTEMPT, link_key=key)
    if ctx.link is None:
        return Rejected(reason=R.NO_FINALIZED_LINK, link_key=key)
    return _decide_patch(ctx, key, ctx.link)


def association_lookups(active: ActiveMetadata, record: RecordView) -> dict[str, str]:
    """contract id -> target link key to load, for every non-blank association source id."""
    owner = active.connector_owner_key
    keys: dict[str, str] = {}
    for contract in active.action.associations if active.action else ():
        target = active.association_slots.get(contract.target_action_slot)
        source_id = record.fields.get(contract.source_field)
        if target is None or not isinstance(source_id, str) or not source_id:
            continue
        try:
            keys[contract.id] = link_key(
                owner, target.id, target.source_object, source_id, target.destination_slot
            )
        except InvalidIdentityPart:
            continue
    return keys


# -- shared steps ----------------------------------------------------------------


def _resolve(ctx: AdmissionContext) -> str | Rejected:
    """Stable ids and the single usable incarnation, then the link key (ID-1, ID-2)."""
    active = ctx.active
    if active is None or not active.usable:
        return Rejected(reason=R.NO_TRUSTED_SLOT, detail="slot does not resolve in the pack")
    save = ctx.save
    expected = (
        active.connector_owner_key,
        active.action_slot_id,
        active.destination_slot_id,
        active.require()[0].source_object,
    )
    got = (save.connector_owner_key, save.action_slot_id, save.destination_slot_id)
    if (*got, save.source_object) != expected:
        return Rejected(reason=R.STABLE_IDS_UNRESOLVED, detail=f"{got} != active {expected}")
    if ctx.active_incarnations != 1:
        detail = f"{ctx.active_incarnations} usable incarnations"
        return Rejected(reason=R.PACK_NOT_SINGLE_ACTIVE, detail=detail)
    try:
        return link_key(*got[:2], save.source_object, save.source_record_id, got[2])
    except InvalidIdentityPart as error:
        return Rejected(reason=R.STABLE_IDS_UNRESOLVED, detail=str(error))


def _active_attempt(attempts: tuple[AttemptSummary, ...]) -> AttemptSummary | None:
    blocking = ATTEMPT_RELEASED | {AttemptStatus.TERMINAL_FAILED}
    return next((a for a in attempts if a.status not in blocking), None)


def _slot_problem(action: ActionSlot) -> Rejected | None:
    """Re-check what the manifest validated; a context may be built without it."""
    try:
        check_template(action.create_path, CREATE_PLACEHOLDERS, frozenset())
        check_template(action.update_path, UPDATE_PLACEHOLDERS, frozenset({"remoteId"}))
    except TemplateError as error:
        return Rejected(reason=R.PATH_TEMPLATE_INVALID, detail=str(error))
    remote = [m.remote_property for m in action.mappings]
    if not remote or len(set(remote)) != len(remote):
        return Rejected(reason=R.MAPPING_INVALID, detail="mappings absent or duplicated")
    return None


_AUTHORITY_REASONS = {
    AuthorityFailureReason.OBJECT_UNREADABLE: R.RECORD_UNREADABLE,
    AuthorityFailureReason.RECORD_UNREADABLE: R.RECORD_UNREADABLE,
    AuthorityFailureReason.REQUIRED_FIELD_UNREADABLE: R.FIELD_UNREADABLE,
    AuthorityFailureReason.REQUIRED_FIELD_MISSING: R.REQUIRED_FIELD_MISSING,
    AuthorityFailureReason.EMPTY_BODY: R.EMPTY_BODY,
}


def _authorize(
    ctx: AdmissionContext, key: str, action: ActionSlot
) -> tuple[AuthorityProjection, AuthoritySnapshot] | Rejected:
    facts, user = ctx.permissions, ctx.save.originating_user_id
    if facts is None or not user:
        return Rejected(reason=R.NO_AUTHORITY, link_key=key)
    projection = project_authority(facts, action.mappings, ctx.record.fields)
    if isinstance(projection, AuthorityFailure):
        reason = _AUTHORITY_REASONS[projection.reason]
        detail = f"{projection.reason.value}: {list(projection.fields)}"
        return Rejected(reason=reason, detail=detail, link_key=key)
    assoc_fields = {a.source_field for a in action.associations}
    unreadable = sorted(assoc_fields - facts.readable_fields)
    if unreadable:
        return Rejected(reason=R.FIELD_UNREADABLE, detail=f"association {unreadable}", link_key=key)
    snapshot = AuthoritySnapshot(
        originating_user_id=user,
        source_object=ctx.save.source_object,
        source_record_id=ctx.save.source_record_id,
        allowed_fields=tuple(sorted({*projection.allowed_fields, *assoc_fields})),
        excluded_fields=projection.excluded_fields,
        decided_at=ctx.decided_at,
        mapping_fingerprint=ActionConfigSnapshot.of(action).mapping_fingerprint,
    )
    return projection, snapshot


def _authorize_and_plan(
    ctx: AdmissionContext, key: str, action: ActionSlot
) -> tuple[AuthorityProjection, AuthoritySnapshot, _Plan] | Rejected:
    """Current authority (PACK-2) and association targets, shared by create and PATCH."""
    authorized = _authorize(ctx, key, action)
    if isinstance(authorized, Rejected):
        return authorized
    projection, authority = authorized
    plan = _plan_associations(ctx, action)
    if isinstance(plan, Rejected):
        return plan.model_copy(update={"link_key": key})
    if plan.missing_update_only:
        detail = f"update-only targets not finalized: {list(plan.missing_update_only)}"
        return Rejected(reason=R.ASSOCIATION_TARGET_MISSING, detail=detail, link_key=key)
    return projection, authority, plan


def _plan_associations(ctx: AdmissionContext, action: ActionSlot) -> _Plan | Rejected:
    vector: list[str] = []
    resolved: dict[str, tuple[str, str]] = {}
    pending: list[str] = []
    missing: list[str] = []
    for contract in action.associations:
        source_id = ctx.record.fields.get(contract.source_field)
        if source_id is not None and not isinstance(source_id, str):
            return Rejected(reason=R.ASSOCIATION_VECTOR_INVALID, detail=contract.id)
        vector.append(source_id or "")
        if not source_id:
            continue
        target = ctx.association_targets.get(contract.id)
        if target and target.link_status is LinkStatus.FINALIZED and target.remote_id:
            resolved[contract.id] = (contract.remote_property, target.remote_id)
        elif contract.mode is AssociationMode.UPDATE_ONLY:
            missing.append(contract.id)
        else:
            pending.append(contract.id)
    return _Plan(
        vector=tuple(vector),
        resolved=resolved,
        pending=tuple(pending),
        missing_update_only=tuple(missing),
    )


# -- create ----------------------------------------------------------------------


def _decide_create(ctx: AdmissionContext, key: str) -> AdmissionDecision:
    assert ctx.active is not None
    action, destination, profile = ctx.active.require()
    unresolved = [r.slot_id for r in ctx.lineage_rows if not r.resolved]
    if unresolved:
        return Rejected(reason=R.LINEAGE_UNRESOLVED, detail=f"{unresolved}", link_key=key)
    blocked = _create_path_unvalidated(ctx.active, key)
    if blocked is not None:
        return blocked
    uncertain = prior_ownership(ctx, key)
    if uncertain is not None:
        return uncertain
    problem = _slot_problem(action)
    if problem is not None:
        return problem.model_copy(update={"link_key": key})
    prepared = _authorize_and_plan(ctx, key, action)
    if isinstance(prepared, Rejected):
        return prepared
    projection, authority, plan = prepared
    request = freeze_create_request(
        action=action,
        destination=destination,
        profile=profile,
        properties=projection.properties | {p: rid for p, rid in plan.resolved.values()},
        idempotency_key=ctx.idempotency_key,
        locator_value=ctx.locator_value,
        pending_associations=plan.pending,
    )
    if not isinstance(request, CreateRequestSnapshot):
        return Rejected(reason=R.FREEZE_FAILED, detail=request.detail, link_key=key)
    lane = DispatchLane.DEFERRED_ASSOCIATION if plan.pending else DispatchLane.CONFIGURED
    reservation = _reservation(ctx, key, lane, request, authority, plan.vector)
    if plan.pending:
        return DeferredAssociationReserved(reservation=reservation, waiting_on=plan.pending)
    return CreateReserved(reservation=reservation)


def _create_path_unvalidated(active: ActiveMetadata, key: str) -> Rejected | None:
    """C-8: a changed createPath blocks new creates for its action slot until validated."""
    if not active.create_path_unvalidated:
        return None
    detail = (
        f"the createPath of action slot {active.action_slot_id!r} changed and is not "
        "validated: connector-push revalidate create-path"
    )
    return Rejected(reason=R.CREATE_PATH_UNVALIDATED, detail=detail, link_key=key)


def _reservation(
    ctx: AdmissionContext,
    key: str,
    lane: DispatchLane,
    request: CreateRequestSnapshot,
    authority: AuthoritySnapshot,
    vector: tuple[str, ...],
) -> Reservation:
    assert ctx.active is not None
    action = ctx.active.require()[0]
    return Reservation(
        link_key=key,
        slot=ctx.active.stable_slot(),
        source_record_id=ctx.save.source_record_id,
        names=ctx.active.names(),
        pack_install_id=ctx.active.pack_install_id,
        remote_scope=request.remote_scope,
        dispatch_lane=lane,
        action=ctx.active.action_snapshot(),
        request=request,
        authority=authority,
        association_vector=vector,
        writeback=WritebackSnapshot(
            source_object=ctx.save.source_object,
            source_record_id=ctx.save.source_record_id,
            remote_id_field=action.mirror.remote_id_field,
            provenance_field=action.mirror.provenance_field,
            expected_remote_id=_text(ctx.record.fields.get(action.mirror.remote_id_field)),
            expected_provenance=_text(ctx.record.fields.get(action.mirror.provenance_field)),
        ),
    )


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


# -- PATCH -----------------------------------------------------------------------


def _decide_patch(ctx: AdmissionContext, key: str, link: LinkSnapshot) -> PatchQueued | Rejected:
    assert ctx.active is not None
    match link.status:
        case LinkStatus.SUSPENDED_DRIFT:
            return Rejected(reason=R.LINK_SUSPENDED, detail=str(link.suspend_reason), link_key=key)
        case LinkStatus.RETIRED:
            return Rejected(reason=R.LINK_RETIRED, link_key=key)
        case LinkStatus.FINALIZED:
            pass
    readable = ctx.permissions.readable_fields if ctx.permissions else None
    findings = tuple(classify(link, ctx.active.model_copy(update={"readable_fields": readable})))
    if fails_closed(list(findings)):
        return Rejected(reason=R.DRIFT_FAIL_CLOSED, link_key=key, findings=findings)
    action, destination, profile = ctx.active.require()
    prepared = _authorize_and_plan(ctx, key, action)
    if isinstance(prepared, Rejected):
        return prepared
    projection, authority, plan = prepared
    request = build_patch_request(
        action=action,
        target_object=destination.target_object,
        remote_id=link.remote_id,
        properties=projection.properties | {p: rid for p, rid in plan.resolved.values()},
    )
    if not isinstance(request, PatchRequest):
        return Rejected(reason=R.UPDATE_PATH_UNRENDERABLE, detail=request.detail, link_key=key)
    return PatchQueued(
        link_key=key,
        remote_id=link.remote_id,
        request=request,
        authority=authority,
        findings=findings,
        budget_key=budget_key(destination.remote_scope, profile.credential_ref),
    )
