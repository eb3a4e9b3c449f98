"""Ingress configuration: the endpoint policy file plus secrets from the environment.

Loaded once per process (STYLE rule 9). Secret values live only in `SecretStr`;
`readback` shows where each secret comes from, never what it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final, Literal

import yaml
from pydantic import BeforeValidator, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol.action_callback import CallbackTarget, callback_targets
from protocol.ingress_policy import (
    BATCH_RULE,
    BREAK_GLASS_ACK_DROP,
    Endpoint,
    IngressPolicy,
    WebhookEndpoint,
    and_list,
)

BREAK_GLASS_ENV: Final = "CONNECTOR_PUSH_INGRESS_BREAK_GLASS_ACK_DROP"


class ConfigError(Exception):
    """The ingress cannot start with this configuration; the message says why."""


class PolicyLocation(BaseSettings):
    """Where the policy file is (`CONNECTOR_PUSH_INGRESS_CONFIG`), for read-only commands."""

    model_config = SettingsConfigDict(extra="ignore")

    config: Path | None = Field(default=None, validation_alias="CONNECTOR_PUSH_INGRESS_CONFIG")
    # ING-2': the incident flag that lets a production policy name ack-drop endpoints
    # (`--break-glass-ack-drop` on the command line); logged at start, shown by readback.
    break_glass_ack_drop: bool = Field(default=False, validation_alias=BREAK_GLASS_ENV)


class IngressSettings(PolicyLocation):
    """Server settings from the environment (`DATABASE_URL`, `CONNECTOR_PUSH_INGRESS_*`)."""

    database_url: SecretStr = Field(validation_alias="DATABASE_URL")
    host: str = Field(default="127.0.0.1", validation_alias="CONNECTOR_PUSH_INGRESS_HOST")
    port: int = Field(default=8780, validation_alias="CONNECTOR_PUSH_INGRESS_PORT")
    # Processes serving the one port (SO_REUSEPORT): each is a whole ingress with its
    # own pool and group committer; more than one only helps with cores to spare.
    processes: int = Field(
        default=1, ge=1, le=64, validation_alias="CONNECTOR_PUSH_INGRESS_PROCESSES"
    )
    # Where processing workflows are started (ING-6). Unset: admissions still commit
    # and answer, and a relay with a Temporal address starts their workflows later.
    temporal_address: str | None = Field(default=None, validation_alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", validation_alias="TEMPORAL_NAMESPACE")
    temporal_api_key: SecretStr | None = Field(default=None, validation_alias="TEMPORAL_API_KEY")
    temporal_tls: bool = Field(default=False, validation_alias="TEMPORAL_TLS")
    # The worker's TLS settings (S-3): a private CA's PEM for the frontend, and a client
    # certificate and key for mTLS (both or neither), read when the client connects.
    temporal_tls_ca: str | None = Field(default=None, validation_alias="TEMPORAL_TLS_CA")
    temporal_tls_cert: str | None = Field(default=None, validation_alias="TEMPORAL_TLS_CERT")
    temporal_tls_key: str | None = Field(default=None, validation_alias="TEMPORAL_TLS_KEY")
    task_queue: str = Field(default="connector-push", validation_alias="CONNECTOR_PUSH_TASK_QUEUE")
    # The worker's logging settings: JSON lines, credentials masked (S-6).
    log_json: bool = Field(default=True, validation_alias="CONNECTOR_PUSH_LOG_JSON")
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(str.upper)
    ] = Field(default="INFO", validation_alias="CONNECTOR_PUSH_LOG_LEVEL")

    def temporal_target(self) -> TemporalTarget | None:
        if self.temporal_address is None:
            return None
        return TemporalTarget(
            address=self.temporal_address,
            namespace=self.temporal_namespace,
            task_queue=self.task_queue,
            api_key=self.temporal_api_key,
            tls=self.temporal_tls,
            tls_ca=self.temporal_tls_ca,
            tls_cert=self.temporal_tls_cert,
            tls_key=self.temporal_tls_key,
        )

    @model_validator(mode="after")
    def _tls_files(self) -> IngressSettings:
        """Refused at start, as the worker refuses them, not at the first workflow start."""
        if bool(self.temporal_tls_cert) != bool(self.temporal_tls_key):
            raise ValueError("TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY: set both or neither")
        for name, path in (
            ("TEMPORAL_TLS_CA", self.temporal_tls_ca),
            ("TEMPORAL_TLS_CERT", self.temporal_tls_cert),
            ("TEMPORAL_TLS_KEY", self.temporal_tls_key),
        ):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"{name}: not a readable file")
        return self


@dataclass(frozen=True)
class TemporalTarget:
    """Where the ingress starts workflows; the client connects lazily (Temporal may be down)."""

    address: str
    namespace: str = "default"
    task_queue: str = "connector-push"
    api_key: SecretStr | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclass(frozen=True)
class IngressConfig:
    policy: IngressPolicy
    secrets: Mapping[str, SecretStr]  # endpoint name -> signing secret
    save_api_keys: Mapping[str, SecretStr] = field(default_factory=dict)  # client -> bearer key

    def endpoint(self, name: str) -> Endpoint:
        return next(e for e in self.policy.endpoints if e.name == name)


def parse_policy(text: str, *, break_glass_ack_drop: bool = False) -> IngressPolicy:
    """Validate policy YAML; errors name the offending key, never the value found there.
    `break_glass_ack_drop`: the process runs with the incident flag (ING-2')."""
    context = {BREAK_GLASS_ACK_DROP: break_glass_ack_drop}
    try:
        return IngressPolicy.model_validate(yaml.safe_load(text), context=context)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid ingress policy: {_yaml_problem(exc)}") from None
    except ValidationError as exc:
        raise ConfigError(f"invalid ingress policy: {_validation_problems(exc)}") from None


# Neither error's own text is shown: a ValidationError quotes each input value and a YAML
# error the offending line, and a secret pasted where a variable name belongs (or inline
# beside it) would be printed in full at start and by the readback.


def _validation_problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'policy'}: "
        + error["msg"].removeprefix("Value error, ")
        for error in exc.errors(include_url=False, include_input=False, include_context=False)
    )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return "not valid YAML"


