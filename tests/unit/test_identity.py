"""ID-2 link key: golden vectors from an independent encoding, framing, validation."""

from __future__ import annotations

import hashlib
import struct
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from protocol.identity import InvalidIdentityPart, LinkIdentity, has_control_character, link_key
from tests.examples import examples


def independent_key(*parts: str) -> str:
    """ID-2 written out again, without touching protocol code."""
    owner, slot, obj, record, dest = parts
    payload = b"connector-push/link-key/v1\x00"
    for part in (owner, slot, "PushToConnector", obj, record, dest):
        raw = part.encode("utf-8")
        payload += struct.pack(">I", len(raw)) + raw
    return "lk1_" + hashlib.sha256(payload).hexdigest()


GOLDEN = [
    ("demo-owner", "push-contact", "Contact", "003A", "remote-contacts"),
    ("o", "a", "s", "r", "d"),
    ("Ünïcode-owner", "slot/1", "Account", "001xx000003DGb2AAG", "dest:é"),
]


@pytest.mark.parametrize("parts", GOLDEN)
def test_golden_vectors_match_independent_encoding(parts: tuple[str, ...]) -> None:
    assert link_key(*parts) == independent_key(*parts)


def test_pinned_vector() -> None:
    # Pinned so a change in the encoding is caught even if both expressions drift.
    assert link_key("o", "a", "Contact", "r", "d") == (
        "lk1_8db764c372ae4abbb4d112eeb7b23ca1c4e7038a8cf5bffdea5b2927ce0a0c78"
    )


def test_length_framing_separates_shifted_boundaries() -> None:
    assert link_key("ab", "c", "o", "r", "d") != link_key("a", "bc", "o", "r", "d")
    assert link_key("o", "s", "ab", "c", "d") != link_key("o", "s", "a", "bc", "d")


def test_parts_are_exact_strings() -> None:
    assert link_key("Owner", "a", "o", "r", "d") != link_key("owner", "a", "o", "r", "d")


@pytest.mark.parametrize(
    ("index", "value", "part"),
    [
        (0, "", "ConnectorOwnerKey"),
        (1, " slot", "ActionSlotId"),
        (2, "obj\t", "SourceObject"),
        (3, "r\x00x", "SourceRecordId"),
        (4, "d\nx", "DestinationSlotId"),
    ],
)
def test_invalid_parts_raise_typed_error_naming_part(index: int, value: str, part: str) -> None:
    parts = ["o", "a", "s", "r", "d"]
    parts[index] = value
    with pytest.raises(InvalidIdentityPart) as info:
        link_key(*parts)
    assert info.value.part == part
    assert part in str(info.value)


def test_link_identity_model_validates_and_exposes_key() -> None:
    identity = LinkIdentity(
        connector_owner_key="o",
        action_slot_id="a",
        source_object="s",
        source_record_id="r",
        destination_slot_id="d",
    )
    assert identity.key == link_key("o", "a", "s", "r", "d")
    with pytest.raises(ValidationError, match="SourceRecordId"):
        LinkIdentity(
            connector_owner_key="o",
            action_slot_id="a",
            source_object="s",
            source_record_id="",
            destination_slot_id="d",
        )


part = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zs")), min_size=1, max_size=12
)
parts_tuple = st.tuples(part, part, part, part, part)


@given(st.lists(parts_tuple, min_size=2, max_size=60, unique=True))
@settings(max_examples=examples(200))
def test_distinct_part_tuples_never_collide(samples: list[tuple[str, ...]]) -> None:
    valid = [p for p in samples if all(x == x.strip() for x in p)]
    keys = {link_key(*p) for p in valid}
    assert len(keys) == len(valid)


@given(parts_tuple)
def test_link_key_is_deterministic_and_independent(parts: tuple[str, ...]) -> None:
    if any(x != x.strip() for x in parts):
        return
    assert link_key(*parts) == link_key(*parts) == independent_key(*parts)


def test_the_ascii_fast_path_finds_exactly_the_control_characters_categories_name() -> None:
    """`has_control_character` reads an ASCII value with one regex, not a category per
    character: over every ASCII character, and non-ASCII ones through the slow path, it
    agrees with `unicodedata` for the identity rule (Cc, Cs) and the remote-id rule."""
    for categories in (frozenset({"Cc", "Cs"}), frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})):
        for code in range(128):
            value = f"id-{chr(code)}-1"
            expected = unicodedata.category(chr(code)) in categories
            assert has_control_character(value, categories) is expected, code
        for value in ("caf\u00e9", "a\u0085b", "a\u200bb", "x\ud800", "\ue000"):
            expected = any(unicodedata.category(ch) in categories for ch in value)
            assert has_control_character(value, categories) is expected, value
