"""Canonical JSON a member at a time (issue 16, P4) writes exactly what `canonical_json` does.

The bulk revalidation digests each link row before and after its move from the
rows' encoded members; a byte of difference would make every planned manifest
fail its row-digest check, or bind a receipt to a row that never existed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from protocol.canonical import canonical_json, digest, join_members, object_members, value_text
from protocol.link_row import ROW_DIGEST_ALGORITHM, LinkRowState, after_state, link_row_digest
from protocol.revalidation import project_receipt
from tests.examples import examples
from tests.unit.test_revalidation_manifest import manifest, row

# Any text JSON can hold: control characters, quotes, backslashes, non-ASCII, astral.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | st.integers() | FLOATS | TEXT
JSON: st.SearchStrategy[JsonValue] = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(300))
@given(st.dictionaries(TEXT, JSON, max_size=8))
def test_joined_members_are_the_objects_canonical_json(value: dict[str, JsonValue]) -> None:
    assert join_members(object_members(value)).encode("utf-8") == canonical_json(value)


@given(JSON)
def test_a_values_text_is_its_canonical_json(value: JsonValue) -> None:
    assert value_text(value).encode("utf-8") == canonical_json(value)


def test_a_member_replaced_is_the_object_with_that_value() -> None:
    members = object_members({"b": "x\n", "a": [1, {"z": None, "é": "\x7f"}]})
    replaced = {**members, **object_members({"b": "y\u2028"})}
    assert join_members(replaced).encode() == canonical_json(
        {"a": [1, {"é": "\x7f", "z": None}], "b": "y\u2028"}
    )


@settings(max_examples=examples(100))
@given(TEXT, TEXT, st.none() | TEXT, JSON)
def test_row_digests_are_the_digests_of_the_models_json_dumps(
    remote_id: str, template: str, version: str | None, snapshot: JsonValue
) -> None:
    before: LinkRowState = row(
        7,
        remote_id=remote_id or "r",
        update_path_template=template,
        flow_version=version,
        profile_snapshot=snapshot,
    )
    m = manifest(before)
    receipt = project_receipt(m, m.members[0], before)
    after = after_state(before, m.members[0], m.operation_id)
    for state, found in ((before, receipt.before_row_digest), (after, receipt.after_row_digest)):
        dumped = digest({"algorithm": ROW_DIGEST_ALGORITHM, "row": state.model_dump(mode="json")})
        assert found == dumped == link_row_digest(state)