def load_callback_targets(location: PolicyLocation) -> dict[str, CallbackTarget]:
    """The workflow-action completion targets the worker sends to, by endpoint (S-2), from
    the policy file the ingress runs (`CONNECTOR_PUSH_INGRESS_CONFIG`); none without one
    (every completion then stops, nothing sent). An unreadable or invalid file refuses."""
    if location.config is None:
        return {}
    try:
        text = location.config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the ingress policy: {type(exc).__name__}") from None
    policy = parse_policy(text, break_glass_ack_drop=location.break_glass_ack_drop)
    return callback_targets(policy)


def resolve_secrets(policy: IngressPolicy, environ: Mapping[str, str]) -> dict[str, SecretStr]:
    """Read each endpoint's secret from the variable it names; refuse if any is unset or
    not UTF-8."""
    return {
        endpoint.name: _secret(
            environ,
            endpoint.signature.secret_env,
            f"endpoint {endpoint.name}: environment variable",
        )
        for endpoint in policy.endpoints
    }


def _secret(environ: Mapping[str, str], variable: str, owner: str) -> SecretStr:
    """The variable's value, refused (naming the variable, never the value) if it is unset
    or not UTF-8: signatures and bearer keys are compared as UTF-8 bytes, so such a value
    could never verify, and every request would fail instead of the start."""
    value = environ.get(variable, "")
    if not value:
        raise ConfigError(f"{owner} {variable} is unset")
    try:
        value.encode("utf-8")  # os.environ holds undecodable bytes as lone surrogates
    except UnicodeEncodeError:
        raise ConfigError(
            f"{owner} {variable} is not valid UTF-8; set it to the secret's text"
        ) from None
    return SecretStr(value)


