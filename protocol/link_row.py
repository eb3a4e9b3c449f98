"""A finalized link's full-row digest and the row a revalidation moves it to (SPEC §9).

Rule 2 of the seed's "L0 Transaction Invariants": each manifest member binds
`link_row_digest` of its link (the columns of `LinkRowState`) plus explicit
old/new fingerprints and pack lineage; the caller recomputes the digest from the
row it holds locked.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue

from protocol.canonical import member_text, object_members, value_text
from protocol.revalidation_manifest import RevalidationMember

if TYPE_CHECKING:
    from hashlib import _Hash as Hash

ROW_DIGEST_ALGORITHM: Final = "connector-push/link-row:v1"

# Link columns deliberately outside the full-row digest: bookkeeping that moves on
# every PATCH, mirror write or operator stamp and says nothing about what the
# link is validated against. Every other column is a `LinkRowState` field (a db
# test holds the schema to this split, so a new column forces a decision).
ROW_DIGEST_EXCLUDED_COLUMNS: Final = frozenset(
    {
        "row_version",
        "created_at",
        "updated_at",
        "drift_findings",
        "suspend_reason",
        "mirror_status",
        "remote_etag",
        "last_operator",
        "last_operator_reason",
        "last_operator_at",
        "wake_pending",  # the relay's flag (migration 0290), not a fact of the link
    }
)


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LinkRowState(_Value):
    """Every `connector_remote_link` column except `ROW_DIGEST_EXCLUDED_COLUMNS`.

    Grouped as invariant 2 names them: the finalized link id and status; the
    durable identity (stable slot ids, source record, creating install); the
    remote id and scope; the complete persisted profile/path snapshot (names,
    profile hashes and JSON snapshot, path templates, responseIdPath, mirror
    tuple, last validated install); the current fingerprints; and the current
    revalidation pointer. Install ids are lowercase uuid text.
    """

    link_key: str
    status: str
    connector_owner_key: str
    action_slot_id: str
    action_type: str
    source_object: str
    source_record_id: str
    destination_slot_id: str
    created_pack_install_id: str
    remote_id: str
    remote_scope: str
    connector_namespace: str
    flow_developer_name: str
    flow_action_name: str
    flow_version: str | None
    target_object: str
    profile_name: str
    last_validated_pack_install_id: str
    credential_ref: str
    credential_generation_hash: str | None
    endpoint_class: str
    endpoint_binding_hash: str | None
    retry_policy_hash: str
    profile_payload_hash: str
    profile_snapshot: JsonValue
    create_path_template: str
    update_path_template: str
    response_id_path: str
    mirror_source_object: str | None
    mirror_remote_id_field: str | None
    mirror_provenance_field: str | None
    mapping_fingerprint: str
    body_fingerprint: str
    last_mapping_revalidation_operation_id: str | None


def link_row_digest(row: LinkRowState) -> str:
    """sha256 of canonical JSON {algorithm, row}: the value a member's expected digest binds."""
    # vars(row) is row.model_dump(mode="json"): every field is already a JSON value
    # (str, None or the JSON snapshot), and skipping the serializer halves the cost (P4).
    values = vars(row)
    return _filled_digest(_frame(values, None, None), _per_link_texts(values))


class RowDigests(NamedTuple):
    """A row's `link_row_digest` before and after a member's transition."""

    before: str
    after: str


def row_digests(row: LinkRowState, member: RevalidationMember, operation_id: str) -> RowDigests:
    """The digests of `row` and of its after-state, which share every unmoved column's
    encoding (each member of a bulk manifest needs both; bench P4)."""
    values = vars(row)
    moved = (
        member.new_mapping_fingerprint,
        member.new_body_fingerprint,
        member.new_pack_install_id,
        operation_id,
    )
    # One set per operation and slot: every member moves to the same four values.
    texts = _cached(_moved_texts, moved, lambda: object_members(_moved(member, operation_id)))
    per_link = _per_link_texts(values)
    return RowDigests(
        _filled_digest(_frame(values, None, None), per_link),
        _filled_digest(_frame(values, moved, texts), per_link),
    )


# -- the digested document, a frame shared by many rows and their own few members --------
# The document is {"algorithm": ..., "row": {...}} ("algorithm" sorts first), and a row's
# members are always LinkRowState's fields: their sorted order is fixed. Only the
# per-link columns differ between the rows of one slot and install, so the rest of the
# document's text (the frame: its pieces around the per-link members) is built once per
# shared value set, snapshot and move, and a row's digest joins its three members into it
# (building and joining every member per row was most of a digest's cost at NF-7's scale).

# Columns whose values differ from link to link (not worth caching); every other column
# but the profile snapshot is text or null, so their values together are a key.
_PER_LINK: Final = ("link_key", "source_record_id", "remote_id")
_SHARED_COLUMNS: Final = tuple(
    key for key in LinkRowState.model_fields if key not in {*_PER_LINK, "profile_snapshot"}
)
_shared_values: Final = operator.itemgetter(*_SHARED_COLUMNS)
_ALGORITHM_MEMBER: Final = member_text("algorithm", value_text(ROW_DIGEST_ALGORITHM))
_ROW_ORDER: Final = tuple(sorted(LinkRowState.model_fields))
_in_row_order: Final = operator.itemgetter(*_ROW_ORDER)
_PER_LINK_ORDER: Final = tuple(key for key in _ROW_ORDER if key in _PER_LINK)
# Where a per-link member goes in a frame: canonical JSON escapes every control
# character, so no member's text holds this one.
_HOLE: Final = "\x00"
_frames: dict[tuple[object, ...], _Frame] = {}


