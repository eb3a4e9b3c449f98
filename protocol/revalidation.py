"""Bulk finalized-link mapping revalidation (SPEC §9 REV-1..3): manifest, digests, decision.

Rules (the seed's "L0 Transaction Invariants", numbered as there):

1. A manifest is accepted only as its own canonical document: strict shape,
   members strictly sorted by link key, every authority string canonical, a
   complete approval, known fingerprint algorithms, and a `manifest_digest`
   equal to the digest recomputed here. `parse_manifest` decides all of it
   before anyone opens a transaction.
2. Each member binds `link_row_digest` of its link (the columns of
   `LinkRowState`) plus explicit old/new fingerprints and pack lineage; the
   caller recomputes the digest from the row it holds locked.
3-5. `decide` turns the locked rows, their occupying attempts and the receipts
   already written for the operation into `Apply`, `AlreadyApplied` or
   `Rejected`. A new operation applies only if every member is exactly as
   planned and unoccupied; a retry is verify-only and any mixed or divergent
   state fails closed. One conflict anywhere rejects the whole manifest.
6. Validation and application share `decide`; only the caller's writes differ.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Final, Literal, NamedTuple, assert_never

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from protocol.canonical import digest, join_members, member_text, object_members, sha256_hex
from protocol.states import LinkStatus

MANIFEST_FORMAT: Final = "connector-push/mapping-revalidation/v1"
# The algorithms behind protocol/snapshots.py mapping_fingerprint / body_fingerprint.
MAPPING_FINGERPRINT_ALGORITHM: Final = "sha256-canonical-json:mappings+associations:v1"
BODY_FINGERPRINT_ALGORITHM: Final = "sha256-canonical-json:envelope+properties:v1"
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
    }
)


class ManifestRejectReason(StrEnum):
    INVALID_SHAPE = "invalid_shape"
    NON_CANONICAL_STRING = "non_canonical_string"
    EMPTY_APPROVAL = "empty_approval"
    NO_MEMBERS = "no_members"
    DUPLICATE_LINK_KEY = "duplicate_link_key"
    UNSORTED_MEMBERS = "unsorted_members"
    UNSUPPORTED_ALGORITHM = "unsupported_algorithm"
    NOOP_MEMBER = "noop_member"
    DIGEST_MISMATCH = "digest_mismatch"


class ManifestRejected(ValueError):
    """The manifest is not its canonical, approved self; nothing may be opened or written."""

    def __init__(self, reason: ManifestRejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


# -- canonical strings -----------------------------------------------------------

# Each authority-string shape, anchored, and what a rejection says it should be. Matched
# inside pydantic-core (Rust regex: `$` is the very end, as with re.fullmatch), not by a
# Python callback per field: a 100,000-member manifest has 800,000 of them (issue 16 P4).
_HEX64: Final = r"^[0-9a-f]{64}$"
_LINK_KEY: Final = r"^lk[0-9]+_[0-9a-f]{64}$"
_UUID: Final = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_OPERATION_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_SHAPES: Final = {
    _HEX64: "64 lowercase hex digits",
    _LINK_KEY: "a link key lk<version>_<64 hex>",
    _UUID: "a lowercase hyphenated uuid",
    _OPERATION_ID: "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}",
}


def _non_canonical(value: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("non_canonical_string", "{value!r} is not canonical: {why}",
                               {"value": value, "why": why})  # fmt: skip


def _text(value: str) -> str:
    """Printable, NFC, no surrounding whitespace: one spelling per meaning."""
    if value != value.strip():
        raise _non_canonical(value, "surrounding whitespace")
    if not value.isprintable():
        raise _non_canonical(value, "control or separator characters")
    if unicodedata.normalize("NFC", value) != value:
        raise _non_canonical(value, "not NFC-normalised")
    return value


def _approval_text(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_approval", "approval fields must not be empty")
    return _text(value)


Text = Annotated[str, AfterValidator(_text)]
ApprovalText = Annotated[str, AfterValidator(_approval_text)]
Hex64 = Annotated[str, StringConstraints(pattern=_HEX64)]
LinkKey = Annotated[str, StringConstraints(pattern=_LINK_KEY)]
InstallId = Annotated[str, StringConstraints(pattern=_UUID)]
OperationId = Annotated[str, StringConstraints(pattern=_OPERATION_ID)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the manifest ------------------------------------------------------------------


class Approval(_Strict):
    approved_by: ApprovalText
    approval_reference: ApprovalText
    reason: ApprovalText


class RevalidationMember(_Strict):
    """One link's planned transition, bound to the exact row it was planned from."""

    link_key: LinkKey
    expected_row_digest: Hex64
    expected_revalidation_operation_id: OperationId | None
    old_mapping_fingerprint: Hex64
    new_mapping_fingerprint: Hex64
    old_body_fingerprint: Hex64
    new_body_fingerprint: Hex64
    old_pack_install_id: InstallId
    new_pack_install_id: InstallId

    @property
    def changes_nothing(self) -> bool:
        return (
            self.old_mapping_fingerprint == self.new_mapping_fingerprint
            and self.old_body_fingerprint == self.new_body_fingerprint
            and self.old_pack_install_id == self.new_pack_install_id
        )