def load_config(
    path: Path, environ: Mapping[str, str] | None = None, *, break_glass_ack_drop: bool = False
) -> IngressConfig:
    """Load the policy file and its secrets (from `os.environ` unless given)."""
    policy = parse_policy(
        path.read_text(encoding="utf-8"), break_glass_ack_drop=break_glass_ack_drop
    )
    environ = os.environ if environ is None else environ
    return IngressConfig(
        policy, resolve_secrets(policy, environ), resolve_save_api_keys(policy, environ)
    )


def resolve_save_api_keys(
    policy: IngressPolicy, environ: Mapping[str, str]
) -> dict[str, SecretStr]:
    """Each save-API client's bearer key from the variable it names; refuse if any is unset
    or not UTF-8."""
    keys = {
        client.name: _secret(environ, client.key_env, f"save_api client {client.name}:")
        for client in (policy.save_api.clients if policy.save_api else ())
    }
    refuse_shared_save_api_keys(policy, environ)
    return keys


def refuse_shared_save_api_keys(policy: IngressPolicy, environ: Mapping[str, str]) -> None:
    """Refuse save-API clients whose variables hold one key: a request would be taken for
    one of them and their idempotency scopes would merge. Names the clients, never the key;
    variables unset are left to `resolve_save_api_keys`."""
    holders: dict[str, list[str]] = {}
    for client in policy.save_api.clients if policy.save_api else ():
        if value := environ.get(client.key_env):
            holders.setdefault(value, []).append(client.name)
    for names in holders.values():
        if len(names) > 1:
            raise ConfigError(
                f"save_api clients {and_list(names)} have the same key "
                "(their key_env variables hold one value): each client needs its own key"
            )


def readback(policy: IngressPolicy, environ: Mapping[str, str]) -> dict[str, object]:
    """The active policy as data, with each endpoint's effective mode and whether its
    secret variable is set; never a secret value."""
    endpoints = []
    for endpoint in policy.endpoints:
        entry = endpoint.model_dump(mode="json")
        entry["secret_present"] = bool(environ.get(endpoint.signature.secret_env))
        entry["mode"] = policy.mode_of(endpoint.name).value
        if isinstance(endpoint, WebhookEndpoint):
            entry["batch"] = BATCH_RULE
        endpoints.append(entry)
    ack_drop = policy.ack_drop_endpoints
    return {
        "profile": policy.profile.value,
        "ack_drop_endpoints": None if ack_drop is None else sorted(ack_drop),
        # ING-2': production endpoints dropping under the break-glass flag (normally none)
        "break_glass_ack_drop": sorted(policy.break_glass_ack_drop),
        "workflow_action_mode": policy.workflow_action_mode.value,
        "head_timeout_ms": policy.head_timeout_ms,
        "max_connections": policy.max_connections,
        # S-6: a head over either is answered 431
        "max_header_bytes": policy.max_header_bytes,
        "max_headers": policy.max_headers,
        # S-3: the production profile's exceptions, as written (each in use is logged)
        "production_allows": sorted(a.value for a in policy.production_allows),
        "endpoints": endpoints,
        "save_api": _save_api_readback(policy, environ),
    }


def _save_api_readback(policy: IngressPolicy, environ: Mapping[str, str]) -> object:
    """The save API's clients (whether each key variable is set, never the key; the owners
    and users each may save for) and limits; None when it is not served."""
    save_api = policy.save_api
    if save_api is None:
        return None
    return {
        "clients": [
            {
                "name": c.name,
                "key_env": c.key_env,
                "key_present": bool(environ.get(c.key_env)),
                # S-1: whom it may save for (users None: any user of those owners)
                "owners": sorted(c.owners),
                "users": None if c.users is None else sorted(c.users),
            }
            for c in save_api.clients
        ],
        "max_batch": save_api.max_batch,
        "body_limit": save_api.body_limit,
        "deadline_ms": save_api.deadline_ms,
        "wake_timeout_ms": save_api.wake_timeout_ms,
    }
