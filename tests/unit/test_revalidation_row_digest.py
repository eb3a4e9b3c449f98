"""The row digest's fast form (issue 16, P4) is the digest of the model's JSON dump."""

from __future__ import annotations

import pytest

from protocol.canonical import digest
from protocol.revalidation import ROW_DIGEST_ALGORITHM, LinkRowState, link_row_digest
from tests.unit.test_revalidation_manifest import row

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
