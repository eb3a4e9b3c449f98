"""The HTTP save API's contract (SPEC API-1, WF-2): policy, request and answer models.

Rules kept in this module:
1. A request that passes these models is storable and has a valid link identity:
   bad input is a 400 naming the field, before anything is written.
2. The answer for one save is a pure function of the request and its admission
   decision (`answer_for`), so a stored answer replays byte-for-byte in meaning.
3. Client keys appear here only as the *name* of the environment variable holding them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Final, Literal, Self, assert_never

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from protocol.admission import (
    AdmissionDecision,
    CreateReserved,
    DeferredAssociationReserved,
    ObservedActiveAttempt,
    PatchQueued,
    Rejected,
    SaveRequest,
)
from protocol.errors import RejectReason
from protocol.identity import check_part, link_key, link_workflow_id

SAVE_PATH: Final = "/v1/saves"
BATCH_PATH: Final = "/v1/saves/batch"
OPENAPI_PATH: Final = "/openapi.json"
_ENV_PATTERN: Final = r"^[A-Z_][A-Z0-9_]{0,127}$"
_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- policy (a section of the ingress policy file) ----------------------------------


class SaveApiClient(_Strict):
    """One calling CRM: its name (the idempotency scope) and where its bearer key is."""

    name: Annotated[str, Field(pattern=_NAME_PATTERN)]
    key_env: Annotated[str, Field(pattern=_ENV_PATTERN)]


class SaveApiPolicy(_Strict):
    clients: Annotated[tuple[SaveApiClient, ...], Field(min_length=1)]
    max_batch: Annotated[int, Field(gt=0, le=1000)] = 100
    body_limit: Annotated[int, Field(gt=0, le=16 * 1024 * 1024)] = 1024 * 1024
    # Body read, validation and the admission transaction; the wake-up is not in it.
    deadline_ms: Annotated[int, Field(gt=0, le=30_000)] = 3000
    # How long the answer waits for signal-with-starts before calling them deferred.
    wake_timeout_ms: Annotated[int, Field(ge=0, le=10_000)] = 500

    @model_validator(mode="after")
    def _unique_clients(self) -> Self:
        names = [c.name for c in self.clients]
        if len(set(names)) != len(names):
            raise ValueError("save_api client names must be unique")
        return self


# -- requests ------------------------------------------------------------------------


def _part(name: str) -> AfterValidator:
    return AfterValidator(lambda value: check_part(name, value))


OwnerKey = Annotated[str, Field(max_length=256, strict=True), _part("ownerKey")]
Slot = Annotated[str, Field(max_length=256, strict=True), _part("slot id")]
ObjectName = Annotated[str, Field(max_length=256, strict=True), _part("sourceObject")]
RecordId = Annotated[str, Field(max_length=256, strict=True), _part("recordId")]
OptionalText = Annotated[str, Field(max_length=256, strict=True), _part("value")] | None


class SaveIn(_Strict):
    """One reported save, as the CRM sends it (the fields of WF-2's client call)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    owner_key: OwnerKey = Field(alias="ownerKey", description="ConnectorOwnerKey")
    action_slot: Slot = Field(alias="actionSlot", description="ActionSlotId")
    destination_slot: Slot = Field(alias="destinationSlot", description="DestinationSlotId")
    source_object: ObjectName = Field(alias="sourceObject")
    record_id: RecordId = Field(alias="recordId", description="the saved record's id")
    user_id: OptionalText = Field(default=None, alias="userId", description="originating user id")
    save_id: OptionalText = Field(
        default=None, alias="saveId", description="the CRM's id for this save (traced only)"
    )

    def to_save_request(self) -> SaveRequest:
        return SaveRequest(
            connector_owner_key=self.owner_key,
            action_slot_id=self.action_slot,
            destination_slot_id=self.destination_slot,
            source_object=self.source_object,
            source_record_id=self.record_id,
            originating_user_id=self.user_id,
        )

    @property
    def link_key(self) -> str:
        return link_key(
            self.owner_key,
            self.action_slot,
            self.source_object,
            self.record_id,
            self.destination_slot,
        )


class SaveBatchIn(_Strict):
    saves: Annotated[list[SaveIn], Field(min_length=1)]


def request_hash(route: str, saves: list[SaveIn]) -> str:
    """What an `Idempotency-Key` is bound to: the route and the saves, canonically."""
    canonical = json.dumps(
        [route, [s.model_dump(mode="json", by_alias=True) for s in saves]],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# -- answers ---------------------------------------------------------------------------

DecisionKind = Literal[
    "create_reserved",
    "deferred_association_reserved",
    "patch_queued",
    "observed_active_attempt",
    "rejected",
]
WakeKind = Literal["signalled", "deferred", "not_needed"]


class SaveResult(_Strict):
    """The admission decision for one save, committed before this answer was sent."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    decision: DecisionKind
    link_key: str = Field(alias="linkKey")
    workflow_id: str = Field(alias="workflowId")
    reason: RejectReason | None = None
    detail: str | None = None
    attempt_id: str | None = Field(default=None, alias="attemptId")
    remote_id: str | None = Field(default=None, alias="remoteId")
    waiting_on: tuple[str, ...] | None = Field(default=None, alias="waitingOn")
    # Only on the first answer: whether the workflow was woken (the relay covers deferral).
    wake: WakeKind | None = None


class SaveAnswer(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    result: SaveResult
    replayed: bool = False
    warnings: tuple[str, ...] = ()


class BatchAnswer(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    results: tuple[SaveResult, ...]
    replayed: bool = False
    warnings: tuple[str, ...] = ()


class FieldProblem(_Strict):
    path: str
    message: str


class ErrorAnswer(_Strict):
    error: str
    fields: tuple[FieldProblem, ...] = ()


def answer_for(save: SaveIn, decision: AdmissionDecision) -> SaveResult:
    """The answer for one save (rule 2); the link key is the request's identity."""
    key = save.link_key
    base = {"link_key": key, "workflow_id": link_workflow_id(key), "decision": decision.kind}
    match decision:
        case CreateReserved():
            return SaveResult.model_validate(base)
        case DeferredAssociationReserved(waiting_on=waiting_on):
            return SaveResult.model_validate({**base, "waiting_on": waiting_on})
        case PatchQueued(remote_id=remote_id):
            return SaveResult.model_validate({**base, "remote_id": remote_id})
        case ObservedActiveAttempt(attempt_id=attempt_id, status=status):
            return SaveResult.model_validate(
                {**base, "attempt_id": attempt_id, "detail": status.value}
            )
        case Rejected(reason=reason, detail=detail):
            return SaveResult.model_validate({**base, "reason": reason, "detail": detail})
        case _:
            assert_never(decision)
