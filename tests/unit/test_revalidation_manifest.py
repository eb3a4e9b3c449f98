"""SPEC §9 (REV-1, REV-2) pure core: manifest canonicality, the full-row digest, `decide`.
(REV-3, what revalidation may import, is test_revalidation_isolation.py.)"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from protocol.link_row import MOVED_COLUMNS, LinkRowState, after_state, link_row_digest, plan_member
from protocol.revalidation import (
    AlreadyApplied,
    Apply,
    ConflictReason,
    LockedMember,
    Rejected,
    decide,
    project_receipt,
)
from protocol.revalidation_manifest import (
    Approval,
    ManifestRejected,
    ManifestRejectReason,
    RevalidationManifest,
    build_manifest,
    document_digest,
    parse_manifest,
)

R = ManifestRejectReason
C = ConflictReason
OLD_PACK = "00000000-0000-4000-8000-000000000001"
NEW_PACK = "0000000a-0000-4000-8000-00000000000b"
APPROVAL = Approval(approved_by="alice", approval_reference="CHG-1", reason="mapping v2")
Doc = dict[str, Any]


def hex64(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def key(n: int) -> str:
    return f"lk1_{n:064x}"


def row(n: int = 1, **changes: object) -> LinkRowState:
    values: dict[str, object] = {
        "link_key": key(n), "status": "finalized", "connector_owner_key": "owner",
        "action_slot_id": "push-contact", "action_type": "PushToConnector",
        "source_object": "Contact", "source_record_id": f"c-{n}",
        "destination_slot_id": "remote-contacts", "created_pack_install_id": OLD_PACK,
        "remote_id": f"r-{n}", "remote_scope": "portal", "connector_namespace": "demo",
        "flow_developer_name": "Contact_Sync", "flow_action_name": "Push", "flow_version": "1",
        "target_object": "contacts", "profile_name": "main",
        "last_validated_pack_install_id": OLD_PACK, "credential_ref": "env:T",
        "credential_generation_hash": "cg", "endpoint_class": "rest",
        "endpoint_binding_hash": "eb", "retry_policy_hash": "rp", "profile_payload_hash": "pp",
        "profile_snapshot": {"profile_name": "main", "retry": [1, 2.5]},
        "create_path_template": "/c", "update_path_template": "/c/{remoteId}",
        "response_id_path": "$.id", "mirror_source_object": "Contact",
        "mirror_remote_id_field": "rid", "mirror_provenance_field": "prov",
        "mapping_fingerprint": hex64("m1"), "body_fingerprint": hex64("b1"),
        "last_mapping_revalidation_operation_id": None,
    }  # fmt: skip
    return LinkRowState.model_validate({**values, **changes})


def manifest(
    *rows: LinkRowState, op: str = "op-1", to: str = "2", **approval: str
) -> RevalidationManifest:
    members = [plan_member(r, hex64(f"m{to}"), hex64(f"b{to}"), NEW_PACK) for r in rows]
    return build_manifest(op, APPROVAL.model_copy(update=approval), members)


def redigest(doc: Doc) -> Doc:
    """Re-sign an edited document, so only the edit itself can be rejected."""
    return {**doc, "manifest_digest": document_digest(doc)}


def rejected(doc: object) -> ManifestRejectReason:
    with pytest.raises(ManifestRejected) as caught:
        parse_manifest(doc)
    return caught.value.reason


# -- invariant 1: the canonical manifest --------------------------------------------


def test_a_planned_manifest_round_trips_through_its_document() -> None:
    m = manifest(row(2), row(1))
    assert [x.link_key for x in m.members] == [key(1), key(2)]
    assert parse_manifest(m.document()) == m


def test_a_tampered_member_fails_the_recomputed_digest() -> None:
    doc: Doc = manifest(row(1)).document()
    doc["members"][0]["new_mapping_fingerprint"] = hex64("forged")
    assert rejected(doc) is R.DIGEST_MISMATCH


def test_the_digest_covers_the_approval() -> None:
    doc: Doc = manifest(row(1)).document()
    doc["approval"]["reason"] = "something else"
    assert rejected(doc) is R.DIGEST_MISMATCH


def test_duplicate_link_keys_are_rejected() -> None:
    doc: Doc = manifest(row(1)).document()
    doc["members"] = [doc["members"][0], doc["members"][0]]
    assert rejected(redigest(doc)) is R.DUPLICATE_LINK_KEY


def test_members_out_of_link_key_order_are_rejected() -> None:
    doc: Doc = manifest(row(1), row(2)).document()
    doc["members"] = list(reversed(doc["members"]))
    assert rejected(redigest(doc)) is R.UNSORTED_MEMBERS


@pytest.mark.parametrize("field", ["approved_by", "approval_reference", "reason"])
@pytest.mark.parametrize("value", ["", "   "])
def test_empty_approval_fields_are_rejected(field: str, value: str) -> None:
    doc: Doc = manifest(row(1)).document()
    doc["approval"][field] = value
    assert rejected(redigest(doc)) is R.EMPTY_APPROVAL


def _set_member(field: str, value: str) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["members"][0][field] = value

    return edit


def _set_approval(field: str, value: str) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["approval"][field] = value

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.update(operation_id=" op-1"), id="operation-id-padded"),
        pytest.param(_set_approval("approved_by", "alice "), id="approver-padded"),
        pytest.param(_set_approval("reason", "line\nbreak"), id="reason-control-char"),
        pytest.param(_set_approval("approved_by", "Zoe\u0301"), id="approver-not-nfc"),
        pytest.param(_set_member("new_mapping_fingerprint", hex64("x").upper()), id="hex-case"),
        pytest.param(_set_member("new_pack_install_id", NEW_PACK.upper()), id="uuid-case"),
        pytest.param(_set_member("link_key", key(1) + " "), id="link-key-padded"),
        # The shapes are anchored at the very end: no trailing newline slips through.
        pytest.param(_set_member("expected_row_digest", hex64("x") + "\n"), id="hex-newline"),
        pytest.param(lambda d: d.update(operation_id="op-1\n"), id="operation-id-newline"),
        pytest.param(_set_member("old_pack_install_id", "x" + NEW_PACK), id="uuid-prefixed"),
        pytest.param(lambda d: d.update(body_fingerprint_algorithm=" v1"), id="algorithm"),
    ],
)
def test_non_canonical_authority_strings_are_rejected(edit: Callable[[Doc], None]) -> None:
    doc: Doc = manifest(row(1)).document()
    edit(doc)
    assert rejected(redigest(doc)) is R.NON_CANONICAL_STRING


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        pytest.param(lambda d: d.update(members=[]), R.NO_MEMBERS, id="no-members"),
        pytest.param(lambda d: d.update(extra=1), R.INVALID_SHAPE, id="unknown-field"),
        pytest.param(lambda d: d.pop("approval"), R.INVALID_SHAPE, id="no-approval"),
        pytest.param(
            lambda d: d.update(mapping_fingerprint_algorithm="md5"),
            R.UNSUPPORTED_ALGORITHM,
            id="algorithm",
        ),
        pytest.param(
            lambda d: d["members"][0].pop("expected_revalidation_operation_id"),
            R.INVALID_SHAPE,
            id="pointer-omitted",
        ),
    ],
)
def test_malformed_manifests_are_rejected(
    edit: Callable[[Doc], None], reason: ManifestRejectReason
) -> None:
    doc: Doc = manifest(row(1)).document()
    edit(doc)
    assert rejected(redigest(doc)) is reason


def test_a_member_that_moves_nothing_is_rejected() -> None:
    r = row(1)
    noop = plan_member(r, r.mapping_fingerprint, r.body_fingerprint, OLD_PACK)
    with pytest.raises(ManifestRejected) as caught:
        build_manifest("op-1", APPROVAL, [noop])
    assert caught.value.reason is R.NOOP_MEMBER


# -- invariant 2: the full-row digest -------------------------------------------------


@pytest.mark.parametrize("field", sorted(LinkRowState.model_fields))
def test_every_row_digest_column_changes_the_digest(field: str) -> None:
    base = row(1)
    value = getattr(base, field)
    changed = {"x": 1} if isinstance(value, dict) else ("x" if value is None else f"{value}x")
    assert link_row_digest(base.model_copy(update={field: changed})) != link_row_digest(base)


def test_the_row_digest_ignores_key_order_inside_the_profile_snapshot() -> None:
    shuffled = row(1, profile_snapshot={"retry": [1, 2.5], "profile_name": "main"})
    assert link_row_digest(shuffled) == link_row_digest(row(1))


# -- invariants 3-5: the decision -------------------------------------------------------


def locked(r: LinkRowState | None, n: int = 1, **kw: Any) -> LockedMember:
    return LockedMember(link_key=r.link_key if r else key(n), row=r, **kw)


def conflicts(decision: object) -> list[tuple[str, ConflictReason]]:
    assert isinstance(decision, Rejected), decision
    return [(c.link_key, c.reason) for c in decision.conflicts]


def test_an_unchanged_unoccupied_manifest_applies_with_one_receipt_per_member() -> None:
    rows = [row(1), row(2)]
    m = manifest(*rows)
    decision = decide(m, [locked(r) for r in rows], [])
    assert isinstance(decision, Apply)
    assert [r.link_key for r in decision.receipts] == [key(1), key(2)]
    first = decision.receipts[0]
    assert first.before_row_digest == m.members[0].expected_row_digest
    assert (first.old_mapping_fingerprint, first.new_mapping_fingerprint) == (
        hex64("m1"),
        hex64("m2"),
    )
    assert first.previous_operation_id is None and first.approval_digest == m.approval_digest


def test_after_state_moves_exactly_the_moved_columns() -> None:
    before = row(1)
    after = after_state(before, manifest(before).members[0], "op-1")
    assert {f for f in LinkRowState.model_fields if getattr(after, f) != getattr(before, f)} == (
        MOVED_COLUMNS
    )


@pytest.mark.parametrize(
    ("lock", "reasons"),
    [
        pytest.param(locked(None, 2), [C.LINK_MISSING], id="missing"),
        pytest.param(
            locked(row(2, status="suspended_drift")),
            [C.LINK_NOT_FINALIZED, C.ROW_DIGEST_MISMATCH],
            id="suspended",
        ),
        pytest.param(
            locked(row(2, mapping_fingerprint=hex64("other"))),
            [C.STALE_PREIMAGE, C.ROW_DIGEST_MISMATCH],
            id="fingerprint-moved",
        ),
        pytest.param(
            locked(row(2, update_path_template="/v2/{remoteId}")),
            [C.ROW_DIGEST_MISMATCH],
            id="path-snapshot-moved",
        ),
        pytest.param(locked(row(2), occupying_attempt_ids=("a-1",)), [C.OCCUPIED], id="occupied"),
    ],
)
def test_one_conflicting_member_rejects_the_whole_manifest(
    lock: LockedMember, reasons: list[ConflictReason]
) -> None:
    m = manifest(row(1), row(2))
    assert conflicts(decide(m, [locked(row(1)), lock], [])) == [(key(2), r) for r in reasons]


def _applied(m: RevalidationManifest, rows: list[LinkRowState]) -> list[LinkRowState]:
    return [
        after_state(r, member, m.operation_id) for r, member in zip(rows, m.members, strict=True)
    ]


def test_a_pointer_needs_its_receipt_and_that_receipt_must_match_the_fingerprints() -> None:
    first = manifest(row(1), op="op-1")
    receipt = project_receipt(first, first.members[0], row(1))
    moved = _applied(first, [row(1)])[0]
    second = manifest(moved, op="op-2", to="3")
    assert isinstance(decide(second, [locked(moved, pointer_receipt=receipt)], []), Apply)
    assert conflicts(decide(second, [locked(moved)], [])) == [(key(1), C.RECEIPT_CHAIN_BROKEN)]
    forged = receipt.model_copy(update={"new_body_fingerprint": hex64("forged")})
    chain = decide(second, [locked(moved, pointer_receipt=forged)], [])
    assert conflicts(chain) == [(key(1), C.RECEIPT_CHAIN_BROKEN)]


def test_a_retry_of_an_applied_operation_is_already_applied() -> None:
    rows = [row(1), row(2)]
    m = manifest(*rows)
    applied = decide(m, [locked(r) for r in rows], [])
    assert isinstance(applied, Apply)
    now = _applied(m, rows)
    # Verify-only: occupancy does not matter, nothing would be written.
    retry = decide(
        m, [locked(now[0], occupying_attempt_ids=("a",)), locked(now[1])], applied.receipts
    )
    assert isinstance(retry, AlreadyApplied) and retry.receipts == applied.receipts


def test_a_retry_with_receipts_on_only_some_members_fails_closed() -> None:
    applied = decide(manifest(row(1)), [locked(row(1))], [])
    assert isinstance(applied, Apply)
    now = _applied(manifest(row(1)), [row(1)])[0]
    wider = manifest(row(1), row(2))  # same operation id, one more member
    retry = decide(wider, [locked(now), locked(row(2))], applied.receipts)
    assert (key(2), C.MIXED_STATE) in conflicts(retry)


def test_a_retry_after_a_member_moved_on_fails_closed() -> None:
    rows = [row(1), row(2)]
    m = manifest(*rows)
    applied = decide(m, [locked(r) for r in rows], [])
    assert isinstance(applied, Apply)
    now = _applied(m, rows)
    later = now[1].model_copy(update={"mapping_fingerprint": hex64("m3")})
    assert conflicts(decide(m, [locked(now[0]), locked(later)], applied.receipts)) == [
        (key(2), C.DIVERGENT_LINK)
    ]
    edited = now[1].model_copy(update={"remote_scope": "elsewhere"})
    assert conflicts(decide(m, [locked(now[0]), locked(edited)], applied.receipts)) == [
        (key(2), C.DIVERGENT_LINK)
    ]


def test_a_retry_whose_receipt_differs_from_the_manifest_fails_closed() -> None:
    m = manifest(row(1))
    applied = decide(m, [locked(row(1))], [])
    assert isinstance(applied, Apply)
    other = manifest(row(1), approved_by="mallory")  # same op id, another approval
    now = _applied(m, [row(1)])
    assert conflicts(decide(other, [locked(now[0])], applied.receipts)) == [
        (key(1), C.DIVERGENT_RECEIPT)
    ]