class RevalidationManifest(_Strict):
    format: Literal["connector-push/mapping-revalidation/v1"]
    operation_id: OperationId
    approval: Approval
    mapping_fingerprint_algorithm: Text
    body_fingerprint_algorithm: Text
    # A JSON array; the members themselves stay strict.
    members: tuple[RevalidationMember, ...] = Field(strict=False)
    manifest_digest: Hex64

    @cached_property  # once per manifest, not once per receipt (issue 16, P4)
    def approval_digest(self) -> str:
        return digest(self.approval.model_dump(mode="json"))

    def document(self) -> dict[str, JsonValue]:
        """The file's JSON form (what `manifest_digest` covers, plus the digest)."""
        return self.model_dump(mode="json")


def document_digest(document: Mapping[str, JsonValue]) -> str:
    """sha256 of the canonical JSON of a manifest document without its `manifest_digest`."""
    return digest({k: v for k, v in document.items() if k != "manifest_digest"})


_ERROR_REASONS: Final = {
    "non_canonical_string": ManifestRejectReason.NON_CANONICAL_STRING,
    "empty_approval": ManifestRejectReason.EMPTY_APPROVAL,
}


def _shape_error(error: ValidationError) -> ManifestRejected:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "manifest"
    if first["type"] == "string_pattern_mismatch":  # one of _SHAPES
        shape = _SHAPES[first["ctx"]["pattern"]]
        detail = f"{first['input']!r} is not canonical: expected {shape}"
        return ManifestRejected(ManifestRejectReason.NON_CANONICAL_STRING, f"{where}: {detail}")
    reason = _ERROR_REASONS.get(first["type"], ManifestRejectReason.INVALID_SHAPE)
    return ManifestRejected(reason, f"{where}: {first['msg']}")


def parse_manifest(document: object) -> RevalidationManifest:
    """Invariant 1: the manifest, or `ManifestRejected` naming the first problem."""
    try:
        manifest = RevalidationManifest.model_validate(document)
    except ValidationError as error:
        raise _shape_error(error) from None
    for reason, detail in _manifest_problems(manifest):
        raise ManifestRejected(reason, detail)
    return manifest


