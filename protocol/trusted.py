"""Models made from values already proven to be theirs, without validating them again.

A bulk revalidation makes models per member — the link row read back, the receipt
written — and at a million members pydantic's validation of those was a tenth of the
run's CPU (NF-7, bench P4). Where the values cannot be other than the model's — columns
selected with the model's types (db/revalidation.link_states_of), strings copied from
other models (protocol/revalidation._receipt) — `trusted` makes the instance directly.
It is what `model_validate` returns for such values, and the tests hold each caller's
model to that (tests/unit/test_trusted.py, tests/db/test_revalidation_stream.py);
anything read from outside (a manifest line, a request) still goes through pydantic.

Why not `model_construct`: it is pydantic's own unvalidated path, but it walks every
field's default in Python and costs twice what validation does (20 µs against 10 µs
for a link row here); this sets the four attributes `model_construct` sets, 3 µs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_new = object.__new__
_set = object.__setattr__


def trusted(model: type[M], values: dict[str, Any]) -> M:
    """An instance of `model` holding `values` (every field, no other key) as given,
    unvalidated; `values` becomes the instance's own and must not be used again."""
    instance: M = _new(model)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", set(values))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance
