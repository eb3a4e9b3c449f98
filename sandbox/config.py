"""Sandbox configuration: the mode, object types, unique properties, idempotency and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# HubSpot allows at most ten unique-value properties per object type.
MAX_UNIQUE_PROPERTIES = 10
# Remotes that honour idempotency keys commonly keep them for a day.
DEFAULT_KEY_TTL_S = 86_400.0

# `generous`: HubSpot-shaped, plus what the demo pack declares (Idempotency-Key, ETag and
# If-Match) and a token bucket per object type. `hubspot`: only what HubSpot documents.
# `salesforce`: a Salesforce-shaped REST API (sandbox.salesforce).
SandboxMode = Literal["generous", "hubspot", "salesforce"]


class RateLimitConfig(BaseModel):
    """`requests` per `per_seconds` (HubSpot: 100/10 s): a token bucket in the generous mode,
    a sliding window of arrival times with no tolerance in the hubspot mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(ge=1)
    per_seconds: float = Field(gt=0, le=86_400)


class DailyLimit(BaseModel):
    """HubSpot's daily limit: `requests` per account and calendar day in `time_zone`, reset
    at its midnight; a 429 then names the `DAILY` policy (PROF-5)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(ge=1)
    time_zone: str = "UTC"

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as error:  # the admin API answers 422
            raise ValueError(f"not an IANA time zone name: {value!r}") from error
        return value


class HubSpotLimits(BaseModel):
    """The hubspot mode's limits: `burst` per credential (the bearer token), a sliding window
    that admits no request above it; `daily` per account. Defaults: a private app on the
    Free and Starter tiers (100 per 10 s, 250,000 a day)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    burst: RateLimitConfig | None = RateLimitConfig(requests=100, per_seconds=10)
    daily: DailyLimit | None = DailyLimit(requests=250_000)


class SalesforceLimits(BaseModel):
    """The salesforce mode's limit: the org's API requests per rolling 24 hours (every
    credential's together; Developer Edition: 15,000)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocation: int = Field(default=15_000, ge=1)


class ObjectTypeConfig(BaseModel):
    """How one object type behaves: which properties are unique, whether keys are honoured
    and for how long (`idempotency_key_ttl_s`: after it a reused key creates a second
    object, as a real remote that forgets keys does, SPEC G-5)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    unique_properties: tuple[str, ...] = Field(default=(), max_length=MAX_UNIQUE_PROPERTIES)
    idempotency: bool = False
    idempotency_key_ttl_s: float = Field(default=DEFAULT_KEY_TTL_S, gt=0)
    # Overrides `SandboxConfig.rate_limit` for this type (generous mode only).
    rate_limit: RateLimitConfig | None = None
    # Salesforce mode: external-id fields that may hold one value on several records (a
    # look-up by one then answers 300); unique external ids are `unique_properties`.
    external_ids: tuple[str, ...] = ()


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

    mode: SandboxMode = "generous"
    object_types: dict[str, ObjectTypeConfig] = Field(default_factory=_default_object_types)
    seed: int = 0
    persist_path: Path | None = None
    first_id: int = Field(default=1001, ge=1)
    callback_duplicate_status: int = Field(default=204, ge=200, le=599)
    # Every object type gets its own bucket of this size; None: no limit (generous mode).
    rate_limit: RateLimitConfig | None = None
    hubspot_limits: HubSpotLimits = HubSpotLimits()
    salesforce_limits: SalesforceLimits = SalesforceLimits()

    @model_validator(mode="after")
    def _types_present(self) -> SandboxConfig:
        if not self.object_types:
            raise ValueError("object_types must name at least one object type")
        return self

    @model_validator(mode="after")
    def _only_the_modes_own_settings(self) -> SandboxConfig:
        # A setting another mode reads would be silently ignored: refuse it instead.
        problem = next(iter(_foreign_settings(self)), None)
        if problem is not None:
            raise ValueError(f"mode {self.mode}: {problem}")
        return self


def _foreign_settings(config: SandboxConfig) -> list[str]:
    given = config.model_fields_set
    problems: list[str] = []
    if config.mode != "generous":
        if config.rate_limit is not None or any(t.rate_limit for t in config.object_types.values()):
            problems.append(f"rate_limit is the generous mode's; use {config.mode}_limits")
        problems += [f"{n}: no idempotency key here" for n, t in _types(config) if t.idempotency]
    if config.mode != "hubspot" and "hubspot_limits" in given:
        problems.append("hubspot_limits belong to mode hubspot")
    if config.mode != "salesforce":
        if "salesforce_limits" in given:
            problems.append("salesforce_limits belong to mode salesforce")
        with_ids = [name for name, t in _types(config) if t.external_ids]
        problems += [f"{name}: external_ids are mode salesforce's" for name in with_ids]
    return problems


def _types(config: SandboxConfig) -> list[tuple[str, ObjectTypeConfig]]:
    return list(config.object_types.items())