def _manifest_problems(m: RevalidationManifest) -> Iterator[tuple[ManifestRejectReason, str]]:
    R = ManifestRejectReason
    keys = [member.link_key for member in m.members]
    if not keys:
        yield R.NO_MEMBERS, "a manifest names at least one link"
    duplicates = sorted(k for k, n in Counter(keys).items() if n > 1)
    if duplicates:
        yield R.DUPLICATE_LINK_KEY, f"links named more than once: {', '.join(duplicates)}"
    if keys != sorted(keys):
        yield R.UNSORTED_MEMBERS, "members must be sorted by link_key"
    algorithms = (m.mapping_fingerprint_algorithm, m.body_fingerprint_algorithm)
    if algorithms != (MAPPING_FINGERPRINT_ALGORITHM, BODY_FINGERPRINT_ALGORITHM):
        expected = f"{MAPPING_FINGERPRINT_ALGORITHM} / {BODY_FINGERPRINT_ALGORITHM}"
        yield R.UNSUPPORTED_ALGORITHM, f"{algorithms[0]} / {algorithms[1]}; expected {expected}"
    for member in m.members:
        if member.changes_nothing:
            yield R.NOOP_MEMBER, f"{member.link_key}: old and new are identical"
    recomputed = document_digest(m.document())
    if recomputed != m.manifest_digest:
        yield R.DIGEST_MISMATCH, f"manifest_digest {m.manifest_digest}, recomputed {recomputed}"


def build_manifest(
    operation_id: str, approval: Approval, members: Sequence[RevalidationMember]
) -> RevalidationManifest:
    """The canonical manifest for `members` (sorted here), checked like any other."""
    document: dict[str, JsonValue] = {
        "format": MANIFEST_FORMAT,
        "operation_id": operation_id,
        "approval": approval.model_dump(mode="json"),
        "mapping_fingerprint_algorithm": MAPPING_FINGERPRINT_ALGORITHM,
        "body_fingerprint_algorithm": BODY_FINGERPRINT_ALGORITHM,
        "members": [m.model_dump(mode="json") for m in sorted(members, key=_by_key)],
    }
    document["manifest_digest"] = document_digest(document)
    return parse_manifest(document)


def _by_key(member: RevalidationMember) -> str:
    return member.link_key


# -- the full-row digest -------------------------------------------------------------


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
    return _members_digest(object_members(vars(row)))


# The digested document's other member ("algorithm" sorts before "row").
_ALGORITHM_MEMBER: Final = object_members({"algorithm": ROW_DIGEST_ALGORITHM})


def _members_digest(row_members: Mapping[str, str]) -> str:
    """`link_row_digest` of the row whose `object_members` these are."""
    document = {**_ALGORITHM_MEMBER, "row": member_text("row", join_members(row_members))}
    return sha256_hex(join_members(document).encode("utf-8"))


class RowDigests(NamedTuple):
    """A row's `link_row_digest` before and after a member's transition."""

    before: str
    after: str


def _row_digests(row: LinkRowState, member: RevalidationMember, operation_id: str) -> RowDigests:
    """The digests of `row` and of its after-state, which share every unmoved column's
    encoding (issue 16, P4: each member of a bulk manifest needs both)."""
    before = object_members(vars(row))
    after = {**before, **object_members(_moved(member, operation_id))}
    return RowDigests(_members_digest(before), _members_digest(after))


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


class RevalidationReceipt(_Value):
    """One `connector_link_revalidation_receipt` row (without its timestamp)."""

    operation_id: str
    link_key: str
    manifest_digest: str
    approval_digest: str
    mapping_fingerprint_algorithm: str
    body_fingerprint_algorithm: str
    old_mapping_fingerprint: str
    new_mapping_fingerprint: str
    old_body_fingerprint: str
    new_body_fingerprint: str
    old_pack_install_id: str
    new_pack_install_id: str
    previous_operation_id: str | None
    before_row_digest: str
    after_row_digest: str


def project_receipt(
    manifest: RevalidationManifest, member: RevalidationMember, before: LinkRowState
) -> RevalidationReceipt:
    """The receipt applying `member` to the row `before` writes."""
    return _receipt(manifest, member, before, _row_digests(before, member, manifest.operation_id))


