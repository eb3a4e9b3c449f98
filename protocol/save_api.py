"""The HTTP save API's contract (SPEC API-1, WF-2): policy, request and answer models.

The wire shapes (routes, fields, aliases) have one home, the client's pure
`connector_push_client.models`, which CRMs install alone; the models here refine
them with what only the server decides.

Rules kept in this module:
1. A request that passes these models is storable and has a valid link identity:
   bad input is a 400 naming the field, before anything is written.
2. The answer for one save is a pure function of the request and its admission
   decision (`answer_for`), so a stored answer replays byte-for-byte in meaning.
3. Client keys appear here only as the *name* of the environment variable holding them.
4. A client acts only for the owners (and, where listed, the users) its policy entry
   names (S-1): `scope_problems` is the one place a save is checked against them, and a
   request with any save outside is refused whole, before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Final, Self, assert_never

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from connector_push_client import models as wire
from connector_push_client.models import (
    BATCH_PATH,
    SAVE_PATH,
    ErrorAnswer,
    FieldProblem,
)
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

__all__ = [
    "BATCH_PATH",
    "FORBIDDEN",
    "OPENAPI_PATH",
    "RECORD_OWNER_MISMATCH",
    "SAVE_PATH",
    "BatchAnswer",
    "ErrorAnswer",
    "FieldProblem",
    "SaveAnswer",
    "SaveApiClient",
    "SaveApiPolicy",
    "SaveBatchIn",
    "SaveIn",
    "SaveResult",
    "answer_for",
    "record_owner_problems",
    "request_hash",
    "scope_problems",
]

OPENAPI_PATH: Final = "/openapi.json"
_ENV_PATTERN: Final = r"^[A-Z_][A-Z0-9_]{0,127}$"
_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- policy (a section of the ingress policy file) ----------------------------------


def _scope_part(value: str) -> str:
    return check_part("scope entry", value)


ScopeEntry = Annotated[str, AfterValidator(_scope_part)]


class SaveApiClient(_Strict):
    """One calling CRM: its name (the idempotency scope), where its bearer key is, and
    whom it may save for (S-1)."""

    name: Annotated[str, Field(pattern=_NAME_PATTERN)]
    key_env: Annotated[str, Field(pattern=_ENV_PATTERN)]
    # The connector owner keys it saves for: required, never a wildcard (fail closed; a
    # policy written before S-1 is refused at start, naming this setting).
    owners: Annotated[frozenset[ScopeEntry], Field(min_length=1)]
    # Where the CRM delegates: the only users it may name (a save without `userId` is
    # then refused too). Unset: any user of its owners.
    users: Annotated[frozenset[ScopeEntry], Field(min_length=1)] | None = None

    def may_save(self, save: SaveIn) -> str | None:
        """None when the save is within this client's scope, else what is outside it."""
        if save.owner_key not in self.owners:
            return "ownerKey"
        if self.users is not None and save.user_id not in self.users:
            return "userId"
        return None


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


# How the 400 names each identity part that breaks ID-2's rule (rule 1).
_PART_NAMES: Final = {
    "owner_key": "ownerKey",
    "action_slot": "slot id",
    "destination_slot": "slot id",
    "source_object": "sourceObject",
    "record_id": "recordId",
    "user_id": "value",
    "save_id": "value",
}


class SaveIn(wire.SaveIn):
    """One reported save, as the CRM sends it (the fields of WF-2's client call)."""

    @field_validator(*_PART_NAMES)
    @classmethod
    def _identity_part(cls, value: str | None, info: ValidationInfo) -> str | None:
        """ID-2's rule for every part: not empty, not padded, no control characters."""
        assert info.field_name is not None
        return None if value is None else check_part(_PART_NAMES[info.field_name], value)

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


class SaveBatchIn(wire.SaveBatchIn):
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


FORBIDDEN: Final = "forbidden"
RECORD_OWNER_MISMATCH: Final = "record_owner_mismatch"


def scope_problems(
    client: SaveApiClient, saves: Sequence[SaveIn], prefix: str
) -> ErrorAnswer | None:
    """Rule 4: the 403 for saves outside the client's scope, naming each by its path
    (`prefix` + index on the batch route), or None when every save is within it."""
    problems = []
    for i, save in enumerate(saves):
        field = client.may_save(save)
        if field is not None:
            path = f"{prefix}{i}.{field}" if prefix else field
            whom = "owner" if field == "ownerKey" else "user"
            message = f"client {client.name} may not save for this {whom}; nothing was written"
            problems.append(FieldProblem(path=path, message=message))
    if not problems:
        return None
    return ErrorAnswer(error=FORBIDDEN, fields=tuple(problems))


def record_owner_problems(
    saves: Sequence[SaveIn], owners: Mapping[tuple[str, str], str | None], prefix: str
) -> ErrorAnswer | None:
    """The 403 for saves of records held for another owner, or for none (S-1: the store
    knows each record's owner; a record loaded without one is no client's to save); a
    record the store does not hold is left to admission, which rejects it."""
    problems = []
    for i, save in enumerate(saves):
        key = (save.source_object, save.record_id)
        if key in owners and owners[key] != save.owner_key:
            path = f"{prefix}{i}.recordId" if prefix else "recordId"
            held = "has no owner" if owners[key] is None else "belongs to another owner"
            message = f"the record {held}; nothing was written"
            problems.append(FieldProblem(path=path, message=message))
    if not problems:
        return None
    return ErrorAnswer(error=RECORD_OWNER_MISMATCH, fields=tuple(problems))


# -- answers ---------------------------------------------------------------------------


class SaveResult(wire.SaveResult):
    """The admission decision for one save, committed before this answer was sent."""

    # Stored answers are read back by these models: nothing unknown passes.
    model_config = ConfigDict(extra="forbid")

    reason: RejectReason | None = None


class SaveAnswer(wire.SaveAnswer):
    model_config = ConfigDict(extra="forbid")

    result: SaveResult


class BatchAnswer(wire.BatchAnswer):
    model_config = ConfigDict(extra="forbid")

    results: tuple[SaveResult, ...]


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
