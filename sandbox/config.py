"""Sandbox configuration: object types, unique properties, idempotency and rate limits."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

# HubSpot allows at most ten unique-value properties per object type.
MAX_UNIQUE_PROPERTIES = 10
# Remotes that honour idempotency keys commonly keep them for a day.
DEFAULT_KEY_TTL_S = 86_400.0


class RateLimitConfig(BaseModel):
    """A token bucket: `requests` tokens, refilled evenly over `per_seconds` (HubSpot: 100/10 s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(ge=1)
    per_seconds: float = Field(gt=0, le=86_400)


class ObjectTypeConfig(BaseModel):
    """How one object type behaves: which properties are unique, whether keys are honoured
    and for how long (`idempotency_key_ttl_s`: after it a reused key creates a second
    object, as a real remote that forgets keys does, SPEC G-5)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    unique_properties: tuple[str, ...] = Field(default=(), max_length=MAX_UNIQUE_PROPERTIES)
    idempotency: bool = False
    idempotency_key_ttl_s: float = Field(default=DEFAULT_KEY_TTL_S, gt=0)
    # Overrides `SandboxConfig.rate_limit` for this type.
    rate_limit: RateLimitConfig | None = None


def _default_object_types() -> dict[str, ObjectTypeConfig]:
    # HubSpot dedupes contacts by email; companies and deals have no natural unique key.
    return {
        "contacts": ObjectTypeConfig(unique_properties=("email",)),
        "companies": ObjectTypeConfig(),
        "deals": ObjectTypeConfig(),
    }


class SandboxConfig(BaseModel):
    """Everything a sandbox server is started with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    object_types: dict[str, ObjectTypeConfig] = Field(default_factory=_default_object_types)
    seed: int = 0
    persist_path: Path | None = None
    first_id: int = Field(default=1001, ge=1)
    callback_duplicate_status: int = Field(default=204, ge=200, le=599)
    # Every object type gets its own bucket of this size; None: no limit.
    rate_limit: RateLimitConfig | None = None

    @model_validator(mode="after")
    def _types_present(self) -> SandboxConfig:
        if not self.object_types:
            raise ValueError("object_types must name at least one object type")
        return self