def _receipt(
    manifest: RevalidationManifest,
    member: RevalidationMember,
    before: LinkRowState,
    digests: RowDigests,
) -> RevalidationReceipt:
    return RevalidationReceipt(
        operation_id=manifest.operation_id,
        link_key=member.link_key,
        manifest_digest=manifest.manifest_digest,
        approval_digest=manifest.approval_digest,
        mapping_fingerprint_algorithm=manifest.mapping_fingerprint_algorithm,
        body_fingerprint_algorithm=manifest.body_fingerprint_algorithm,
        old_mapping_fingerprint=member.old_mapping_fingerprint,
        new_mapping_fingerprint=member.new_mapping_fingerprint,
        old_body_fingerprint=member.old_body_fingerprint,
        new_body_fingerprint=member.new_body_fingerprint,
        old_pack_install_id=member.old_pack_install_id,
        new_pack_install_id=member.new_pack_install_id,
        previous_operation_id=before.last_mapping_revalidation_operation_id,
        before_row_digest=digests.before,
        after_row_digest=digests.after,
    )


class LockedMember(_Value):
    """What the caller read for one member while holding its link and occupancy locks."""

    link_key: str
    row: LinkRowState | None
    occupying_attempt_ids: tuple[str, ...] = ()
    # The receipt the row's current pointer names (None when the pointer is null).
    pointer_receipt: RevalidationReceipt | None = None


class ConflictReason(StrEnum):
    LINK_MISSING = "link_missing"
    LINK_NOT_FINALIZED = "link_not_finalized"
    STALE_PREIMAGE = "stale_preimage"
    POINTER_MISMATCH = "pointer_mismatch"
    RECEIPT_CHAIN_BROKEN = "receipt_chain_broken"
    ROW_DIGEST_MISMATCH = "row_digest_mismatch"
    OCCUPIED = "occupied"
    MIXED_STATE = "mixed_state"
    DIVERGENT_RECEIPT = "divergent_receipt"
    DIVERGENT_LINK = "divergent_link"
    CAS_LOST = "cas_lost"
    NOT_THE_INSTALLS_FINGERPRINTS = "not_the_installs_fingerprints"


class Conflict(_Value):
    link_key: str
    reason: ConflictReason
    detail: str


class Apply(_Value):
    kind: Literal["apply"] = "apply"
    receipts: tuple[RevalidationReceipt, ...]


class AlreadyApplied(_Value):
    kind: Literal["already_applied"] = "already_applied"
    receipts: tuple[RevalidationReceipt, ...]


class Rejected(_Value):
    kind: Literal["rejected"] = "rejected"
    conflicts: tuple[Conflict, ...] = Field(min_length=1)


Decision = Annotated[Apply | AlreadyApplied | Rejected, Field(discriminator="kind")]


class Judgement(NamedTuple):
    """One member judged as part of a new operation: its conflicts, or (none) its receipt."""

    conflicts: tuple[Conflict, ...]
    receipt: RevalidationReceipt | None


def judge_new_member(
    manifest: RevalidationManifest, member: RevalidationMember, lock: LockedMember
) -> Judgement:
    """Invariants 2-3 for one member of a new operation. The costly part of `decide` (the
    row digest and the projected receipt's), so a caller may judge each page of members
    as it is locked, while the next page's locks are taken (issue 16, P4)."""
    row = lock.row
    if row is None:
        missing = _conflict(member.link_key, ConflictReason.LINK_MISSING, "no link with this key")
        return Judgement((missing,), None)
    digests = _row_digests(row, member, manifest.operation_id)
    conflicts = tuple(_new_member_conflicts(member, lock, row, digests.before))
    if conflicts:
        return Judgement(conflicts, None)
    # No conflict: the row's digest is the member's expected one, checked just now.
    return Judgement((), _receipt(manifest, member, row, digests))


