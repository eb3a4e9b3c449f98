"""protocol.trusted: a model made without validation is the validated model (issue 34).

Each model the bulk revalidation makes with `trusted` is compared here with
`model_validate` of the same values: equal, same fields set, same hash and dump, and
still frozen. (The member made from a matched manifest line is compared with the parsed
one in test_revalidation_lines, on every edited line too.)
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from protocol.link_row import LinkRowState
from protocol.revalidation import RevalidationReceipt, project_receipt
from protocol.trusted import trusted
from tests.unit.test_revalidation_manifest import manifest, row


def same(made: BaseModel, validated: BaseModel) -> None:
    assert type(made) is type(validated)
    assert made == validated and vars(made) == vars(validated)
    assert made.model_fields_set == validated.model_fields_set
    assert made.model_dump(mode="json") == validated.model_dump(mode="json")
    assert repr(made) == repr(validated)
    try:
        expected: int | None = hash(validated)
    except TypeError:  # a JSON snapshot (a dict) makes a link row unhashable either way
        expected = None
    if expected is None:
        with pytest.raises(TypeError):
            hash(made)
    else:
        assert hash(made) == expected
    field = next(iter(type(made).model_fields))
    with pytest.raises(ValidationError):  # frozen as the validated model is
        setattr(made, field, "changed")


@pytest.mark.parametrize("pointer", [None, "op-0"])
def test_a_trusted_link_row_is_the_validated_row(pointer: str | None) -> None:
    values: dict[str, Any] = row(3, last_mapping_revalidation_operation_id=pointer).model_dump()
    validated = LinkRowState.model_validate(values)
    same(trusted(LinkRowState, dict(values)), validated)


def test_a_projected_receipt_is_the_validated_receipt() -> None:
    before = row(4)
    plan = manifest(before)
    receipt = project_receipt(plan, plan.members[0], before)
    same(receipt, RevalidationReceipt.model_validate(receipt.model_dump()))
    assert receipt.previous_operation_id is None and receipt.link_key == before.link_key


def test_trusted_keeps_the_values_it_is_given() -> None:
    """No copy and no coercion: what the caller proved is what the model holds."""
    values: dict[str, Any] = row(5).model_dump()
    made = trusted(LinkRowState, values)
    assert vars(made) is values
