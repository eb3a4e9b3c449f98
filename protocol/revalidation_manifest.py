"""The bulk mapping-revalidation manifest (SPEC §9 REV-1): its canonical document.

Rule 1 of the seed's "L0 Transaction Invariants" (the rest live in
`protocol.link_row` and `protocol.revalidation`): a manifest is accepted only as
its own canonical document: strict shape, members strictly sorted by link key,
every authority string canonical, a complete approval, known fingerprint
algorithms, and a `manifest_digest` equal to the digest recomputed here.
`parse_manifest` decides all of it before anyone opens a transaction.
"""

from __future__ import annotations

import operator
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Final, Literal

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

from protocol.canonical import digest

MANIFEST_FORMAT: Final = "connector-push/mapping-revalidation/v1"
# The algorithms behind protocol/snapshots.py mapping_fingerprint / body_fingerprint.
MAPPING_FINGERPRINT_ALGORITHM: Final = "sha256-canonical-json:mappings+associations:v1"
BODY_FINGERPRINT_ALGORITHM: Final = "sha256-canonical-json:envelope+properties:v1"


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
# Python callback per field: a 100,000-member manifest has 800,000 of them (bench P4).
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
        values = vars(self)
        unchanged: bool = _olds(values) == _news(values)
        return unchanged


# The fields a member moves, old and new in the same order: it changes nothing when each
# old value equals its new one (compared with one `itemgetter` call a side, per member).
MOVED_OLD: Final = ("old_mapping_fingerprint", "old_body_fingerprint", "old_pack_install_id")
MOVED_NEW: Final = ("new_mapping_fingerprint", "new_body_fingerprint", "new_pack_install_id")
_olds: Final = operator.itemgetter(*MOVED_OLD)
_news: Final = operator.itemgetter(*MOVED_NEW)


class ManifestHead(_Strict):
    """A checked manifest without its members: what its receipts carry of it. A JSON Lines
    manifest (protocol.revalidation_lines) also names the one owner key its links must
    belong to (`connector_owner_key`); a JSON document leaves it to its members' links."""

    operation_id: str
    approval: Approval
    mapping_fingerprint_algorithm: str
    body_fingerprint_algorithm: str
    manifest_digest: str
    member_count: int
    connector_owner_key: str | None = None

    @cached_property
    def approval_digest(self) -> str:
        return digest(self.approval.model_dump(mode="json"))


class RevalidationManifest(_Strict):
    format: Literal["connector-push/mapping-revalidation/v1"]
    operation_id: OperationId
    approval: Approval
    mapping_fingerprint_algorithm: Text
    body_fingerprint_algorithm: Text
    # A JSON array; the members themselves stay strict.
    members: tuple[RevalidationMember, ...] = Field(strict=False)
    manifest_digest: Hex64

    @cached_property  # once per manifest, not once per receipt (bench P4)
    def approval_digest(self) -> str:
        return digest(self.approval.model_dump(mode="json"))

    @cached_property
    def head(self) -> ManifestHead:
        """What a receipt needs of the manifest, as a JSON Lines manifest gives it too."""
        return ManifestHead(
            operation_id=self.operation_id,
            approval=self.approval,
            mapping_fingerprint_algorithm=self.mapping_fingerprint_algorithm,
            body_fingerprint_algorithm=self.body_fingerprint_algorithm,
            manifest_digest=self.manifest_digest,
            member_count=len(self.members),
        )

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