def decide(
    manifest: RevalidationManifest,
    locked: Sequence[LockedMember],
    receipts: Sequence[RevalidationReceipt],
    judged: Sequence[Judgement] | None = None,
) -> Decision:
    """Invariants 3-5. `receipts` are those already written under the operation id;
    `judged`, when given, is `judge_new_member` of each member, in the members' order."""
    assert [m.link_key for m in manifest.members] == [m.link_key for m in locked]
    pairs = list(zip(manifest.members, locked, strict=True))
    if receipts:
        return _verify_retry(manifest, pairs, receipts)
    if judged is None:
        judged = [judge_new_member(manifest, member, lock) for member, lock in pairs]
    assert len(judged) == len(pairs)
    conflicts = [c for judgement in judged for c in judgement.conflicts]
    if conflicts:
        return Rejected(conflicts=tuple(conflicts))
    return Apply(receipts=tuple(j.receipt for j in judged if j.receipt is not None))


def _conflict(key: str, reason: ConflictReason, detail: str) -> Conflict:
    return Conflict(link_key=key, reason=reason, detail=detail)


class InstallFingerprints(_Value):
    """What `new_pack_install_id` itself produces for a member's action slot."""

    mapping_fingerprint: str
    body_fingerprint: str


def decide_bound(
    manifest: RevalidationManifest,
    locked: Sequence[LockedMember],
    receipts: Sequence[RevalidationReceipt],
    produced: Mapping[str, InstallFingerprints | None],
    judged: Sequence[Judgement] | None = None,
) -> Decision:
    """`decide`, after binding every member's new fingerprints to its new install.

    A valid digest proves only that the file is self-consistent; the new values
    a receipt records must be the ones the named install produces for the link's
    action slot (`produced`, keyed by link key; None: the install has no such
    slot). Members whose link is missing are left to `decide`.
    """
    bound = [c for m, lock in zip(manifest.members, locked, strict=True)
             for c in _binding_conflicts(m, lock, produced.get(m.link_key))]  # fmt: skip
    if bound:
        return Rejected(conflicts=tuple(bound))
    return decide(manifest, locked, receipts, judged)


def _binding_conflicts(
    member: RevalidationMember, lock: LockedMember, produced: InstallFingerprints | None
) -> Iterator[Conflict]:
    if lock.row is None:
        return
    reason, key = ConflictReason.NOT_THE_INSTALLS_FINGERPRINTS, member.link_key
    install = member.new_pack_install_id
    if produced is None:
        yield _conflict(key, reason, f"install {install} has no action slot for this link")
        return
    if member.new_mapping_fingerprint != produced.mapping_fingerprint:
        yield _conflict(
            key, reason, f"new_mapping_fingerprint is not what install {install} produces"
        )
    if member.new_body_fingerprint != produced.body_fingerprint:
        yield _conflict(key, reason, f"new_body_fingerprint is not what install {install} produces")


def _new_member_conflicts(
    member: RevalidationMember, lock: LockedMember, row: LinkRowState, row_digest: str
) -> Iterator[Conflict]:
    """`lock`'s conflicts with `member` as a new operation; `row` is its (existing) row and
    `row_digest` that row's `link_row_digest`."""
    R, key = ConflictReason, member.link_key
    if row.status != LinkStatus.FINALIZED:
        yield _conflict(key, R.LINK_NOT_FINALIZED, f"link is {row.status}")
    current = (row.mapping_fingerprint, row.body_fingerprint, row.last_validated_pack_install_id)
    old = (member.old_mapping_fingerprint, member.old_body_fingerprint, member.old_pack_install_id)
    if current != old:
        yield _conflict(key, R.STALE_PREIMAGE, "fingerprints or install differ from old_*")
    pointer = row.last_mapping_revalidation_operation_id
    if pointer != member.expected_revalidation_operation_id:
        yield _conflict(key, R.POINTER_MISMATCH, f"current pointer {pointer!r}")
    yield from _chain_conflicts(row, lock.pointer_receipt)
    if row_digest != member.expected_row_digest:
        yield _conflict(
            key, R.ROW_DIGEST_MISMATCH, "the link changed since the manifest was planned"
        )
    if lock.occupying_attempt_ids:
        ids = ", ".join(lock.occupying_attempt_ids)
        yield _conflict(key, R.OCCUPIED, f"occupying attempt(s) {ids}")


