"""Ingress endpoint policy (SPEC ING-2, ING-3, ING-7): pure configuration models.

Rules kept in this module:
1. Policy is chosen locally from startup configuration, never from a database.
2. Secrets appear here only as the *name* of the environment variable holding
   them; the value is resolved by the ingress process and held as `SecretStr`.
3. `retry` is the default mode. An endpoint drops (`ack_drop`) only if it is
   named in `ack_drop_endpoints`. The production profile refuses to load unless
   that set is written out and empty (ING-2'): dropping in production is a
   break-glass incident action, allowed only when the process is started with the
   explicit flag (passed in as validation context, never read from the file).
4. Legacy signature schemes (v1, v2: no timestamp, no replay protection) load
   only where the endpoint opts in with `allow_legacy_signature`.
5. The server itself is bounded too: the time to receive a request head, its size
   and header count (S-6), and the number of connections served at once have
   defaults and can only be lowered or raised within limits, never switched off.
6. The production profile refuses what weakens a boundary (S-3): a legacy signature
   scheme, and an `http://` URL (where senders call, where completions and their
   credential go), unless `production_allows` names the exception; the ingress logs
   each one in use at start and the readback shows them.
7. Each save-API client has a key of its own: two clients sharing one (one variable
   here, or two holding one value, checked where the values are read) are refused.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Final, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from protocol.event_identity import CompositeIdentityRule, IdentityRule, LegacyIdentityRule
from protocol.pack_fields import CredentialRef
from protocol.save_api import SaveApiPolicy

_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_ENV_PATTERN: Final = r"^[A-Z_][A-Z0-9_]{0,127}$"
_HEADER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9-]*$"  # an HTTP header field name
_DURATION: Final = TypeAdapter(timedelta)
# Validation context key: the process was started with the break-glass ack-drop flag.
BREAK_GLASS_ACK_DROP: Final = "break_glass_ack_drop"
# The flag's two spellings, named in the refusal (the ingress reads them, not this module).
BREAK_GLASS_SETTING: Final = (
    "--break-glass-ack-drop (or CONNECTOR_PUSH_INGRESS_BREAK_GLASS_ACK_DROP=1)"
)


class Profile(StrEnum):
    DEVELOPMENT = "development"
    PRODUCTION = "production"


class EndpointMode(StrEnum):
    RETRY = "retry"
    ACK_DROP = "ack_drop"


class SignatureScheme(StrEnum):
    V3 = "v3"
    V2 = "v2"
    V1 = "v1"


class ProductionAllowance(StrEnum):
    """An exception the production profile makes only when `production_allows` names it."""

    LEGACY_SIGNATURE = "legacy_signature"  # a v1/v2 endpoint (no replay protection)
    PLAIN_HTTP = "plain_http"  # an http:// public_base_url or callback_base_url


class WorkflowActionMode(StrEnum):
    DISABLED = "disabled"
    PROXY = "proxy"


class ActionPolicy(StrEnum):
    BEST_EFFORT = "best_effort"
    MUST_COMPLETE = "must_complete"


class InboundHandler(StrEnum):
    """What processing does with a routed event (SPEC ING-6)."""

    REMOTE_DELETION = "remote_deletion"
    REMOTE_PROPERTY_CHANGE = "remote_property_change"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InboundRoute(_Strict):
    """What processing needs to know about a routed event, fixed at admission (ING-6).

    A bare handler name is accepted as shorthand for a route with no target object.
    """

    handler: InboundHandler
    # The links' `target_object` the remote object type corresponds to (e.g. `contacts`).
    target_object: str | None = None
    # Where the remote object id sits in the event.
    object_id_path: Annotated[str, Field(min_length=1)] = "objectId"
    # Where the remote account sits in the event (e.g. `portalId`), and which links'
    # `remote_scope` each account is: object ids are unique only within an account.
    scope_path: Annotated[str, Field(min_length=1)] | None = None
    remote_scopes: dict[str, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _deletion_is_scoped(self) -> Self:
        # Fail closed: a deletion that cannot be scoped could suspend another
        # account's link that happens to share the object id.
        if self.handler is InboundHandler.REMOTE_DELETION and not (
            self.scope_path and self.remote_scopes
        ):
            raise ValueError("a remote_deletion route needs scope_path and remote_scopes")
        return self

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        return {"handler": value} if isinstance(value, str) else value


class SignaturePolicy(_Strict):
    scheme: SignatureScheme = SignatureScheme.V3
    secret_env: Annotated[str, Field(pattern=_ENV_PATTERN)]
    # Scheme, host and any proxy prefix as the sender calls them; the request path
    # is appended. Configured, because behind a proxy the Host header is not it.
    public_base_url: Annotated[str, Field(pattern=r"^https?://[^/?#]+(/[^?#]*)?$")]
    allow_legacy_signature: bool = False
    max_age_ms: Annotated[int, Field(gt=0, le=300_000)] = 300_000
    max_future_ms: Annotated[int, Field(ge=0, le=300_000)] = 60_000
    # The scheme's header names are the endpoint's, never the core's: the ingress names
    # no vendor (seed 004 "L0 Ordinary Ingress"); the demo uses the HubSpot v3 names.
    signature_header: Annotated[str, Field(pattern=_HEADER_PATTERN)]
    timestamp_header: Annotated[str, Field(pattern=_HEADER_PATTERN)] | None = None

    @model_validator(mode="after")
    def _legacy_needs_opt_in(self) -> Self:
        if self.scheme is not SignatureScheme.V3 and not self.allow_legacy_signature:
            raise ValueError(
                f"signature scheme {self.scheme.value} has no replay protection; "
                "set allow_legacy_signature: true to accept it"
            )
        if self.scheme is SignatureScheme.V3 and self.timestamp_header is None:
            raise ValueError("timestamp_header: the v3 scheme signs a timestamp header; name it")
        return self


class _EndpointBase(_Strict):
    name: Annotated[str, Field(pattern=_NAME_PATTERN)]
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/_.-]*$")]
    signature: SignaturePolicy
    deadline_ms: Annotated[int, Field(gt=0, le=30_000)] = 750
    # Sender-supplied timeout header; the deadline is min(deadline_ms, header - margin).
    timeout_header: str | None = None
    timeout_margin_ms: Annotated[int, Field(ge=0)] = 250
    body_limit: Annotated[int, Field(gt=0, le=64 * 1024 * 1024)] = 1024 * 1024


# What a webhook body must be (docs/save-api.md "Webhook batches", readback `batch`). The
# remote always sends a JSON array, so that is the one shape accepted: a bare
# object is refused (400 `batch_not_array`) rather than guessed to be one event.
BATCH_RULE: Final = (
    "a JSON array of 1..max_events event objects; a bare object is 400 batch_not_array"
)


class WebhookEndpoint(_EndpointBase):
    kind: Literal["webhook"] = "webhook"
    identity: IdentityRule
    event_type_field: Annotated[str, Field(min_length=1)]
    # Exact event type -> handler. An unrouted event gets a receipt and no event.
    routes: dict[str, InboundRoute] = Field(default_factory=dict)
    max_events: Annotated[int, Field(gt=0, le=1000)] = 100


class ActionRule(_Strict):
    policy: ActionPolicy
    # ISO-8601 duration returned with BLOCK and bounding every callback phase.
    block_expiration: str = "P7D"
    # must_complete: the local work the execution enqueues; without a route it is
    # skipped, so it completes FAIL_CONTINUE.
    route: InboundRoute | None = None

    @field_validator("block_expiration")
    @classmethod
    def _iso_duration(cls, value: str) -> str:
        if not value.startswith("P") or _DURATION.validate_python(value) <= timedelta(0):
            raise ValueError("block_expiration must be a positive ISO-8601 duration")
        return value

    @property
    def expiration(self) -> timedelta:
        return _DURATION.validate_python(self.block_expiration)


class WorkflowActionEndpoint(_EndpointBase):
    kind: Literal["workflow_action"] = "workflow_action"
    identity: LegacyIdentityRule = LegacyIdentityRule(path="callbackId")
    action_id_field: str = "origin.actionDefinitionId"
    # Exact action id -> policy; any other id fails closed.
    actions: dict[str, ActionRule] = Field(default_factory=dict)
    # Completions of must-complete actions go to `callback_base_url` + the automation
    # callback path, with the bearer token of `CONNECTOR_PUSH_CREDENTIAL_<REF>`.
    callback_base_url: Annotated[str, Field(pattern=r"^https?://[^/?#]+(/[^?#]*)?$")] | None = None
    # A reference (`env:NAME`), never the token: a token pasted here is refused at load,
    # value not shown, so nothing (the readback included) can print it.
    callback_credential_ref: CredentialRef | None = None

    @model_validator(mode="after")
    def _must_complete_needs_callback(self) -> Self:
        blocking = any(a.policy is ActionPolicy.MUST_COMPLETE for a in self.actions.values())
        if blocking and self.callback_base_url is None:
            raise ValueError("must_complete actions need callback_base_url")
        return self


Endpoint = Annotated[WebhookEndpoint | WorkflowActionEndpoint, Field(discriminator="kind")]


class IngressPolicy(_Strict):
    profile: Profile = Profile.DEVELOPMENT
    # None means "not written out": refused by the production profile, as is a
    # non-empty set unless the process runs with the break-glass flag (ING-2').
    ack_drop_endpoints: frozenset[str] | None = None
    workflow_action_mode: WorkflowActionMode = WorkflowActionMode.DISABLED
    endpoints: tuple[Endpoint, ...]
    # The CRM's HTTP save API (API-1): served at /v1/saves* only when configured.
    save_api: SaveApiPolicy | None = None
    # Time to receive a request's head (request line and headers), counted from the
    # connection's or the request's first byte; a stalled head is closed. The
    # per-request deadline (ING-4) starts only once the head is in.
    head_timeout_ms: Annotated[int, Field(gt=0, le=60_000)] = 2_000
    # Connections served at once; a request beyond it is answered at once as an internal
    # failure (ING-2: 503 + Retry-After, or 204 on an ack_drop endpoint).
    max_connections: Annotated[int, Field(gt=0, le=100_000)] = 1_000
    # A request head's request line and header names and values, in bytes, and its
    # header count (S-6); a head over either is answered 431 and dropped unparsed.
    max_header_bytes: Annotated[int, Field(ge=1_024, le=1_048_576)] = 32_768
    max_headers: Annotated[int, Field(ge=8, le=1_000)] = 100
    # Exceptions to the production profile's refusals (rule 6), each named, logged at start.
    production_allows: frozenset[ProductionAllowance] = frozenset()

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Self:
        names = [e.name for e in self.endpoints]
        paths = [e.path for e in self.endpoints]
        if len(set(names)) != len(names) or len(set(paths)) != len(paths):
            raise ValueError("endpoint names and paths must be unique")
        if self.profile is Profile.PRODUCTION:
            self._production_drops_nothing(bool((info.context or {}).get(BREAK_GLASS_ACK_DROP)))
            self._production_refusals()
        webhooks = {e.name for e in self.endpoints if isinstance(e, WebhookEndpoint)}
        unknown = (self.ack_drop_endpoints or frozenset()) - webhooks
        if unknown:
            raise ValueError(f"ack_drop_endpoints names no webhook endpoint: {sorted(unknown)}")
        self._one_key_variable_per_client()
        return self

    def _production_drops_nothing(self, break_glass: bool) -> None:
        """ING-2' (seed 004 L2): in production every endpoint answers a retryable 503 on an
        internal failure; the set must be written out, and empty but under break-glass."""
        if self.ack_drop_endpoints is None:
            raise ValueError(
                "production profile requires ack_drop_endpoints: [] (the key is missing)"
            )
        if self.ack_drop_endpoints and not break_glass:
            # The count, not the names: a value pasted into the set is not echoed.
            count = len(self.ack_drop_endpoints)
            raise ValueError(
                f"production profile requires ack_drop_endpoints to be empty (it names {count}"
                " endpoint(s)): ack-drop in production is a break-glass incident action, "
                f"started only with {BREAK_GLASS_SETTING}"
            )

    def _production_refusals(self) -> None:
        """Rule 6: legacy signatures and plain HTTP only where `production_allows` says so;
        each refusal names the endpoint and the field, never a value."""
        for endpoint in self.endpoints:
            needed = _allowances_needed(endpoint)
            refused = [(a, f) for a, f in needed if a not in self.production_allows]
            for allowance, field in sorted(refused):
                raise ValueError(
                    f"production profile refuses endpoint {endpoint.name}'s {field}: "
                    f"add {allowance.value} to production_allows to accept it (logged at start)"
                )

    @property
    def production_exceptions(self) -> frozenset[ProductionAllowance]:
        """The production profile's exceptions in use (logged at start); none elsewhere."""
        if self.profile is not Profile.PRODUCTION:
            return frozenset()
        used = {a for e in self.endpoints for a, _ in _allowances_needed(e)}
        return frozenset(used) & self.production_allows

    @property
    def break_glass_ack_drop(self) -> frozenset[str]:
        """The endpoints dropping in production: loaded only under break-glass (ING-2')."""
        if self.profile is Profile.PRODUCTION:
            return self.ack_drop_endpoints or frozenset()
        return frozenset()

    def _one_key_variable_per_client(self) -> None:
        """Rule 6: a bearer key identifies one client (its idempotency scope); clients that
        read one variable would share a key. Named by client, never by the variable (a key
        pasted where its name belongs would be shown)."""
        clients = self.save_api.clients if self.save_api else ()
        readers: dict[str, list[str]] = {}
        for client in clients:
            readers.setdefault(client.key_env, []).append(client.name)
        for names in readers.values():
            if len(names) > 1:
                raise ValueError(
                    f"save_api clients {and_list(names)} read one key_env: "
                    "each client needs its own key"
                )

    def mode_of(self, endpoint_name: str) -> EndpointMode:
        if endpoint_name in (self.ack_drop_endpoints or frozenset()):
            return EndpointMode.ACK_DROP
        return EndpointMode.RETRY


