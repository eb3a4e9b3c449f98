"""Authority projection (SPEC PACK-2): which mapped fields the originating user may send."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import JsonValue

from protocol.canonical import digest
from protocol.manifest import MappingRow
from protocol.snapshots import Snapshot


class PermissionFacts(Snapshot):
    """The originating user's read authority over one record, evaluated by the caller."""

    object_readable: bool
    record_readable: bool
    readable_fields: frozenset[str]


class AuthorityFailureReason(StrEnum):
    OBJECT_UNREADABLE = "object_unreadable"
    RECORD_UNREADABLE = "record_unreadable"
    REQUIRED_FIELD_UNREADABLE = "required_field_unreadable"
    REQUIRED_FIELD_MISSING = "required_field_missing"
    EMPTY_BODY = "empty_body"


class AuthorityFailure(Snapshot):
    reason: AuthorityFailureReason
    fields: tuple[str, ...] = ()


class AuthorityProjection(Snapshot):
    """Allowed/excluded source fields and the remote properties they produce."""

    allowed_fields: tuple[str, ...]
    excluded_fields: tuple[str, ...]
    properties: dict[str, JsonValue]
    body_hash: str


def project_authority(
    facts: PermissionFacts,
    mappings: tuple[MappingRow, ...],
    record_fields: Mapping[str, JsonValue],
) -> AuthorityProjection | AuthorityFailure:
    """Exclude unreadable optional fields; fail closed on anything required or empty."""
    if not facts.object_readable:
        return AuthorityFailure(reason=AuthorityFailureReason.OBJECT_UNREADABLE)
    if not facts.record_readable:
        return AuthorityFailure(reason=AuthorityFailureReason.RECORD_UNREADABLE)
    readable = [m for m in mappings if m.source_field in facts.readable_fields]
    unreadable = [m for m in mappings if m.source_field not in facts.readable_fields]
    blocked = tuple(m.source_field for m in unreadable if m.required)
    if blocked:
        return AuthorityFailure(
            reason=AuthorityFailureReason.REQUIRED_FIELD_UNREADABLE, fields=blocked
        )
    missing = tuple(
        m.source_field for m in readable if m.required and record_fields.get(m.source_field) is None
    )
    if missing:
        return AuthorityFailure(
            reason=AuthorityFailureReason.REQUIRED_FIELD_MISSING, fields=missing
        )
    properties = {
        m.remote_property: record_fields[m.source_field]
        for m in readable
        if m.source_field in record_fields
    }
    if not properties:
        return AuthorityFailure(reason=AuthorityFailureReason.EMPTY_BODY)
    return AuthorityProjection(
        allowed_fields=tuple(sorted({m.source_field for m in readable})),
        excluded_fields=tuple(sorted({m.source_field for m in unreadable})),
        properties=properties,
        body_hash=digest(properties),
    )
