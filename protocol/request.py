"""Request freezing: create and PATCH requests rendered only from pack-owned metadata."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from protocol.canonical import canonical_json, sha256_hex
from protocol.identity import InvalidIdentityPart, check_part
from protocol.manifest import ActionSlot, DestinationSlot, LocatorRecovery, Profile
from protocol.snapshots import CreateRequestSnapshot, ProfileSnapshot, Snapshot
from protocol.templates import TemplateError, render


class FreezeFailure(Snapshot):
    """Something the request must carry could not be frozen (GATE-1, last bullet)."""

    detail: str


class PatchRequest(Snapshot):
    method: str = "PATCH"
    relative_path: str
    headers: dict[str, str]
    body: JsonValue
    body_hash: str


def wrap_body(properties: Mapping[str, JsonValue], envelope: str | None) -> JsonValue:
    """The request body: properties, optionally under one envelope key."""
    inner: dict[str, JsonValue] = dict(properties)
    return {envelope: inner} if envelope else inner


def wire_body(body: JsonValue) -> bytes:
    """The exact bytes to send; `body_hash` is their sha256."""
    return canonical_json(body)


def freeze_create_request(
    *,
    action: ActionSlot,
    destination: DestinationSlot,
    profile: Profile,
    properties: Mapping[str, JsonValue],
    idempotency_key: str,
    locator_value: str | None,
    pending_associations: tuple[str, ...] = (),
) -> CreateRequestSnapshot | FreezeFailure:
    """Freeze the create request; `idempotency_key` and `locator_value` come from the caller."""
    unavailable = _unavailable(action, destination, profile)
    if unavailable:
        return FreezeFailure(detail=f"nothing to freeze for {', '.join(unavailable)}")
    try:
        check_part("RequestIdempotencyKey", idempotency_key)
        path = render(action.create_path, {"target": destination.target_object})
        props = _with_locator(properties, profile.locator_recovery, locator_value)
    except (InvalidIdentityPart, TemplateError) as error:
        return FreezeFailure(detail=str(error))
    header = profile.idempotency.post.header if profile.idempotency.post else None
    body = wrap_body(props, action.body_envelope)
    return CreateRequestSnapshot(
        relative_path=path,
        headers={header: idempotency_key} if header else {},
        body=body,
        body_hash=sha256_hex(wire_body(body)),
        target_object=destination.target_object,
        remote_scope=destination.remote_scope,
        profile=ProfileSnapshot.of(profile),
        response_id_path=action.response_id_path,
        mirror=action.mirror,
        idempotency_key=idempotency_key,
        locator_value=locator_value if profile.locator_recovery else None,
        pending_associations=pending_associations,
    )


def _unavailable(action: ActionSlot, destination: DestinationSlot, profile: Profile) -> list[str]:
    """The snapshot inputs a create must freeze that have no value (GATE-1: nothing frozen
    may be empty). The manifest refuses them, but a context may be built without it."""
    frozen = {
        "credentialRef": profile.credential_ref,
        "endpointClass": profile.endpoint_class,
        "targetObject": destination.target_object,
        "responseIdPath": action.response_id_path,
    }
    return [name for name, value in frozen.items() if not (value and value.strip())]


def _with_locator(
    properties: Mapping[str, JsonValue],
    recovery: LocatorRecovery | None,
    locator_value: str | None,
) -> dict[str, JsonValue]:
    props = dict(properties)
    if recovery is None:
        return props
    if locator_value is None:
        raise InvalidIdentityPart("locator", "the profile's recovery contract needs a locator")
    if recovery.remote_property in props:
        raise TemplateError(f"locator property {recovery.remote_property!r} is also mapped")
    props[recovery.remote_property] = check_part("locator", locator_value)
    return props


def complete_deferred_request(
    request: CreateRequestSnapshot,
    envelope: str | None,
    resolved: Mapping[str, tuple[str, str]],
) -> CreateRequestSnapshot | FreezeFailure:
    """Add resolved association targets (contract id -> (remote property, remote id))
    to a deferred request under its claim (LANE-2); every pending contract must resolve."""
    missing = [c for c in request.pending_associations if c not in resolved]
    if missing:
        return FreezeFailure(detail=f"association targets unresolved: {missing}")
    inner = request.body.get(envelope) if envelope and isinstance(request.body, dict) else None
    base = inner if envelope else request.body
    if not isinstance(base, dict):
        return FreezeFailure(detail="frozen body has no property map")
    props = dict(base) | {prop: rid for prop, rid in resolved.values()}
    body = wrap_body(props, envelope)
    return request.model_copy(
        update={
            "body": body,
            "body_hash": sha256_hex(wire_body(body)),
            "pending_associations": (),
        }
    )


def build_patch_request(
    *,
    action: ActionSlot,
    target_object: str,
    remote_id: str,
    properties: Mapping[str, JsonValue],
) -> PatchRequest | FreezeFailure:
    """Render the update path from the durable remote id (never a record field)."""
    try:
        path = render(action.update_path, {"target": target_object, "remoteId": remote_id})
    except TemplateError as error:
        return FreezeFailure(detail=str(error))
    body = wrap_body(properties, action.body_envelope)
    return PatchRequest(
        relative_path=path, headers={}, body=body, body_hash=sha256_hex(wire_body(body))
    )


def locator_lookup_path(recovery: LocatorRecovery, target_object: str, locator: str) -> str:
    """The GET path that finds the object created with `locator` (REC-1 recovery)."""
    return render(
        recovery.lookup_path,
        {"target": target_object, "locator": locator, "property": recovery.remote_property},
    )
