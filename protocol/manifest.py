"""Pack manifest model (SPEC PACK-1): trusted, pack-authored connector metadata.

Callers parse YAML themselves and hand the mapping to `parse_manifest`; every
problem is reported as `path: message` naming the manifest field.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)
from pydantic import model_validator as _model_validator
from pydantic.alias_generators import to_camel

from protocol.durations import KeyRetentionSeconds
from protocol.pack_fields import (
    BaseUrl,
    CreatePath,
    CredentialRef,
    HttpErrorStatus,
    LookupPath,
    NonEmpty,
    Regex,
    ResponseIdPath,
    StableId,
    TimeZoneName,
    UpdatePath,
)
from protocol.storable import MEANINGS, location_text, unstorable_at

# Where a destination slot creates: (remote scope, target object). Two destination slots
# with the same pair address one remote destination (SPEC G-2).
RemoteDestination = tuple[str, str]


class PackModel(BaseModel):
    """Manifest models: camelCase keys, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        coerce_numbers_to_str=True,
    )


class AssociationMode(StrEnum):
    CREATE_INLINE = "create_inline"
    UPDATE_ONLY = "update_only"


class LineageKind(StrEnum):
    REBIND = "rebind"
    RETIRE = "retire"


class MirrorSpec(PackModel):
    """The compatibility mirror field pair written back on the local record."""

    remote_id_field: NonEmpty
    provenance_field: NonEmpty


class MappingRow(PackModel):
    source_field: NonEmpty
    remote_property: NonEmpty
    required: bool = False


class AssociationContract(PackModel):
    """A lookup field whose target record's remote id goes into `remote_property`."""

    id: StableId
    source_field: NonEmpty
    target_action_slot: StableId
    mode: AssociationMode
    remote_property: NonEmpty


class ActionSlot(PackModel):
    id: StableId
    flow_developer_name: NonEmpty
    flow_action_name: NonEmpty
    flow_version: NonEmpty
    source_object: StableId
    destination_slot: StableId
    create_path: CreatePath
    update_path: UpdatePath
    response_id_path: ResponseIdPath
    body_envelope: str | None = "properties"
    mirror: MirrorSpec
    mappings: tuple[MappingRow, ...] = Field(min_length=1)
    associations: tuple[AssociationContract, ...] = ()

    @_model_validator(mode="after")
    def _remote_properties_unique(self) -> ActionSlot:
        owners = [m.remote_property for m in self.mappings]
        owners += [a.remote_property for a in self.associations]
        duplicated = sorted(p for p, n in Counter(owners).items() if n > 1)
        if duplicated:
            raise ValueError(f"mappings: remote property mapped more than once: {duplicated}")
        return self


class DestinationSlot(PackModel):
    id: StableId
    target_object: StableId
    remote_scope: NonEmpty
    profile: NonEmpty


class RetryPolicy(PackModel):
    max_attempts: int = Field(ge=1)
    initial_interval_ms: int = Field(gt=0)
    backoff_coefficient: float = Field(default=2.0, ge=1.0)
    max_interval_ms: int = Field(default=60_000, gt=0)


