"""Runtime configuration, loaded once per entry point (STYLE rule 9).

`DATABASE_URL` and `TEMPORAL_*` keep their conventional names; everything else
is `CONNECTOR_PUSH_*`. Secrets are `SecretStr` so they never print.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol.retention import (
    DEFAULT_KEEP_PATCHES,
    MAX_AGE,
    AgeInvalid,
    PruneInput,
    parse_age,
)

# The worker's sticky cache: open runs kept in memory between tasks. Parked links stay
# open (one run each, waiting for an operator), so this bounds the worker's memory, not
# their number: measured 0.23 MB per cached run over 105 MB idle (P5), so 500 keeps
# 10,000 parked links near 220 MB (temporalio's default, 1000, measured 333 MB). 500 is
# still 2.5x the activity slots (200): every run with work in flight stays cached, and an
# evicted parked run that an operator wakes replays its short, bounded history first.
MAX_CACHED_WORKFLOWS: Final = 500

OtelExporter = Literal["none", "console", "otlp"]
# Which kind of deployment reads these settings; in `production`, `pack apply` refuses a
# profile whose replay-safety or precondition claim `pack verify` never found holding.
DeploymentProfile = Literal["development", "production"]


class RuntimeSettings(BaseSettings):
    """Settings shared by the worker, the ingress, the CRM client and the CLI."""

    model_config = SettingsConfigDict(env_prefix="CONNECTOR_PUSH_", extra="ignore")

    database_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "CONNECTOR_PUSH_DATABASE_URL")
    )
    temporal_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TEMPORAL_ADDRESS", "CONNECTOR_PUSH_TEMPORAL_ADDRESS"),
    )
    temporal_namespace: str = Field(
        default="default",
        validation_alias=AliasChoices("TEMPORAL_NAMESPACE", "CONNECTOR_PUSH_TEMPORAL_NAMESPACE"),
    )
    temporal_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("TEMPORAL_API_KEY", "CONNECTOR_PUSH_TEMPORAL_API_KEY"),
    )
    temporal_tls: bool = Field(
        default=False, validation_alias=AliasChoices("TEMPORAL_TLS", "CONNECTOR_PUSH_TEMPORAL_TLS")
    )
    temporal_tls_cert: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TEMPORAL_TLS_CERT", "CONNECTOR_PUSH_TEMPORAL_TLS_CERT"),
    )
    temporal_tls_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TEMPORAL_TLS_KEY", "CONNECTOR_PUSH_TEMPORAL_TLS_KEY"),
    )
    # A PEM of the CA that signed the frontend's certificate, for a frontend behind a
    # private CA (S-3); implies TLS. Unset: the system roots.
    temporal_tls_ca: str | None = Field(
        default=None,
        validation_alias=AliasChoices("TEMPORAL_TLS_CA", "CONNECTOR_PUSH_TEMPORAL_TLS_CA"),
    )
    task_queue: str = "connector-push"
    otel_exporter: OtelExporter = "none"
    otel_endpoint: str | None = None
    # host:port for the Temporal SDK's Prometheus metrics (NF-1); off when unset.
    metrics_bind_address: str | None = None
    # The worker's sticky cache (MAX_CACHED_WORKFLOWS above says why 500):
    # parked links stay open, so this, not their number, bounds the RSS (P5).
    max_cached_workflows: int = Field(default=MAX_CACHED_WORKFLOWS, ge=0)
    log_level: str = "INFO"
    log_json: bool = True
    # CONNECTOR_PUSH_DEPLOYMENT_PROFILE; development unless the deployment says otherwise.
    deployment_profile: DeploymentProfile = "development"
    # CONNECTOR_PUSH_ALLOW_PLAIN_HTTP: in production, the one named exception that lets the
    # worker send to an `http://` remote (S-3); logged at start. Ignored in development.
    allow_plain_http: bool = False
    # OPS-3: an age such as `30d` turns on the worker's daily prune; off when unset.
    prune_older_than: str | None = None
    prune_keep_patches: int = Field(default=DEFAULT_KEEP_PATCHES, ge=0)

    @field_validator("prune_older_than")
    @classmethod
    def _an_age(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_age(value)
            except AgeInvalid:  # the message names the variable; its value is not shown
                raise ValueError(
                    "CONNECTOR_PUSH_PRUNE_OLDER_THAN is not an age like 30d, 12h, 90m, 2w "
                    f"or 45s of at most {MAX_AGE.days}d"
                ) from None
        return value

    def prune_input(self) -> PruneInput | None:
        """The scheduled prune's input, or None when retention is not configured."""
        if self.prune_older_than is None:
            return None
        age = int(parse_age(self.prune_older_than).total_seconds())
        return PruneInput(older_than_seconds=age, keep_patches_per_link=self.prune_keep_patches)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("CONNECTOR_PUSH_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
        return upper

    def refuses_plain_http(self) -> bool:
        """S-3: a production worker sends nothing over `http://` unless the deployment
        names the exception (`CONNECTOR_PUSH_ALLOW_PLAIN_HTTP=1`)."""
        return self.deployment_profile == "production" and not self.allow_plain_http

    def require_database_url(self) -> str:
        if self.database_url is None:
            raise ValueError("DATABASE_URL is not set (or run `make dev` for the local stack)")
        return self.database_url.get_secret_value()

    def require_temporal_address(self) -> str:
        if self.temporal_address is None:
            raise ValueError("TEMPORAL_ADDRESS is not set (or run `make dev` for the local stack)")
        return self.temporal_address