def _allowances_needed(endpoint: Endpoint) -> set[tuple[ProductionAllowance, str]]:
    """What an endpoint needs the production profile to allow, with the field that needs it."""
    needed: set[tuple[ProductionAllowance, str]] = set()
    if endpoint.signature.scheme is not SignatureScheme.V3:
        needed.add((ProductionAllowance.LEGACY_SIGNATURE, "signature scheme (legacy)"))
    if endpoint.signature.public_base_url.startswith("http://"):
        needed.add((ProductionAllowance.PLAIN_HTTP, "signature.public_base_url (http://)"))
    callback = getattr(endpoint, "callback_base_url", None)
    if callback is not None and callback.startswith("http://"):
        needed.add((ProductionAllowance.PLAIN_HTTP, "callback_base_url (http://)"))
    return needed


def and_list(names: list[str]) -> str:
    """`a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


__all__ = [
    "BATCH_RULE",
    "BREAK_GLASS_ACK_DROP",
    "BREAK_GLASS_SETTING",
    "ActionPolicy",
    "ActionRule",
    "CompositeIdentityRule",
    "Endpoint",
    "EndpointMode",
    "InboundHandler",
    "InboundRoute",
    "IngressPolicy",
    "LegacyIdentityRule",
    "ProductionAllowance",
    "Profile",
    "SignaturePolicy",
    "SignatureScheme",
    "WebhookEndpoint",
    "WorkflowActionEndpoint",
    "WorkflowActionMode",
    "and_list",
]
