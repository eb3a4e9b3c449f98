"""Remote outcome interpretation (SPEC POST-4, REC-1, PATCH-3).

Every function maps what the transport observed to the one thing the caller
may do next. Replaying a request is allowed only when the *frozen* profile
declares it replay-safe; anything else that may have had an effect is ambiguous.
"""

from __future__ import annotations

import json
from datetime import datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Literal, assert_never

from pydantic import Field, JsonValue, field_validator

from protocol.canonical import sha256_hex
from protocol.errors import SuspendReason
from protocol.jsonpath import extract_id
from protocol.manifest import AnswerMatch
from protocol.recovery import PATCH_CONFLICT, RETRYABLE_4XX, SendOutcome
from protocol.remote_ids import is_canonical
from protocol.snapshots import ProfileSnapshot, Snapshot

_RETRY_STATUSES = RETRYABLE_4XX
_PATCH_DELETED = frozenset({404, 410})
_NOT_UNIQUE = 300  # Multiple Choices: a look-up's value names more than one object


class Transport(StrEnum):
    RESPONSE = "response"  # an HTTP status line was read
    NOT_SENT = "not_sent"  # connect failed: the request provably never left
    TIMEOUT = "timeout"  # the request may have been sent
    RESET_AFTER_SEND = "reset_after_send"
    ERROR_AFTER_SEND = "error_after_send"


class Observation(Snapshot):
    """What one send observed (earlier tries are the send journal's business)."""

    transport: Transport
    status: int | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: bytes | None = None
    now: datetime | None = None  # only to resolve an HTTP-date Retry-After

    @field_validator("headers")
    @classmethod
    def _lowercase_names(cls, headers: dict[str, str]) -> dict[str, str]:
        return {name.lower(): value for name, value in headers.items()}


class Created(Snapshot):
    kind: Literal["created"] = "created"
    remote_id: str
    status: int
    body_hash: str


class RemoteRejected(Snapshot):
    kind: Literal["remote_rejected"] = "remote_rejected"
    status: int
    body_hash: str | None


class RetrySameRequest(Snapshot):
    kind: Literal["retry_same_request"] = "retry_same_request"
    reason: str


class RateLimited(Snapshot):
    kind: Literal["rate_limited"] = "rate_limited"
    retry_after_seconds: float | None


class NotApplied(Snapshot):
    """PROF-1: the remote answered a status the frozen contract declares "not processed":
    this try had no effect; the same frozen request may be re-sent after `retry_after`."""

    kind: Literal["not_applied"] = "not_applied"
    status: int
    retry_after_seconds: float | None
    # PROF-5: the answer is the frozen contract's daily limit: the budget waits for its reset.
    daily_limit: bool = False


class Ambiguous(Snapshot):
    """No POST may follow; `locator_recovery` says a unique-locator lookup may resolve it."""

    kind: Literal["ambiguous"] = "ambiguous"
    reason: str
    locator_recovery: bool


PostOutcome = Created | RemoteRejected | RetrySameRequest | RateLimited | NotApplied | Ambiguous


def body_hash(body: bytes | None) -> str | None:
    return sha256_hex(body) if body is not None else None


def parse_json(body: bytes | None) -> JsonValue | None:
    try:
        parsed: JsonValue = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None
    return parsed


def parse_retry_after(value: str | None, now: datetime | None) -> float | None:
    """Delta-seconds, or an HTTP-date resolved against the caller's clock."""
    if value is None:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - now).total_seconds()) if now is not None else None


