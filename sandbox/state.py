"""The sandbox's whole mutable state as one serializable value, plus the ledger schema."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

LedgerKind = Literal["create", "patch", "delete"]


class StoredObject(BaseModel):
    """One remote record as the sandbox keeps it."""

    id: str
    properties: dict[str, str | None]
    created_at: str
    updated_at: str
    version: int = 1  # bumped on every change; the ETag is its quoted value


class SalesforceRecord(BaseModel):
    """One record of the salesforce mode: its fields as sent (flat JSON scalars)."""

    id: str
    fields: dict[str, JsonValue]
    created_at: str
    updated_at: str


class IdempotencyRecord(BaseModel):
    """The first answer given to an `Idempotency-Key`, replayed on reuse with the same body
    until the type's key TTL has passed since `stored_at_s` (epoch seconds; a record saved
    before keys expired counts as stored at the epoch: expired)."""

    body_sha256: str
    object_id: str
    status: int
    body: JsonValue
    stored_at_s: float = 0.0


class LedgerEntry(BaseModel):
    """One effect-bearing request: a create (or its replay), a PATCH or a DELETE."""

    seq: int
    at: str
    kind: LedgerKind
    object_type: str
    object_id: str | None
    idempotency_key: str | None = None
    body_sha256: str
    unique_values: dict[str, str] = Field(default_factory=dict)
    replayed: bool = False
    status: int


class CallbackCompletion(BaseModel):
    """One workflow-action callback completion the sandbox received."""

    seq: int
    at: str
    callback_id: str
    output_fields: dict[str, JsonValue]
    batch: bool
    duplicate: bool


class SandboxState(BaseModel):
    """Objects (records in the salesforce mode), id counter, idempotency records, ledger and
    callbacks: what persistence saves."""

    next_id: int
    objects: dict[str, dict[str, StoredObject]] = Field(default_factory=dict)
    records: dict[str, dict[str, SalesforceRecord]] = Field(default_factory=dict)
    idempotency: dict[str, dict[str, IdempotencyRecord]] = Field(default_factory=dict)
    ledger: list[LedgerEntry] = Field(default_factory=list)
    callbacks: list[CallbackCompletion] = Field(default_factory=list)