def _chain_conflicts(row: LinkRowState, prior: RevalidationReceipt | None) -> Iterator[Conflict]:
    """The current fingerprints must be the ones the pointed-at receipt moved them to."""
    pointer = row.last_mapping_revalidation_operation_id
    if pointer is None:
        return
    reason = ConflictReason.RECEIPT_CHAIN_BROKEN
    if prior is None or prior.operation_id != pointer:
        yield _conflict(row.link_key, reason, f"no receipt for pointer {pointer!r}")
    elif (prior.new_mapping_fingerprint, prior.new_body_fingerprint) != (
        row.mapping_fingerprint,
        row.body_fingerprint,
    ):
        yield _conflict(row.link_key, reason, f"fingerprints differ from receipt {pointer!r}")


def _verify_retry(
    manifest: RevalidationManifest,
    pairs: list[tuple[RevalidationMember, LockedMember]],
    receipts: Sequence[RevalidationReceipt],
) -> AlreadyApplied | Rejected:
    """Invariant 5: every receipt and every link exactly as the operation left them."""
    stored = {r.link_key: r for r in receipts}
    members = {m.link_key for m, _ in pairs}
    conflicts = [
        _conflict(key, ConflictReason.MIXED_STATE, "receipt under this operation, not a member")
        for key in sorted(stored.keys() - members)
    ]
    for member, lock in pairs:
        conflicts.extend(_retry_conflicts(manifest, member, lock, stored.get(member.link_key)))
    if conflicts:
        return Rejected(conflicts=tuple(conflicts))
    return AlreadyApplied(receipts=tuple(stored[m.link_key] for m, _ in pairs))


def _retry_conflicts(
    manifest: RevalidationManifest,
    member: RevalidationMember,
    lock: LockedMember,
    receipt: RevalidationReceipt | None,
) -> Iterator[Conflict]:
    R, key, row = ConflictReason, member.link_key, lock.row
    if receipt is None:
        yield _conflict(key, R.MIXED_STATE, "other members carry this operation's receipt")
        return
    if row is None or row != after_state(row, member, manifest.operation_id):
        yield _conflict(key, R.DIVERGENT_LINK, "link is not at this operation's after-state")
        return
    projected = project_receipt(manifest, member, before_state(row, member))
    if projected.before_row_digest != member.expected_row_digest:
        yield _conflict(key, R.DIVERGENT_LINK, "link changed since this operation applied")
    elif projected != receipt:
        yield _conflict(key, R.DIVERGENT_RECEIPT, "stored receipt differs from this manifest")


class RevalidationStatus(StrEnum):
    VALIDATED = "validated"  # dry run: would apply
    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    REJECTED = "rejected"


class RevalidationResult(_Value):
    """What `validate`/`apply` report: projected or written receipts, or the conflicts."""

    status: RevalidationStatus
    operation_id: str
    manifest_digest: str
    receipts: tuple[RevalidationReceipt, ...] = ()
    conflicts: tuple[Conflict, ...] = ()


def result_of(
    manifest: RevalidationManifest, decision: Decision, *, applied: bool
) -> RevalidationResult:
    """The report of `decision`; `applied` says whether its receipts were written."""
    status: RevalidationStatus
    receipts: tuple[RevalidationReceipt, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    match decision:
        case Apply():
            status = RevalidationStatus.APPLIED if applied else RevalidationStatus.VALIDATED
            receipts = decision.receipts
        case AlreadyApplied():
            status, receipts = RevalidationStatus.ALREADY_APPLIED, decision.receipts
        case Rejected():
            status, conflicts = RevalidationStatus.REJECTED, decision.conflicts
        case _:
            assert_never(decision)
    return RevalidationResult(
        status=status,
        operation_id=manifest.operation_id,
        manifest_digest=manifest.manifest_digest,
        receipts=receipts,
        conflicts=conflicts,
    )
