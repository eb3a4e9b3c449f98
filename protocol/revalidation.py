"""Bulk finalized-link mapping revalidation (SPEC §9 REV-1..3): receipts and the decision.

Rules 3-6 of the seed's "L0 Transaction Invariants" (1 lives in
`protocol.revalidation_manifest`, 2 in `protocol.link_row`):

3-5. `decide` turns the locked rows, their occupying attempts and the receipts
   already written for the operation into `Apply`, `AlreadyApplied` or
   `Rejected`. A new operation applies only if every member is exactly as
   planned and unoccupied; a retry is verify-only and any mixed or divergent
   state fails closed. One conflict anywhere rejects the whole manifest.
6. Validation and application share `decide`; only the caller's writes differ.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Literal, NamedTuple, assert_never

from pydantic import BaseModel, ConfigDict, Field

from protocol.link_row import (
    LinkRowState,
    RowDigests,
    after_state,
    before_state,
    link_row_digest,
    row_digests,
)
from protocol.revalidation_manifest import ManifestHead, RevalidationManifest, RevalidationMember
from protocol.states import LinkStatus
from protocol.trusted import trusted


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# What a receipt carries of its manifest: a whole (JSON document) manifest, or the head
# of one read a page at a time (protocol.revalidation_lines).
Manifest = ManifestHead | RevalidationManifest


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
    manifest: Manifest, member: RevalidationMember, before: LinkRowState
) -> RevalidationReceipt:
    """The receipt applying `member` to the row `before` writes."""
    return _receipt(manifest, member, before, row_digests(before, member, manifest.operation_id))


def _receipt(
    manifest: Manifest,
    member: RevalidationMember,
    before: LinkRowState,
    digests: RowDigests,
) -> RevalidationReceipt:
    # Every value is a string (or the pointer's None) of a model made before: one receipt
    # per member of a bulk run, so it is not validated again (protocol.trusted; NF-7's scale).
    return trusted(RevalidationReceipt, dict(
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
    ))  # fmt: skip


class LockedMember(NamedTuple):
    """What the caller read for one member while holding its link and occupancy locks.

    A tuple, not a model: its parts are models already, and a bulk run makes one per
    member (NF-7's scale)."""

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
    OTHER_OWNER = "other_owner"  # the link is not of the manifest's connector_owner_key


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
    manifest: Manifest, member: RevalidationMember, lock: LockedMember, *, project: bool = True
) -> Judgement:
    """Invariants 2-3 for one member of a new operation. The costly part of `decide` (the
    row digest and the projected receipt's), so a caller may judge each page of members
    as it is locked, while the next page's locks are taken (bench P4).

    `project=False` judges the member alike but leaves its receipt (and the after-state
    digest only a receipt holds) unmade: a member without conflicts is then
    `Judgement((), None)`. For a dry run past the receipts it reports (bounded memory, NF-7)."""
    row = lock.row
    if row is None:
        missing = _conflict(member.link_key, ConflictReason.LINK_MISSING, "no link with this key")
        return Judgement((missing,), None)
    if not project:
        unmade = tuple(_new_member_conflicts(member, lock, row, link_row_digest(row)))
        return Judgement(unmade, None)
    digests = row_digests(row, member, manifest.operation_id)
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
             for c in binding_conflicts(m, lock, produced.get(m.link_key))]  # fmt: skip
    if bound:
        return Rejected(conflicts=tuple(bound))
    return decide(manifest, locked, receipts, judged)


def binding_conflicts(
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
        conflicts.extend(retry_conflicts(manifest, member, lock, stored.get(member.link_key)))
    if conflicts:
        return Rejected(conflicts=tuple(conflicts))
    return AlreadyApplied(receipts=tuple(stored[m.link_key] for m, _ in pairs))


def retry_conflicts(
    manifest: Manifest,
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
    # How many there were in all: a manifest read a page at a time keeps only the first
    # SHOWN of each here (bounded memory at any size; every receipt is in its table).
    receipt_count: int = 0
    conflict_count: int = 0


SHOWN = 1000


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
        receipt_count=len(receipts),
        conflict_count=len(conflicts),
    )