class PostIdempotency(PackModel):
    """The remote de-duplicates POSTs carrying the same key in `header`, for
    `key_retention` seconds after it first saw the key (G-5: required by `pack apply`;
    an install from before it parses without one, and re-sends nothing on that basis)."""

    header: NonEmpty
    key_retention: KeyRetentionSeconds | None = None

    @model_serializer(mode="wrap")
    def _without_an_undeclared_retention(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Undeclared, it dumps as before it existed: a stored install's digests stand."""
        data = handler(self)
        if self.key_retention is None and isinstance(data, dict):
            data.pop("keyRetention", None)
            data.pop("key_retention", None)
        return data


class Idempotency(PackModel):
    post: PostIdempotency | None = None
    patch_replay_safe: bool = False


class Precondition(PackModel):
    """An optimistic-concurrency header the remote honours on PATCH (e.g. If-Match)."""

    header: NonEmpty


class Readback(PackModel):
    """PROF-2: a GET that returns the object, so a re-sent PATCH answered 412 can be
    compared with what it sent. `path` defaults to the PATCH's own update path."""

    path: UpdatePath | None = None


def _without_none(data: Any, names: tuple[str, ...]) -> Any:
    """A dump without undeclared (None) optional fields: a stored install's digests stand."""
    if isinstance(data, dict):
        for name in names:
            if data.get(name, ...) is None:
                data.pop(name)
    return data


class LocatorRecovery(PackModel):
    """Unique-locator recovery: the runtime fills `remote_property` with its locator
    at create time and, after an ambiguous POST, GETs `lookup_path` to find the object."""

    remote_property: NonEmpty
    lookup_path: LookupPath
    # Where the look-up's answer holds the id, when not where the create's does.
    response_id_path: ResponseIdPath | None = None

    @model_serializer(mode="wrap")
    def _without_an_undeclared_id_path(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_none(handler(self), ("response_id_path", "responseIdPath"))


class AnswerMatch(PackModel):
    """An answer of the remote (PROF-1, PROF-5): its status and, optionally, a body field
    holding a value, in the JSON object or in any object of a JSON array (an error array)."""

    status: HttpErrorStatus
    body_field: NonEmpty | None = None
    body_value: NonEmpty | None = None

    @model_serializer(mode="wrap")
    def _without_an_undeclared_body(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_none(handler(self), ("body_field", "body_value", "bodyField", "bodyValue"))

    @_model_validator(mode="after")
    def _field_with_value(self) -> AnswerMatch:
        if (self.body_field is None) != (self.body_value is None):
            raise ValueError("bodyField and bodyValue are declared together")
        return self


class DailyReset(PackModel):
    """PROF-5: when a spent daily limit frees: the midnight of `time_zone` (a calendar
    day), or `rolling_hours` after the refusal (a rolling window: by then every request
    the refused allocation counted has aged out)."""

    time_zone: TimeZoneName | None = None
    rolling_hours: int | None = Field(default=None, ge=24, le=720)

    @model_serializer(mode="wrap")
    def _one_rule(self, handler: SerializerFunctionWrapHandler) -> Any:
        names = ("time_zone", "rolling_hours", "timeZone", "rollingHours")
        return _without_none(handler(self), names)

    @_model_validator(mode="after")
    def _exactly_one(self) -> DailyReset:
        if (self.time_zone is None) == (self.rolling_hours is None):
            raise ValueError("declare exactly one of timeZone and rollingHours")
        return self


class DailyLimit(PackModel):
    """PROF-5: the answer saying the remote's daily allocation is spent, and its reset."""

    answer: AnswerMatch
    reset: DailyReset


# Whose midnight resets a daily quota when the profile names no zone (NF-8).
DEFAULT_DAILY_RESET_TIME_ZONE: Final = "UTC"


def daily_allowance(quota: int, share: float) -> int:
    """Requests per day this product may spend: the share of the quota, rounded down (a
    share is never exceeded). The epsilon absorbs binary fractions (10 x 0.3 is 3)."""
    return math.floor(quota * share + 1e-9)


_DAILY_FIELDS: Final = (
    "daily_quota",
    "daily_share",
    "daily_reset_time_zone",
    "dailyQuota",
    "dailyShare",
    "dailyResetTimeZone",
)


class RateLimit(PackModel):
    """The remote's request budget (SPEC PROF-3): at most `requests` per `per_seconds`."""

    requests: int = Field(ge=1)
    per_seconds: float = Field(gt=0, le=86_400)
    # NF-8: the remote's daily quota, the share of it this product may spend,
    # and the zone whose midnight resets it (protocol.daily_quota).
    daily_quota: int | None = Field(default=None, ge=1)
    daily_share: float = Field(default=1.0, gt=0, le=1)
    daily_reset_time_zone: TimeZoneName = DEFAULT_DAILY_RESET_TIME_ZONE

    @property
    def per_second(self) -> float:
        return self.requests / self.per_seconds

    @model_serializer(mode="wrap")
    def _without_an_undeclared_quota(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A limit without a daily quota dumps as before it existed: the manifest's digest
        of a pack that declares none is unchanged (the same pack applies unchanged)."""
        data = handler(self)
        if self.daily_quota is None and isinstance(data, dict):
            for name in _DAILY_FIELDS:
                data.pop(name, None)
        return data

    @_model_validator(mode="after")
    def _daily_share_of_a_quota(self) -> RateLimit:
        # Their defaults pass: a dumped manifest carries them and must parse again.
        if self.daily_quota is None:
            if (
                self.daily_share != 1.0
                or self.daily_reset_time_zone != DEFAULT_DAILY_RESET_TIME_ZONE
            ):
                raise ValueError("dailyShare and dailyResetTimeZone need a dailyQuota")
        elif daily_allowance(self.daily_quota, self.daily_share) < 1:
            raise ValueError("dailyQuota x dailyShare allows no request a day (below 1)")
        return self


class Profile(PackModel):
    name: StableId
    credential_ref: CredentialRef
    credential_generation: str | None = None
    credential_rotation_same_destination: bool = False
    endpoint_class: NonEmpty
    base_url: BaseUrl
    retry_policy: RetryPolicy
    idempotency: Idempotency = Idempotency()
    precondition: Precondition | None = None
    locator_recovery: LocatorRecovery | None = None
    # PROF-3: shared by every profile using the same credential on the same remote scope.
    rate_limit: RateLimit | None = None
    # PROF-1: answers the remote documents as "not processed" (e.g. 429): such a try had
    # no effect, so the same frozen request is re-sent after Retry-After, within a time
    # budget that does not use up the retry count.
    not_applied_statuses: tuple[HttpErrorStatus, ...] = ()
    not_applied_budget_seconds: int = Field(default=900, gt=0, le=86_400)
    # PROF-1 by status and body (e.g. a 400 whose error array says a row was locked).
    not_applied_answers: tuple[AnswerMatch, ...] = ()
    # PROF-5: how the remote says its daily allocation is spent, and when it frees.
    daily_limit: DailyLimit | None = None
    readback: Readback | None = None
    # PROF-4: a remote id must fully match this pattern (beyond the default rule).
    remote_id_pattern: Regex | None = None

    @_model_validator(mode="after")
    def _readback_needs_precondition(self) -> Profile:
        if self.readback is not None and self.precondition is None:
            raise ValueError("readback: only a profile with a precondition may declare one")
        return self

    @model_serializer(mode="wrap")
    def _without_undeclared_answers(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Undeclared, PROF-5's fields dump as before they existed (digests stand)."""
        data = handler(self)
        if isinstance(data, dict):
            for name in ("not_applied_answers", "notAppliedAnswers"):
                if data.get(name, ...) in ((), []):
                    data.pop(name)
        return _without_none(data, ("daily_limit", "dailyLimit"))

    @_model_validator(mode="after")
    def _answers_provable(self) -> Profile:
        problems = list(_answer_problems(self))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def declares_not_applied(self, answer: AnswerMatch) -> bool:
        """`answer` always proves no effect: its status alone, or a body-matched answer
        at most as specific as it (PROF-1)."""
        if answer.status in self.not_applied_statuses:
            return True
        return any(
            declared.status == answer.status and (declared.body_field is None or declared == answer)
            for declared in self.not_applied_answers
        )


# 4xx answers that do not prove a create had no effect (protocol.recovery's
# CREATE_NOT_DEFINITE, equal by test): the send journal records statuses, not bodies,
# so a body-matched "not applied" answer must have a status it proves by itself.
JOURNAL_NOT_DEFINITE_4XX: Final = frozenset({408, 409, 425, 429})


def _answer_problems(p: Profile) -> Iterator[str]:
    for i, answer in enumerate(p.not_applied_answers):
        if answer.status in JOURNAL_NOT_DEFINITE_4XX or answer.status >= 500:
            yield (
                f"notAppliedAnswers[{i}].status: {answer.status} needs the body to prove no"
                " effect, which the send journal does not keep: use notAppliedStatuses"
            )
    if p.daily_limit is None:
        return
    if not p.declares_not_applied(p.daily_limit.answer):
        yield (
            "dailyLimit.answer: also declare it not applied (notAppliedStatuses or"
            " notAppliedAnswers): the refused request is sent again after the reset"
        )
    limit = p.rate_limit
    if limit is not None and limit.daily_reset_time_zone != DEFAULT_DAILY_RESET_TIME_ZONE:
        yield "rateLimit.dailyResetTimeZone: the reset is declared once, in dailyLimit.reset"
    if limit is not None and limit.daily_quota and p.daily_limit.reset.rolling_hours:
        yield (
            "rateLimit.dailyQuota: a share of a rolling window is not counted;"
            " declare dailyLimit alone (its refusal pauses the budget)"
        )


class LineageEntry(PackModel):
    kind: LineageKind
    from_slot: StableId
    to_slot: StableId | None = None

    @_model_validator(mode="after")
    def _target_matches_kind(self) -> LineageEntry:
        if self.kind is LineageKind.REBIND and self.to_slot is None:
            raise ValueError("toSlot: a rebind needs a target slot")
        if self.kind is LineageKind.RETIRE and self.to_slot is not None:
            raise ValueError("toSlot: a retirement has no target slot")
        return self


class SeparateOwnership(PackModel):
    """Two action slots of one source object that create at one remote destination, each
    owning its own remote object for a record (SPEC G-2: declared deliberately separate,
    e.g. a billing and a shipping contact of one account). Without it `pack apply`
    refuses such a pair: two creators of one record at one destination is two objects."""

    action_slots: tuple[StableId, StableId]
    reason: NonEmpty

    @_model_validator(mode="after")
    def _two_slots(self) -> SeparateOwnership:
        if self.action_slots[0] == self.action_slots[1]:
            raise ValueError("actionSlots: name two different action slots")
        return self


class PackManifest(PackModel):
    connector_owner_key: StableId
    namespace: NonEmpty
    action_slots: tuple[ActionSlot, ...] = Field(min_length=1)
    destination_slots: tuple[DestinationSlot, ...] = Field(min_length=1)
    profiles: tuple[Profile, ...] = Field(min_length=1)
    lineage: tuple[LineageEntry, ...] = ()
    separate_ownership: tuple[SeparateOwnership, ...] = ()

    @_model_validator(mode="after")
    def _references_resolve(self) -> PackManifest:
        problems = list(_manifest_problems(self))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def action_slot(self, slot_id: str) -> ActionSlot | None:
        return next((s for s in self.action_slots if s.id == slot_id), None)

    def destination_slot(self, slot_id: str) -> DestinationSlot | None:
        return next((d for d in self.destination_slots if d.id == slot_id), None)

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def remote_destination(self, destination_slot_id: str) -> RemoteDestination | None:
        """Where a destination slot creates: its remote scope and target object (G-2)."""
        dest = self.destination_slot(destination_slot_id)
        return None if dest is None else (dest.remote_scope, dest.target_object)

    def separate_pairs(self) -> frozenset[frozenset[str]]:
        """The action-slot pairs declared deliberately separate owners (G-2)."""
        return frozenset(frozenset(entry.action_slots) for entry in self.separate_ownership)


def _duplicates(field: str, ids: list[str]) -> Iterator[str]:
    seen: set[str] = set()
    for index, value in enumerate(ids):
        if value in seen:
            yield f"{field}[{index}]: duplicate id {value!r}"
        seen.add(value)


def _manifest_problems(m: PackManifest) -> Iterator[str]:
    yield from _duplicates("actionSlots", [s.id for s in m.action_slots])
    yield from _duplicates("destinationSlots", [d.id for d in m.destination_slots])
    yield from _duplicates("profiles", [p.name for p in m.profiles])
    slots = {s.id for s in m.action_slots}
    destinations = {d.id for d in m.destination_slots}
    profiles = {p.name for p in m.profiles}
    for i, slot in enumerate(m.action_slots):
        if slot.destination_slot not in destinations:
            yield (
                f"actionSlots[{i}].destinationSlot: {slot.destination_slot!r} "
                "is not declared in destinationSlots"
            )
        for j, assoc in enumerate(slot.associations):
            if assoc.target_action_slot not in slots:
                yield (
                    f"actionSlots[{i}].associations[{j}].targetActionSlot: "
                    f"{assoc.target_action_slot!r} is not a declared action slot"
                )
    for i, dest in enumerate(m.destination_slots):
        if dest.profile not in profiles:
            yield f"destinationSlots[{i}].profile: {dest.profile!r} is not a declared profile"
    yield from _lineage_problems(m, slots)
    for i, entry in enumerate(m.separate_ownership):
        for j, slot_id in enumerate(entry.action_slots):
            if slot_id not in slots:
                yield (
                    f"separateOwnership[{i}].actionSlots[{j}]: {slot_id!r} "
                    "is not a declared action slot"
                )


def _lineage_problems(m: PackManifest, slots: set[str]) -> Iterator[str]:
    edges: dict[str, str] = {}
    for i, entry in enumerate(m.lineage):
        if entry.from_slot in edges or entry.from_slot in {e.from_slot for e in m.lineage[:i]}:
            yield f"lineage[{i}].fromSlot: {entry.from_slot!r} already has a lineage entry"
        if entry.from_slot in slots:
            yield f"lineage[{i}].fromSlot: {entry.from_slot!r} is still an active action slot"
        if entry.to_slot is not None:
            edges[entry.from_slot] = entry.to_slot
    for i, entry in enumerate(m.lineage):
        if entry.to_slot is not None and _reaches(edges, entry.to_slot, entry.from_slot):
            yield f"lineage[{i}]: cycle through {entry.from_slot!r}"


def _reaches(edges: Mapping[str, str], start: str, goal: str) -> bool:
    node: str | None = start
    visited: set[str] = set()
    while node is not None and node not in visited:
        if node == goal:
            return True
        visited.add(node)
        node = edges.get(node)
    return False


def lineage_predecessors(manifest: PackManifest, slot_id: str) -> tuple[str, ...]:
    """Every slot id rebound (directly or transitively) into `slot_id` (ID-6)."""
    found: list[str] = []
    frontier = [slot_id]
    while frontier:
        current = frontier.pop()
        for entry in manifest.lineage:
            if entry.to_slot == current and entry.from_slot not in found:
                found.append(entry.from_slot)
                frontier.append(entry.from_slot)
    return tuple(found)


class ManifestInvalid(ValueError):
    """A manifest rejected before anything is written; `problems` are `path: message`."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("invalid pack manifest:\n  " + "\n  ".join(problems))
        self.problems = problems


_SEGMENT: Final = r"[A-Za-z][A-Za-z0-9]*(?:\[\d+\])*"
_RELATIVE_PATH: Final = re.compile(rf"^({_SEGMENT}(?:\.{_SEGMENT})*): ")


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    """`path: message`, folding a validator's own `field: ...` prefix into the path."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    message = message.removeprefix("Value error, ")
    relative = _RELATIVE_PATH.match(message)
    if relative:
        path = f"{path}.{relative.group(1)}" if path else relative.group(1)
        message = message[relative.end() :]
    return f"{path or 'manifest'}: {message}"


def parse_manifest(data: Mapping[str, object]) -> PackManifest:
    """Validate a parsed manifest document; raises `ManifestInvalid`."""
    if (found := unstorable_at(dict(data))) is not None:  # NaN, "\0": the database refuses
        where, reason = found
        raise ManifestInvalid((f"{location_text(where)}: {MEANINGS[reason]}",))
    try:
        return PackManifest.model_validate(data)
    except ValidationError as error:
        problems = tuple(
            _problem(e["loc"], line.removeprefix("Value error, "))
            for e in error.errors()
            for line in e["msg"].split("\n")
        )
        # Not chained: the ValidationError holds the input (possibly a pasted secret).
        raise ManifestInvalid(problems) from None
