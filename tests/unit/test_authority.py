"""PACK-2 authority projection."""

from __future__ import annotations

from protocol.authority import (
    AuthorityFailure,
    AuthorityFailureReason,
    AuthorityProjection,
    PermissionFacts,
    project_authority,
)
from tests.unit.factories import CONTACT_FIELDS, demo_manifest

MAPPINGS = demo_manifest().action_slots[0].mappings
RECORD = {"Email": "a@example.com", "FirstName": "Ada", "LastName": "L", "Phone": "1"}


def facts(readable: frozenset[str] = CONTACT_FIELDS, record: bool = True) -> PermissionFacts:
    return PermissionFacts(object_readable=True, record_readable=record, readable_fields=readable)


def test_unreadable_optional_field_is_excluded_and_recorded() -> None:
    result = project_authority(facts(CONTACT_FIELDS - {"Phone"}), MAPPINGS, RECORD)
    assert isinstance(result, AuthorityProjection)
    assert result.excluded_fields == ("Phone",)
    assert "Phone" not in result.allowed_fields
    assert result.properties == {"email": "a@example.com", "firstname": "Ada", "lastname": "L"}


def test_unreadable_required_field_fails_closed() -> None:
    result = project_authority(facts(CONTACT_FIELDS - {"Email"}), MAPPINGS, RECORD)
    assert result == AuthorityFailure(
        reason=AuthorityFailureReason.REQUIRED_FIELD_UNREADABLE, fields=("Email",)
    )


def test_unreadable_record_fails_closed() -> None:
    result = project_authority(facts(record=False), MAPPINGS, RECORD)
    assert isinstance(result, AuthorityFailure)
    assert result.reason is AuthorityFailureReason.RECORD_UNREADABLE


def test_empty_body_fails_closed() -> None:
    slot = demo_manifest(
        lambda d: d["actionSlots"][0]["mappings"][0].update(required=False)
    ).action_slots[0]
    result = project_authority(facts(frozenset()), slot.mappings, RECORD)
    assert isinstance(result, AuthorityFailure)
    assert result.reason is AuthorityFailureReason.EMPTY_BODY


def test_body_hash_tracks_values() -> None:
    a = project_authority(facts(), MAPPINGS, RECORD)
    b = project_authority(facts(), MAPPINGS, RECORD | {"Phone": "2"})
    assert isinstance(a, AuthorityProjection) and isinstance(b, AuthorityProjection)
    assert a.body_hash != b.body_hash
