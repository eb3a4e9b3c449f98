"""ING-5 fast paths stay byte-identical: `canonical_decimal` read from `str(value)` equals
the digit-tuple reading, `dump_exact_json` equals `json.dumps` per scalar, and
`identities` equals `business_identity` plus `receipt_identity`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.event_identity import (
    CompositeIdentityRule,
    IdentityError,
    IdentityField,
    LegacyIdentityRule,
    PartType,
    business_identity,
    canonical_decimal,
    dump_exact_json,
    identities,
    receipt_identity,
)
from tests.examples import examples


def reference_canonical(value: Decimal) -> str:
    """The original digit-tuple reading."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).lstrip("0")
    if not text:
        return "0"
    stripped = text.rstrip("0")
    exponent += len(text) - len(stripped)
    return f"{'-' if sign else ''}{stripped}e{exponent}"


def reference_dump(value: object) -> str:
    """The original serialisation: `json.dumps` for every key and scalar."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        items = (
            f"{json.dumps(k, ensure_ascii=False)}:{reference_dump(v)}" for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(reference_dump(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


DECIMALS = st.decimals(allow_nan=False, allow_infinity=False) | st.builds(
    lambda coefficient, exponent, sign: Decimal(
        (sign, tuple(int(d) for d in str(coefficient)), exponent)
    ),
    st.integers(0, 10**40),
    st.integers(-(10**6), 10**6),
    st.integers(0, 1),
)


@settings(max_examples=examples(2000), deadline=None)
@given(DECIMALS)
def test_canonical_decimal_equals_the_digit_tuple_reading(value: Decimal) -> None:
    assert canonical_decimal(value) == reference_canonical(value)


def test_canonical_decimal_edge_cases() -> None:
    for text in ("-0", "0E-7", "-0.000", "1E+5", "100", "0.00123", "-1.230E-9", "12.50"):
        assert canonical_decimal(Decimal(text)) == reference_canonical(Decimal(text))
    for text in ("NaN", "Infinity", "-Infinity", "sNaN"):
        try:
            canonical_decimal(Decimal(text))
        except IdentityError:
            continue
        raise AssertionError(f"{text} was canonicalised")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.text()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(), children, max_size=4)
        | st.dictionaries(st.integers(), children, max_size=2)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(1000), deadline=None)
@given(JSON_VALUES)
def test_dump_exact_json_equals_the_json_dumps_reading(value: object) -> None:
    assert dump_exact_json(value) == reference_dump(value)


RULES = (
    CompositeIdentityRule(
        fields=(
            IdentityField(path="eventId", type=PartType.NUMBER),
            IdentityField(path=".kind", type=PartType.STRING),
            IdentityField(path="flag", type=PartType.BOOLEAN, optional=True),
        ),
        attempt_path="attemptNumber",
    ),
    LegacyIdentityRule(path=".eventId", attempt_path="attemptNumber"),
    LegacyIdentityRule(path="eventId"),
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.text(max_size=4)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.integers()
    | st.just({"nested": Decimal(1)})
)
EVENTS = st.dictionaries(st.sampled_from(["eventId", "kind", "flag", "attemptNumber"]), SCALARS)


def outcome(compute: Callable[..., object], *args: object) -> object:
    try:
        return compute(*args)
    except IdentityError:
        return IdentityError


@settings(max_examples=examples(1000), deadline=None)
@given(EVENTS)
def test_identities_equal_the_separate_functions(event: dict[str, object]) -> None:
    for rule in RULES:
        business = outcome(business_identity, rule, "crm", event)
        receipt = outcome(receipt_identity, rule, "crm", event)
        together = outcome(identities, rule, "crm", event)
        if business is IdentityError or receipt is IdentityError:
            assert together is IdentityError
        else:
            assert together == (business, receipt)


def test_attempt_part_is_an_optional_number() -> None:
    rule = LegacyIdentityRule(path="eventId", attempt_path="attemptNumber")

    def frame(tag: bytes, payload: bytes) -> bytes:
        return tag + len(payload).to_bytes(4, "big") + payload

    scope, part = frame(b"s", b"crm"), frame(b"n", b"1e0")
    domain = b"connector-push/receipt-identity/legacy-v1\x00"
    absent = "rcl1_" + hashlib.sha256(domain + scope + part + frame(b"0", b"")).hexdigest()
    assert receipt_identity(rule, "crm", {"eventId": Decimal(1)}) == absent
    assert receipt_identity(rule, "crm", {"eventId": Decimal(1), "attemptNumber": None}) == absent
    second = frame(b"n", b"2e0")
    present = "rcl1_" + hashlib.sha256(domain + scope + part + second).hexdigest()
    assert receipt_identity(rule, "crm", {"eventId": 1, "attemptNumber": Decimal("2.0")}) == present
