"""POST-4 / REC-1 / PATCH-3 outcome interpretation tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from protocol.errors import SuspendReason
from protocol.outcome import (
    Ambiguous,
    Created,
    LocatorAbsent,
    LocatorFound,
    NotApplied,
    Observation,
    PatchAmbiguous,
    PatchConflict,
    PatchFailed,
    PatchRetry,
    PatchSucceeded,
    PatchSuspendLink,
    PostOutcome,
    RateLimited,
    RemoteRejected,
    Transport,
    interpret_locator_lookup,
    interpret_patch,
    interpret_post,
    parse_retry_after,
)
from protocol.snapshots import ProfileSnapshot
from tests.unit.factories import demo_manifest

MANIFEST = demo_manifest()
IDEMPOTENT = ProfileSnapshot.of(MANIFEST.profiles[0])
PLAIN = ProfileSnapshot.of(MANIFEST.profiles[1])
LOCATOR = ProfileSnapshot.of(MANIFEST.profiles[2])
# The demo pack declares 429 "not applied" (PROF-1); without it the POST-4 rule stands.
UNDECLARED_IDEMPOTENT = IDEMPOTENT.model_copy(update={"not_applied_statuses": ()})
UNDECLARED_PLAIN = PLAIN.model_copy(update={"not_applied_statuses": ()})


def response(status: int, body: object = None, **headers: str) -> Observation:
    raw = json.dumps(body).encode() if body is not None else None
    return Observation(transport=Transport.RESPONSE, status=status, body=raw, headers=headers)


def kind(outcome: PostOutcome) -> str:
    return outcome.kind


@pytest.mark.parametrize(
    ("obs", "profile", "expected"),
    [
        (response(201, {"id": "42"}), PLAIN, "created"),
        (response(200, {"id": 42}), PLAIN, "created"),
        (response(200, {"status": "ok"}), PLAIN, "ambiguous"),
        (response(201), IDEMPOTENT, "ambiguous"),
        (response(400, {"message": "bad"}), PLAIN, "remote_rejected"),
        (response(422), IDEMPOTENT, "remote_rejected"),
        (response(404), PLAIN, "remote_rejected"),
        (response(409, {"message": "exists"}), PLAIN, "ambiguous"),
        (response(408), IDEMPOTENT, "retry_same_request"),
        (response(408), PLAIN, "ambiguous"),
        (response(425), IDEMPOTENT, "retry_same_request"),
        (response(425), PLAIN, "ambiguous"),
        (response(429, **{"Retry-After": "3"}), UNDECLARED_IDEMPOTENT, "rate_limited"),
        (response(429), UNDECLARED_PLAIN, "ambiguous"),
        (response(429, **{"Retry-After": "3"}), IDEMPOTENT, "not_applied"),
        (response(429), PLAIN, "not_applied"),
        (response(429), LOCATOR, "not_applied"),
        (response(503), PLAIN.model_copy(update={"not_applied_statuses": (503,)}), "not_applied"),
        (response(500), IDEMPOTENT, "retry_same_request"),
        (response(503), PLAIN, "ambiguous"),
        (response(502), LOCATOR, "ambiguous"),
        (response(302), PLAIN, "ambiguous"),
        (Observation(transport=Transport.TIMEOUT), PLAIN, "ambiguous"),
        (Observation(transport=Transport.RESET_AFTER_SEND), PLAIN, "ambiguous"),
        (Observation(transport=Transport.ERROR_AFTER_SEND), PLAIN, "ambiguous"),
        (Observation(transport=Transport.TIMEOUT), IDEMPOTENT, "retry_same_request"),
        # Whether an earlier try landed is the journal's question (tests/unit/test_recovery).
        (Observation(transport=Transport.NOT_SENT), PLAIN, "retry_same_request"),
        (Observation(transport=Transport.NOT_SENT), IDEMPOTENT, "retry_same_request"),
        # PROF-4: a success whose id is not canonical is no id.
        (response(201, {"id": " 42"}), PLAIN, "ambiguous"),
        (response(201, {"id": "4\u00002"}), PLAIN, "ambiguous"),
    ],
)
def test_post_interpretation(obs: Observation, profile: ProfileSnapshot, expected: str) -> None:
    assert kind(interpret_post(obs, "$.id", profile)) == expected


def test_created_carries_remote_id_from_frozen_path() -> None:
    outcome = interpret_post(response(200, {"results": [{"id": "7"}]}), "$.results[0].id", PLAIN)
    assert isinstance(outcome, Created) and outcome.remote_id == "7"
    # The same body under a different frozen path is not a success.
    assert isinstance(interpret_post(response(200, {"results": []}), "$.id", PLAIN), Ambiguous)


def test_ambiguous_reports_locator_recovery() -> None:
    outcome = interpret_post(Observation(transport=Transport.TIMEOUT), "$.id", LOCATOR)
    assert isinstance(outcome, Ambiguous) and outcome.locator_recovery
    plain = interpret_post(Observation(transport=Transport.TIMEOUT), "$.id", PLAIN)
    assert isinstance(plain, Ambiguous) and not plain.locator_recovery


def test_rejected_and_rate_limited_details() -> None:
    rejected = interpret_post(response(400, {"m": 1}), "$.id", PLAIN)
    assert isinstance(rejected, RemoteRejected) and rejected.status == 400
    limited = interpret_post(response(429, **{"Retry-After": "3"}), "$.id", UNDECLARED_IDEMPOTENT)
    assert limited == RateLimited(retry_after_seconds=3.0)
    refused = interpret_post(response(429, **{"Retry-After": "3"}), "$.id", PLAIN)
    assert refused == NotApplied(status=429, retry_after_seconds=3.0)


def test_retry_after_http_date_uses_callers_clock() -> None:
    now = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", now) == 10.0
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", None) is None
    assert parse_retry_after("soon", now) is None


def test_locator_lookup() -> None:
    found = interpret_locator_lookup(response(200, {"id": "55"}), "$.id")
    assert found == LocatorFound(remote_id="55")
    assert interpret_locator_lookup(response(404), "$.id") == LocatorAbsent()
    assert isinstance(interpret_locator_lookup(response(500), "$.id"), Ambiguous)


REPLAY_SAFE_PATCH = PLAIN.model_copy(update={"patch_replay_safe": True})
UNSAFE_PATCH = UNDECLARED_PLAIN


@pytest.mark.parametrize(
    ("obs", "profile", "expected"),
    [
        (response(200, {"id": "1"}), UNSAFE_PATCH, PatchSucceeded()),
        (
            response(404),
            UNSAFE_PATCH,
            PatchSuspendLink(reason=SuspendReason.REMOTE_DELETED, status=404),
        ),
        (
            response(410),
            REPLAY_SAFE_PATCH,
            PatchSuspendLink(reason=SuspendReason.REMOTE_DELETED, status=410),
        ),
        (response(409), UNSAFE_PATCH, PatchConflict(status=409)),
        (response(412), REPLAY_SAFE_PATCH, PatchConflict(status=412)),
        (response(400), UNSAFE_PATCH, PatchFailed(status=400)),
        # C-2: a try that may have landed is never re-sent, replay-safe profile or not.
        (response(503), REPLAY_SAFE_PATCH, PatchAmbiguous(reason="status_503_may_have_landed")),
        (response(503), UNSAFE_PATCH, PatchAmbiguous(reason="status_503_may_have_landed")),
        (
            response(429, **{"Retry-After": "2"}),
            PLAIN,
            NotApplied(status=429, retry_after_seconds=2),
        ),
        (Observation(transport=Transport.TIMEOUT), UNSAFE_PATCH, PatchAmbiguous(reason="timeout")),
        (
            Observation(transport=Transport.TIMEOUT),
            REPLAY_SAFE_PATCH,
            PatchAmbiguous(reason="timeout"),
        ),
        # This try left nothing; the journal decides whether the next one may send.
        (Observation(transport=Transport.NOT_SENT), UNSAFE_PATCH, PatchRetry()),
    ],
)
def test_patch_interpretation(obs: Observation, profile: ProfileSnapshot, expected: object) -> None:
    assert interpret_patch(obs, profile) == expected
