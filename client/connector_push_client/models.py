"""The save API's wire shapes (SPEC API-1): the one home of its routes, fields and aliases.

Pure (stdlib and pydantic), so the service's `protocol.save_api` builds on these same
classes: it adds the rules only the server applies (ID-2's identity parts, the closed
set of reject reasons), and the OpenAPI document is generated from its refinements.

Requests forbid unknown fields (a typo fails here, not at the server). Answers ignore
them, so this client keeps working when the server adds an optional field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SAVE_PATH: Final = "/v1/saves"
BATCH_PATH: Final = "/v1/saves/batch"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


Part = Annotated[str, Field(max_length=256, strict=True)]


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


class SaveBatchIn(_Request):
    saves: Annotated[Sequence[SaveIn], Field(min_length=1)]


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
