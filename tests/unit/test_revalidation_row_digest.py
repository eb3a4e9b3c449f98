"""The row digests' fast forms (issue 16, P4) are the digests of the models' JSON dumps."""

from __future__ import annotations

import pytest

from protocol.canonical import digest
from protocol.link_row import ROW_DIGEST_ALGORITHM, LinkRowState, after_state, link_row_digest
from protocol.revalidation import project_receipt
from tests.unit.test_revalidation_manifest import manifest, row

SNAPSHOTS = [
    None,
    {"retryPolicy": {"maxAttempts": 5, "backoffCoefficient": 2.0}, "idempotency": None},
    {"headers": ["Idempotency-Key", "If-Match"], "rateLimit": {"requests": 500}, "ü": "é"},
]


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
@pytest.mark.parametrize("pointer", [None, "op-1"])
def test_the_row_digest_equals_the_digest_of_the_models_json_dump(
    snapshot: object, pointer: str | None
) -> None:
    r: LinkRowState = row(
        3, profile_snapshot=snapshot, last_mapping_revalidation_operation_id=pointer
    )
    dumped = digest({"algorithm": ROW_DIGEST_ALGORITHM, "row": r.model_dump(mode="json")})
    assert link_row_digest(r) == dumped


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
def test_a_receipts_after_digest_is_the_digest_of_the_after_state(snapshot: object) -> None:
    before: LinkRowState = row(3, profile_snapshot=snapshot)
    m = manifest(before)
    receipt = project_receipt(m, m.members[0], before)
    after = after_state(before, m.members[0], m.operation_id)
    dumped = digest({"algorithm": ROW_DIGEST_ALGORITHM, "row": after.model_dump(mode="json")})
    assert receipt.after_row_digest == dumped
    assert receipt.before_row_digest == link_row_digest(before)
