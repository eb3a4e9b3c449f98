"""PROF-5, PROF-1 (issue 52): the answers a profile declares, not the runtime: a "not
applied" answer by status and body field (an error array searched too), the daily limit's
answer and reset rule; `pack apply`'s one-line refusals; digests of packs that declare
none unchanged; the drift row that classifies a change (profile payload). Pure."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol.daily_quota import refusal_resets_at
from protocol.drift import Disposition, DriftSurface, classify
from protocol.manifest import (
    JOURNAL_NOT_DEFINITE_4XX,
    AnswerMatch,
    DailyReset,
    ManifestInvalid,
    parse_manifest,
)
from protocol.outcome import (
    Ambiguous,
    LocatorAbsent,
    LocatorFound,
    NotApplied,
    Observation,
    PatchSucceeded,
    RemoteRejected,
    Transport,
    answer_matches,
    interpret_locator_lookup,
    interpret_patch,
    interpret_post,
    lookup_id_path,
)
from protocol.recovery import CREATE_NOT_DEFINITE
from protocol.snapshots import ProfileSnapshot, profile_payload_hash
from tests.unit.factories import contact_active, contact_attempt, contact_link, demo_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = datetime(2026, 3, 4, 15, 30, tzinfo=UTC)
LIMIT = AnswerMatch(status=403, body_field="errorCode", body_value="REQUEST_LIMIT_EXCEEDED")


def salesforce_doc() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / "salesforce.yaml").read_text())
    return loaded


def sf_profile() -> ProfileSnapshot:
    return ProfileSnapshot.build(parse_manifest(salesforce_doc()).profiles[0])


def errors(*codes: str) -> bytes:
    return json.dumps([{"message": "m", "errorCode": c, "fields": []} for c in codes]).encode()


def answer(status: int, body: bytes | None = None) -> Observation:
    return Observation(transport=Transport.RESPONSE, status=status, body=body, now=NOW)


def test_an_answer_matches_by_status_and_a_body_field_in_an_object_or_an_array() -> None:
    assert answer_matches(LIMIT, 403, errors("REQUEST_LIMIT_EXCEEDED"))
    assert answer_matches(LIMIT, 403, errors("INVALID_FIELD", "REQUEST_LIMIT_EXCEEDED"))
    assert answer_matches(LIMIT, 403, b'{"errorCode": "REQUEST_LIMIT_EXCEEDED"}')
    assert not answer_matches(LIMIT, 400, errors("REQUEST_LIMIT_EXCEEDED"))
    assert not answer_matches(LIMIT, 403, errors("INSUFFICIENT_ACCESS"))
    assert not answer_matches(LIMIT, 403, b"not json")
    assert not answer_matches(LIMIT, 403, None)
    assert answer_matches(AnswerMatch(status=503), 503, None)


def test_the_salesforce_refusals_are_declared_not_applied_and_one_is_the_daily_limit() -> None:
    """403 REQUEST_LIMIT_EXCEEDED and 400 UNABLE_TO_LOCK_ROW: no effect, re-sent; the 403 is
    the daily limit. The same statuses with another code are definite rejections."""
    profile = sf_profile()
    limit = interpret_post(answer(403, errors("REQUEST_LIMIT_EXCEEDED")), "$.id", profile)
    locked = interpret_post(answer(400, errors("UNABLE_TO_LOCK_ROW")), "$.id", profile)
    refused = interpret_post(answer(403, errors("INSUFFICIENT_ACCESS")), "$.id", profile)
    invalid = interpret_post(answer(400, errors("INVALID_FIELD")), "$.id", profile)

    assert limit == NotApplied(status=403, retry_after_seconds=None, daily_limit=True)
    assert locked == NotApplied(status=400, retry_after_seconds=None, daily_limit=False)
    assert isinstance(refused, RemoteRejected) and isinstance(invalid, RemoteRejected)
    patch_limit = interpret_patch(answer(403, errors("REQUEST_LIMIT_EXCEEDED")), profile)
    assert isinstance(patch_limit, NotApplied) and patch_limit.daily_limit


def test_an_update_answered_204_with_no_body_succeeded() -> None:
    assert interpret_patch(answer(204, b""), sf_profile()) == PatchSucceeded()


def test_the_demo_packs_daily_limit_is_its_declaration_not_the_runtimes() -> None:
    """HubSpot's `policyName: DAILY` lives in the demo pack: without the declaration the
    same 429 is a plain "not applied" answer (no day ends)."""
    daily = json.dumps({"status": "error", "policyName": "DAILY"}).encode()
    burst = json.dumps({"status": "error", "policyName": "TEN_SECONDLY_ROLLING"}).encode()
    declared = ProfileSnapshot.build(demo_manifest().profiles[0])
    undeclared = declared.model_copy(update={"daily_limit": None})

    assert interpret_post(answer(429, daily), "$.id", declared) == NotApplied(
        status=429, retry_after_seconds=None, daily_limit=True
    )
    burst_outcome = interpret_post(answer(429, burst), "$.id", declared)
    assert isinstance(burst_outcome, NotApplied) and not burst_outcome.daily_limit
    plain = interpret_post(answer(429, daily), "$.id", undeclared)
    assert isinstance(plain, NotApplied) and not plain.daily_limit


def test_a_locator_lookup_reads_the_id_where_the_profile_declares_it() -> None:
    """404: absent (re-send); 300: the value is not unique (inconclusive, never a re-send)."""
    path = lookup_id_path("$.id", sf_profile())
    found = answer(200, b'{"attributes": {"type": "Contact"}, "Id": "003000000000001AAA"}')

    assert path == "$.Id"
    assert interpret_locator_lookup(found, path) == LocatorFound(remote_id="003000000000001AAA")
    assert interpret_locator_lookup(answer(404, errors("NOT_FOUND")), path) == LocatorAbsent()
    not_unique = interpret_locator_lookup(answer(300, b'["/a", "/b"]'), path)
    assert not_unique == Ambiguous(reason="locator_not_unique", locator_recovery=False)
    again = interpret_locator_lookup(answer(503), path)
    assert isinstance(again, Ambiguous) and again.locator_recovery  # looked up again
    assert lookup_id_path("$.id", ProfileSnapshot.build(demo_manifest().profiles[2])) == "$.id"


def test_a_refused_day_frees_at_the_declared_reset() -> None:
    assert refusal_resets_at(NOW, DailyReset(rolling_hours=24)) == NOW + timedelta(hours=24)
    midnight_ny = datetime(2026, 3, 5, 5, 0, tzinfo=UTC)  # EST, UTC-5
    assert refusal_resets_at(NOW, DailyReset(time_zone="America/New_York")) == midnight_ny
    assert refusal_resets_at(NOW, None) == datetime(2026, 3, 5, tzinfo=UTC)


def _profile(**fields: Any) -> Any:
    return lambda d: d["profiles"][0].update(fields)


UTC_ZONE = {"timeZone": "UTC"}
ONE_PER_S = {"requests": 1, "perSeconds": 1}
SF_LIMIT = {"status": 403, "bodyField": "errorCode", "bodyValue": "REQUEST_LIMIT_EXCEEDED"}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"notAppliedAnswers": [{"status": 403, "bodyField": "errorCode"}]},
            "profiles[0].notAppliedAnswers[0]: bodyField and bodyValue are declared together",
        ),
        (
            {"notAppliedAnswers": [{"status": 503, "bodyField": "e", "bodyValue": "x"}]},
            "profiles[0].notAppliedAnswers[0].status: 503 needs the body to prove no effect",
        ),
        (
            {"notAppliedAnswers": [{"status": 429, "bodyField": "e", "bodyValue": "x"}]},
            "profiles[0].notAppliedAnswers[0].status: 429 needs the body",
        ),
        (
            {"dailyLimit": {"answer": SF_LIMIT, "reset": {"rollingHours": 24}}},
            "profiles[0].dailyLimit.answer: also declare it not applied",
        ),
        (
            {
                "notAppliedAnswers": [SF_LIMIT],
                "dailyLimit": {
                    "answer": SF_LIMIT,
                    "reset": {"rollingHours": 24, "timeZone": "UTC"},
                },
            },
            "profiles[0].dailyLimit.reset: declare exactly one of timeZone and rollingHours",
        ),
        (
            {
                "notAppliedAnswers": [SF_LIMIT],
                "dailyLimit": {"answer": SF_LIMIT, "reset": {"rollingHours": 12}},
            },
            "profiles[0].dailyLimit.reset.rollingHours: Input should be greater than or equal",
        ),
        (
            {
                "rateLimit": {
                    "requests": 1,
                    "perSeconds": 1,
                    "dailyQuota": 9,
                    "dailyResetTimeZone": "Europe/Berlin",
                }
            },
            "profiles[0].rateLimit.dailyResetTimeZone: the reset is declared once",
        ),
        (
            {
                "notAppliedAnswers": [SF_LIMIT],
                "dailyLimit": {"answer": SF_LIMIT, "reset": {"rollingHours": 24}},
                "rateLimit": {**ONE_PER_S, "dailyQuota": 9},
            },
            "profiles[0].rateLimit.dailyQuota: a share of a rolling window is not counted",
        ),
    ],
)
def test_pack_apply_refuses_an_answer_it_cannot_keep_in_one_line(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ManifestInvalid) as info:
        demo_manifest(_profile(**fields))
    assert any(p.startswith(problem) and "\n" not in p for p in info.value.problems), (
        info.value.problems
    )


def test_a_body_matched_answer_has_a_status_the_journal_proves_by_itself() -> None:
    assert JOURNAL_NOT_DEFINITE_4XX == CREATE_NOT_DEFINITE


def test_undeclared_the_new_fields_leave_every_digest_as_before() -> None:
    """A profile without PROF-5's declarations dumps without them (the stored install's
    manifest digest and its links' payload hashes stand); declaring one changes the hash."""

    def strip(d: dict[str, Any]) -> None:
        for profile in d["profiles"]:
            profile.pop("dailyLimit", None)

    bare = demo_manifest(strip)
    dumped = bare.model_dump(mode="json", by_alias=True)
    for profile in dumped["profiles"]:
        assert "dailyLimit" not in profile and "notAppliedAnswers" not in profile
        locator = profile["locatorRecovery"]
        assert locator is None or "responseIdPath" not in locator
    declared = demo_manifest()
    assert profile_payload_hash(bare.profiles[0]) != profile_payload_hash(declared.profiles[0])


@pytest.mark.parametrize(
    "edit",
    [
        _profile(dailyLimit=None),
        lambda d: d["profiles"][0]["dailyLimit"].update(reset={"rollingHours": 24}),
        _profile(notAppliedAnswers=[{"status": 423}]),
    ],
    ids=["daily-limit-removed", "daily-reset-changed", "not-applied-answer-added"],
)
def test_a_changed_answer_declaration_is_profile_payload_drift(edit: Any) -> None:
    """Drift matrix row `profile_payload`: a finalized link fails closed (revalidation
    re-freezes the contract); an active attempt keeps the one it froze."""
    active = contact_active(demo_manifest(edit))
    link = [(f.surface, f.disposition) for f in classify(contact_link(), active)]
    attempt = [(f.surface, f.disposition) for f in classify(contact_attempt(), active)]
    assert link == [(DriftSurface.PROFILE_PAYLOAD, Disposition.FAIL_CLOSED)]
    assert attempt == [(DriftSurface.PROFILE_PAYLOAD, Disposition.FROZEN_NO_EFFECT)]