class _Frame(NamedTuple):
    """A digested document's text around its per-link members, as UTF-8: the sha256
    state after its first piece, and the pieces that follow each per-link member."""

    head: Hash
    pieces: tuple[bytes, ...]


def _frame(
    values: Mapping[str, JsonValue],
    moved: tuple[str, ...] | None,
    moved_texts: Mapping[str, str] | None,
) -> _Frame:
    """The frame of a row with `values`, its `MOVED_COLUMNS` replaced by `moved_texts`
    when given (`moved` their values)."""
    shared_values = _shared_values(values)
    snapshot = _snapshot_member(values["profile_snapshot"])

    def build() -> _Frame:
        members = {
            name: member_text(name, value_text(value))
            for name, value in zip(_SHARED_COLUMNS, shared_values, strict=True)
        }
        members["profile_snapshot"] = snapshot
        members.update(moved_texts or {})
        members.update(dict.fromkeys(_PER_LINK, _HOLE))
        row = "{" + ",".join(_in_row_order(members)) + "}"
        document = "{" + _ALGORITHM_MEMBER + "," + member_text("row", row) + "}"
        first, *rest = (piece.encode("utf-8") for piece in document.split(_HOLE))
        return _Frame(hashlib.sha256(first), tuple(rest))

    return _cached(_frames, (shared_values, snapshot, moved), build)


_CACHED_MAX: Final = 256
K = TypeVar("K")
V = TypeVar("V")


def _cached(cache: dict[K, V], key: K, encode: Callable[[], V]) -> V:
    """`cache[key]`, encoded on a miss; a full cache starts again (a bulk run's pages
    share a handful of keys, so this bounds memory, not the hit rate)."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= _CACHED_MAX:
            cache.clear()
        found = cache[key] = encode()
    return found


# The last snapshot encoded and its member text; the object is kept, so `is` is exact.
_last_snapshot: list[tuple[JsonValue, str]] = []


def _snapshot_member(snapshot: JsonValue) -> str:
    if _last_snapshot and _last_snapshot[0][0] is snapshot:
        return _last_snapshot[0][1]
    text = member_text("profile_snapshot", value_text(snapshot))
    _last_snapshot[:] = [(snapshot, text)]
    return text


# `member_text` of each per-link column, as UTF-8 without its value, and the column.
_PER_LINK_KEYS: Final = tuple(
    (member_text(key, "").encode("utf-8"), key) for key in _PER_LINK_ORDER
)


def _per_link_texts(values: Mapping[str, JsonValue]) -> list[bytes]:
    return [key + value_text(values[name]).encode("utf-8") for key, name in _PER_LINK_KEYS]


def _filled_digest(frame: _Frame, per_link: list[bytes]) -> str:
    """sha256 of the frame with the per-link members in their holes."""
    digest = frame.head.copy()
    for text, piece in zip(per_link, frame.pieces, strict=True):
        digest.update(text)
        digest.update(piece)
    return digest.hexdigest()


_moved_texts: dict[tuple[str, str, str, str], dict[str, str]] = {}


# The digested columns a revalidation moves (`after_state`); every other one stays as it was.
MOVED_COLUMNS: Final = frozenset(
    {
        "mapping_fingerprint",
        "body_fingerprint",
        "last_validated_pack_install_id",
        "last_mapping_revalidation_operation_id",
    }
)


def after_state(row: LinkRowState, member: RevalidationMember, operation_id: str) -> LinkRowState:
    """The row once this member's transition is applied (only `MOVED_COLUMNS` move)."""
    return row.model_copy(update=_moved(member, operation_id))


def _moved(member: RevalidationMember, operation_id: str) -> dict[str, JsonValue]:
    return {
        "mapping_fingerprint": member.new_mapping_fingerprint,
        "body_fingerprint": member.new_body_fingerprint,
        "last_validated_pack_install_id": member.new_pack_install_id,
        "last_mapping_revalidation_operation_id": operation_id,
    }


def before_state(row: LinkRowState, member: RevalidationMember) -> LinkRowState:
    """The row as it must have been before this member's transition (for retries)."""
    return row.model_copy(
        update={
            "mapping_fingerprint": member.old_mapping_fingerprint,
            "body_fingerprint": member.old_body_fingerprint,
            "last_validated_pack_install_id": member.old_pack_install_id,
            "last_mapping_revalidation_operation_id": member.expected_revalidation_operation_id,
        }
    )


def plan_member(
    row: LinkRowState, new_mapping: str, new_body: str, new_pack_install_id: str
) -> RevalidationMember:
    """The member that moves `row` to the given fingerprints and install, bound to `row`."""
    return RevalidationMember(
        link_key=row.link_key,
        expected_row_digest=link_row_digest(row),
        expected_revalidation_operation_id=row.last_mapping_revalidation_operation_id,
        old_mapping_fingerprint=row.mapping_fingerprint,
        new_mapping_fingerprint=new_mapping,
        old_body_fingerprint=row.body_fingerprint,
        new_body_fingerprint=new_body,
        old_pack_install_id=row.last_validated_pack_install_id,
        new_pack_install_id=new_pack_install_id,
    )


# -- receipts and the decision -----------------------------------------------------