def interpret_post(
    obs: Observation, response_id_path: str, profile: ProfileSnapshot
) -> PostOutcome:
    """Interpret one create POST against the frozen `responseIdPath` and profile."""
    locator = profile.locator_recovery is not None
    replay_safe = profile.post_replay_safe
    match obs.transport:
        case Transport.NOT_SENT:
            # This try proved nothing left; whether an earlier one landed is the journal's
            # question, answered by the next try's plan (protocol.recovery.next_step).
            return RetrySameRequest(reason="not_sent")
        case Transport.TIMEOUT | Transport.RESET_AFTER_SEND | Transport.ERROR_AFTER_SEND:
            if replay_safe:
                return RetrySameRequest(reason=f"{obs.transport.value}_replay_safe")
            return Ambiguous(reason=obs.transport.value, locator_recovery=locator)
        case Transport.RESPONSE:
            return _interpret_status(obs, response_id_path, profile)
        case _:
            assert_never(obs.transport)


def answer_matches(declared: AnswerMatch, status: int | None, body: bytes | None) -> bool:
    """The answer is the declared one: its status, and where a body field is declared, that
    field holding the value in the JSON object or in any object of a JSON array."""
    if status != declared.status:
        return False
    if declared.body_field is None:
        return True
    parsed = parse_json(body)
    items = parsed if isinstance(parsed, list) else [parsed]
    return any(
        isinstance(item, dict) and item.get(declared.body_field) == declared.body_value
        for item in items
    )


def _not_applied(obs: Observation, profile: ProfileSnapshot) -> NotApplied | None:
    status = obs.status
    declared = status in profile.not_applied_statuses or any(
        answer_matches(answer, status, obs.body) for answer in profile.not_applied_answers
    )
    if status is None or not declared:
        return None
    daily = profile.daily_limit
    retry_after = parse_retry_after(obs.headers.get("retry-after"), obs.now)
    return NotApplied(
        status=status,
        retry_after_seconds=retry_after,
        daily_limit=daily is not None and answer_matches(daily.answer, status, obs.body),
    )


def _interpret_status(
    obs: Observation, response_id_path: str, profile: ProfileSnapshot
) -> PostOutcome:
    locator = profile.locator_recovery is not None
    replay_safe = profile.post_replay_safe
    status = obs.status or 0
    if refused := _not_applied(obs, profile):
        return refused
    if 200 <= status < 300:
        remote_id = extract_id(parse_json(obs.body), response_id_path)
        if remote_id is None or not is_canonical(remote_id, profile.remote_id_pattern):
            # PROF-4: an id we could not store as given is no id: the object may exist.
            return Ambiguous(reason="unparseable_success", locator_recovery=locator)
        return Created(remote_id=remote_id, status=status, body_hash=body_hash(obs.body) or "")
    if status in _RETRY_STATUSES or 500 <= status < 600:
        if not replay_safe:
            return Ambiguous(reason=f"status_{status}_not_replay_safe", locator_recovery=locator)
        if status == 429:
            retry_after = parse_retry_after(obs.headers.get("retry-after"), obs.now)
            return RateLimited(retry_after_seconds=retry_after)
        return RetrySameRequest(reason=f"status_{status}")
    if 400 <= status < 500 and status != 409:
        return RemoteRejected(status=status, body_hash=body_hash(obs.body))
    # 409 (e.g. a unique value already exists), 1xx/3xx or no status: effect unknown.
    return Ambiguous(reason=f"status_{status}", locator_recovery=locator)


class LocatorFound(Snapshot):
    kind: Literal["locator_found"] = "locator_found"
    remote_id: str


class LocatorAbsent(Snapshot):
    """The unique locator proves no object was created: the same frozen request may be
    re-sent (the remote's uniqueness on the locator property rejects a duplicate)."""

    kind: Literal["locator_absent"] = "locator_absent"


LocatorOutcome = LocatorFound | LocatorAbsent | Ambiguous


def lookup_id_path(response_id_path: str, profile: ProfileSnapshot) -> str:
    """Where a locator look-up's answer holds the id: the declared path, else the create's."""
    recovery = profile.locator_recovery
    declared = recovery.response_id_path if recovery is not None else None
    return declared or response_id_path


