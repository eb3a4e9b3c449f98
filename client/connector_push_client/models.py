"""The save API's wire shapes (SPEC API-1): the one home of its routes, fields and aliases.

Pure (stdlib and pydantic), so the service's `protocol.save_api` builds on these same
classes: it adds what only the server knows (the closed set of reject reasons) and
checks ID-2's identity parts with `protocol.identity`'s own rule, and the OpenAPI
document is generated from its refinements.

Requests forbid unknown fields (a typo fails here, not at the server), and refuse
here every value the server answers with a 400 whatever its policy says: a `SaveIn`, a
`SaveBatchIn` or an idempotency key that passes these models is one the server takes
(only its policy's `max_batch` below 1000 and `body_limit` are its own to check). Answers
ignore unknown fields, so this client keeps working when the server adds an optional one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator

SAVE_PATH: Final = "/v1/saves"
BATCH_PATH: Final = "/v1/saves/batch"
# The most saves any server takes in one batch: the ceiling of its policy's `max_batch`.
MAX_BATCH: Final = 1000


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


Part = Annotated[str, Field(max_length=256, strict=True)]

# How a refused part is named in the message, as the server's 400 names it.
_PART_NAMES: Final = {
    "owner_key": "ownerKey",
    "action_slot": "slot id",
    "destination_slot": "slot id",
    "source_object": "sourceObject",
    "record_id": "recordId",
    "user_id": "value",
    "save_id": "value",
}
# Control characters, and lone surrogates (which UTF-8 cannot encode); an ASCII value,
# nearly every id, is searched by one regex instead of a category lookup per character.
_REFUSED_CATEGORIES: Final = frozenset({"Cc", "Cs"})
_ASCII_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def _has_control_character(value: str) -> bool:
    if value.isascii():
        return _ASCII_CONTROL.search(value) is not None
    return any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in value)


def check_part(name: str, value: str) -> str:
    """ID-2's rule for one part of a save, the server's (`protocol.identity`): not empty,
    no surrounding whitespace (`str.strip`'s, Unicode's included), no control character."""
    if not value:
        raise ValueError(f"{name}: must not be empty")
    if value != value.strip():
        raise ValueError(f"{name}: must not have leading or trailing whitespace")
    if _has_control_character(value):
        raise ValueError(f"{name}: must not contain control characters")
    return value


class SaveIn(_Request):
    """One reported save, as the CRM sends it (the fields of WF-2's client call)."""

    owner_key: Part = Field(alias="ownerKey", description="ConnectorOwnerKey")
    action_slot: Part = Field(alias="actionSlot", description="ActionSlotId")
    destination_slot: Part = Field(alias="destinationSlot", description="DestinationSlotId")
    source_object: Part = Field(alias="sourceObject")
    record_id: Part = Field(alias="recordId", description="the saved record's id")
    user_id: Part | None = Field(default=None, alias="userId", description="originating user id")
    save_id: Part | None = Field(
        default=None, alias="saveId", description="the CRM's id for this save (traced only)"
    )

    # The service's refinement (`protocol.save_api.SaveIn`) overrides this validator by
    # its name with `protocol.identity.check_part`: the same rule and messages, checked
    # once; tests/unit/test_client_refusals.py holds the two equal.
    @field_validator(*_PART_NAMES)
    @classmethod
    def _identity_part(cls, value: str | None, info: ValidationInfo) -> str | None:
        assert info.field_name is not None
        return None if value is None else check_part(_PART_NAMES[info.field_name], value)


class SaveBatchIn(_Request):
    saves: Annotated[Sequence[SaveIn], Field(min_length=1, max_length=MAX_BATCH)]


# The `Idempotency-Key` header: 1 to 255 printable ASCII characters, as the server takes
# it. The first and last are not spaces either: HTTP drops a header value's surrounding
# whitespace, so the server would see another key than the one given, or none.
IdempotencyKey = Annotated[
    str, Field(strict=True, pattern=r"^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$")
]
_IDEMPOTENCY_KEY: Final[TypeAdapter[str]] = TypeAdapter(IdempotencyKey)


def check_idempotency_key(key: str) -> str:
    """`key` unchanged, or a pydantic `ValidationError` for a key the server refuses."""
    return _IDEMPOTENCY_KEY.validate_python(key)


DecisionKind = Literal[
    "create_reserved",
    "deferred_association_reserved",
    "patch_queued",
    "observed_active_attempt",
    "rejected",
]
WakeKind = Literal["signalled", "deferred", "not_needed"]


class SaveResult(_Answer):
    """The admission decision for one save, committed before this answer was sent."""

    decision: DecisionKind
    link_key: str = Field(alias="linkKey")
    workflow_id: str = Field(alias="workflowId")
    # One of the server's reject reasons; a string here, so a reason added later parses.
    reason: str | None = None
    detail: str | None = None
    attempt_id: str | None = Field(default=None, alias="attemptId")
    remote_id: str | None = Field(default=None, alias="remoteId")
    waiting_on: tuple[str, ...] | None = Field(default=None, alias="waitingOn")
    # Only on the first answer: whether the workflow was woken (the relay covers deferral).
    wake: WakeKind | None = None


class SaveAnswer(_Answer):
    result: SaveResult
    replayed: bool = False
    warnings: tuple[str, ...] = ()


class BatchAnswer(_Answer):
    results: tuple[SaveResult, ...]
    replayed: bool = False
    warnings: tuple[str, ...] = ()


class FieldProblem(_Answer):
    path: str
    message: str


class ErrorAnswer(_Answer):
    error: str
    fields: tuple[FieldProblem, ...] = ()
