"""ING-5 event identity: golden vectors computed by an independent expression, numeric
canonicalisation, attempt counter in receipts only, legacy single-path rules."""

from __future__ import annotations

import hashlib
from decimal import Decimal

import pytest

from protocol.event_identity import (
    CompositeIdentityRule,
    IdentityError,
    IdentityField,
    JsonError,
    LegacyIdentityRule,
    PartType,
    business_identity,
    canonical_decimal,
    dump_exact_json,
    parse_exact_json,
    receipt_identity,
)

RULE = CompositeIdentityRule(
    fields=(
        IdentityField(path="eventId", type=PartType.NUMBER),
        IdentityField(path="subscriptionType", type=PartType.STRING),
        IdentityField(path="flag", type=PartType.BOOLEAN),
        IdentityField(path="propertyName", type=PartType.STRING, optional=True),
    ),
    attempt_path="attemptNumber",
)


def frame(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(4, "big") + payload


def independent(domain: str, *frames: bytes) -> str:
    return hashlib.sha256(domain.encode() + b"\x00" + b"".join(frames)).hexdigest()


EVENT = parse_exact_json(
    b'{"eventId": 12.50, "subscriptionType": "contact.deletion", "flag": true, '
    b'"attemptNumber": 3, "objectId": 9}'
)
SCOPE_FRAME = frame(b"s", b"crm")
BUSINESS_FRAMES = (
    SCOPE_FRAME,
    frame(b"n", b"125e-1"),
    frame(b"s", b"contact.deletion"),
    frame(b"b", b"true"),
    frame(b"0", b""),
)


def test_business_identity_matches_an_independent_encoding() -> None:
    expected = "ev1_" + independent("connector-push/event-identity/v1", *BUSINESS_FRAMES)
    assert business_identity(RULE, "crm", EVENT) == expected


def test_receipt_identity_adds_the_attempt_under_its_own_domain() -> None:
    expected = "rc1_" + independent(
        "connector-push/receipt-identity/v1", *BUSINESS_FRAMES, frame(b"n", b"3e0")
    )
    assert receipt_identity(RULE, "crm", EVENT) == expected


def test_pinned_golden_vectors() -> None:
    # Pinned literals: any change to the encoding breaks stored identities.
    assert business_identity(RULE, "crm", EVENT) == (
        "ev1_" + independent("connector-push/event-identity/v1", *BUSINESS_FRAMES)
    )
    assert business_identity(RULE, "crm", EVENT) == GOLDEN_EVENT
    assert receipt_identity(RULE, "crm", EVENT) == GOLDEN_RECEIPT
    legacy = LegacyIdentityRule(path=".callbackId")
    assert business_identity(legacy, "actions", {"callbackId": "cb-1"}) == GOLDEN_LEGACY


GOLDEN_EVENT = "ev1_38c622730965699b400ca7d990f899f7b2395526b3f633393e1c9874268ccef0"
GOLDEN_RECEIPT = "rc1_578aba2e9a309145834f0c3aac8a6a5eded16c9486e9cf800e823bc587143fec"
GOLDEN_LEGACY = "evl1_ded5d1fd10b470b5fa2b29c75c0e9cbb5fd39ebb15fc86dd37564f034b263cd3"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1", "1e0"),
        ("1.0", "1e0"),
        ("1e0", "1e0"),
        ("1E+0", "1e0"),
        ("10", "1e1"),
        ("100.00", "1e2"),
        ("0.5", "5e-1"),
        ("-0", "0"),
        ("0.000", "0"),
        ("-12.340", "-1234e-2"),
        ("123456789012345678901234567890123", "123456789012345678901234567890123e0"),
    ],
)
def test_numbers_canonicalise_exactly(text: str, canonical: str) -> None:
    assert canonical_decimal(Decimal(text)) == canonical


def test_one_one_point_zero_and_1e0_identify_the_same_event() -> None:
    ids = {
        business_identity(RULE, "crm", parse_exact_json(body))
        for body in (
            b'{"eventId": 1, "subscriptionType": "x", "flag": false}',
            b'{"eventId": 1.0, "subscriptionType": "x", "flag": false}',
            b'{"eventId": 1e0, "subscriptionType": "x", "flag": false}',
        )
    }
    assert len(ids) == 1


def test_long_numbers_that_floats_would_merge_stay_distinct() -> None:
    a = parse_exact_json(b'{"eventId": 9007199254740993, "subscriptionType": "x", "flag": true}')
    b = parse_exact_json(b'{"eventId": 9007199254740992, "subscriptionType": "x", "flag": true}')
    assert business_identity(RULE, "crm", a) != business_identity(RULE, "crm", b)


def test_attempt_counter_changes_the_receipt_but_not_the_event() -> None:
    first = {"eventId": Decimal(1), "subscriptionType": "x", "flag": True, "attemptNumber": 0}
    retry = {**first, "attemptNumber": Decimal(1)}
    assert business_identity(RULE, "crm", first) == business_identity(RULE, "crm", retry)
    assert receipt_identity(RULE, "crm", first) != receipt_identity(RULE, "crm", retry)


def test_types_are_part_of_the_frame_and_mismatches_are_rejected() -> None:
    with pytest.raises(IdentityError):
        business_identity(RULE, "crm", {"eventId": "1", "subscriptionType": "x", "flag": True})
    with pytest.raises(IdentityError):
        business_identity(RULE, "crm", {"eventId": 1.0, "subscriptionType": "x", "flag": True})
    with pytest.raises(IdentityError):
        business_identity(RULE, "crm", {"subscriptionType": "x", "flag": True})


def test_framing_prevents_concatenation_collisions() -> None:
    rule = CompositeIdentityRule(
        fields=(
            IdentityField(path="a", type=PartType.STRING),
            IdentityField(path="b", type=PartType.STRING),
        )
    )
    assert business_identity(rule, "crm", {"a": "ab", "b": "c"}) != business_identity(
        rule, "crm", {"a": "a", "b": "bc"}
    )


def test_scope_separates_endpoints() -> None:
    event = {"eventId": Decimal(1), "subscriptionType": "x", "flag": True}
    assert business_identity(RULE, "crm", event) != business_identity(RULE, "other", event)


def test_legacy_single_path_rule() -> None:
    rule = LegacyIdentityRule(path=".callbackId")
    expected = "evl1_" + independent(
        "connector-push/event-identity/legacy-v1", frame(b"s", b"actions"), frame(b"s", b"cb-1")
    )
    assert business_identity(rule, "actions", {"callbackId": "cb-1"}) == expected
    with pytest.raises(IdentityError):
        business_identity(rule, "actions", {"callbackId": {"nested": 1}})


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"a": NaN}', b'{"a": 1, "a": 2}', b"\xff\xfe", b'{"a": Infinity}', b"[1,]"],
)
def test_exact_json_rejects_ambiguous_or_malformed_documents(raw: bytes) -> None:
    with pytest.raises(JsonError):
        parse_exact_json(raw)


def test_exact_json_round_trips_numbers_as_written_values() -> None:
    raw = b'{"n": 12345678901234567890.000000001, "s": "\\u00e4\\u0000", "l": [true, null]}'
    parsed = parse_exact_json(raw)
    assert parse_exact_json(dump_exact_json(parsed).encode()) == parsed
    assert dump_exact_json(parsed).startswith('{"n":12345678901234567890.000000001')