def interpret_locator_lookup(obs: Observation, response_id_path: str) -> LocatorOutcome:
    """404: no object carries the locator; 200 with an id: found; 300 Multiple Choices:
    more than one does, which no later look-up can settle (no recovery left); anything
    else: inconclusive, looked up again. Never a re-send."""
    if obs.transport is Transport.RESPONSE and obs.status == 404:
        return LocatorAbsent()
    if obs.transport is Transport.RESPONSE and obs.status == _NOT_UNIQUE:
        return Ambiguous(reason="locator_not_unique", locator_recovery=False)
    if obs.transport is Transport.RESPONSE and obs.status == 200:
        remote_id = extract_id(parse_json(obs.body), response_id_path)
        if remote_id is not None:
            return LocatorFound(remote_id=remote_id)
    return Ambiguous(reason="locator_lookup_inconclusive", locator_recovery=True)


class PatchSucceeded(Snapshot):
    kind: Literal["patch_succeeded"] = "patch_succeeded"
    etag: str | None = None  # from a read-back, when that is what proved it applied


class PatchSuspendLink(Snapshot):
    kind: Literal["patch_suspend_link"] = "patch_suspend_link"
    reason: SuspendReason
    status: int


class PatchFailed(Snapshot):
    kind: Literal["patch_failed"] = "patch_failed"
    status: int


class PatchRetry(Snapshot):
    kind: Literal["patch_retry"] = "patch_retry"
    retry_after_seconds: float | None = None


class PatchAmbiguous(Snapshot):
    kind: Literal["patch_ambiguous"] = "patch_ambiguous"
    reason: str


class PatchEtagMoved(Snapshot):
    """PROF-2: the read-back shows an earlier PATCH of ours, not this one: the entity tag
    moved because of us; store it and send this PATCH again."""

    kind: Literal["patch_etag_moved"] = "patch_etag_moved"
    etag: str | None


class PatchConflict(Snapshot):
    """409/412: a remote conflict, unless an earlier try of ours caused it (PROF-2)."""

    kind: Literal["patch_conflict"] = "patch_conflict"
    status: int


PatchOutcome = (
    PatchSucceeded
    | PatchEtagMoved
    | PatchSuspendLink
    | PatchConflict
    | PatchFailed
    | PatchRetry
    | NotApplied
    | PatchAmbiguous
)


def interpret_patch(obs: Observation, profile: ProfileSnapshot) -> PatchOutcome:
    """PATCH-3: 404/410 suspend the link, 409/412 are conflicts; never a replacement POST.

    C-2: a try that may have landed (no answer, a 5xx, an undeclared 408/425/429) is
    ambiguous whatever the profile says about replay safety: it is never sent again
    (a declared read-back may still prove it applied)."""
    if obs.transport is Transport.NOT_SENT:
        return PatchRetry()  # this try left nothing; the journal decides the next one
    if obs.transport is not Transport.RESPONSE or obs.status is None:
        return PatchAmbiguous(reason=obs.transport.value)
    status = obs.status
    if refused := _not_applied(obs, profile):
        return refused
    if 200 <= status < 300:
        return PatchSucceeded()
    if status in _PATCH_DELETED:
        return PatchSuspendLink(reason=SuspendReason.REMOTE_DELETED, status=status)
    if status in PATCH_CONFLICT:
        return PatchConflict(status=status)
    if status in _RETRY_STATUSES or 500 <= status < 600:
        return PatchAmbiguous(reason=f"status_{status}_may_have_landed")
    if 400 <= status < 500:
        return PatchFailed(status=status)
    return PatchAmbiguous(reason=f"status_{status}")


def send_outcome(obs: Observation) -> SendOutcome:
    """The journal's transport outcome of one try (JRN-1)."""
    match obs.transport:
        case Transport.NOT_SENT:
            return SendOutcome.NOT_SENT
        case Transport.RESPONSE:
            return SendOutcome.ANSWERED
        case Transport.TIMEOUT | Transport.RESET_AFTER_SEND | Transport.ERROR_AFTER_SEND:
            return SendOutcome.NO_ANSWER
        case _:
            assert_never(obs.transport)
