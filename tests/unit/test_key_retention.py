"""SPEC §17 G-5: idempotency keys expire. A profile that declares `idempotency.post` must
declare `keyRetention` (checked by `pack apply` and its `--dry-run`), frozen with the
request; a re-send past it, counted from the first try's send, is not replay-safe."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from protocol.installable import parse_installable
from protocol.manifest import ManifestInvalid, parse_manifest
from protocol.recovery import JournalEntry, RecoveryInput, SendKind, SendOutcome, Step, next_step
from protocol.snapshots import ProfileSnapshot, manifest_digest
from protocol.timeouts import REMOTE_ACTIVITY_START_TO_CLOSE
from tests.unit.factories import demo_document, demo_manifest

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DAY = 86_400
IDEMPOTENT = ProfileSnapshot.of(demo_manifest().profiles[0])  # keyRetention: 24h
# The same remote contract plus a unique locator (the demo's deals profile declares one).
BOTH = IDEMPOTENT.model_copy(
    update={"locator_recovery": ProfileSnapshot.of(demo_manifest().profiles[2]).locator_recovery}
)


def _post(document: dict[str, Any]) -> dict[str, Any]:
    post: dict[str, Any] = document["profiles"][0]["idempotency"]["post"]
    return post


def _landed(at: datetime = T0) -> JournalEntry:
    return JournalEntry(journal_id=1, outcome=SendOutcome.NO_ANSWER, sending_at=at)


def _decide(
    contract: ProfileSnapshot, now: datetime | None, *journal: JournalEntry
) -> tuple[Step, str]:
    decision = next_step(
        RecoveryInput(
            kind=SendKind.CREATE,
            status="processing",
            journal=journal or (_landed(),),
            contract=contract,
            checkpoint_set=True,
            now=now,
        )
    )
    return decision.step, decision.reason


@pytest.mark.parametrize(
    ("declared", "seconds"),
    [(86400, DAY), ("86400", DAY), ("24h", DAY), ("PT24H", DAY), ("P1D", DAY), ("90s", 90)],
)
def test_g5_key_retention_forms_freeze_as_seconds(declared: object, seconds: int) -> None:
    document = demo_document()
    _post(document)["keyRetention"] = declared
    profile = parse_installable(document).profiles[0]
    assert ProfileSnapshot.of(profile).post_key_retention_seconds == seconds


@pytest.mark.parametrize("declared", ["1y", "P1M", "PT", "soon", 0, "31d", True])
def test_g5_a_bad_key_retention_is_one_line_naming_the_field(declared: object) -> None:
    document = demo_document()
    _post(document)["keyRetention"] = declared
    with pytest.raises(ManifestInvalid) as refused:
        parse_installable(document)
    (problem,) = refused.value.problems
    assert problem.startswith("profiles[0].idempotency.post.keyRetention: ")
    assert "\n" not in problem


def test_g5_pack_apply_refuses_idempotency_post_without_key_retention() -> None:
    document = demo_document()
    del _post(document)["keyRetention"]
    with pytest.raises(ManifestInvalid) as refused:
        parse_installable(document)
    assert refused.value.problems == (
        "profiles[0].idempotency.post.keyRetention: required with idempotency.post: how long"
        " the remote honours a key, e.g. 24h, PT24H or 86400 (seconds) (G-5)",
    )


def test_g5_a_stored_install_without_key_retention_still_parses_and_digests_as_before() -> None:
    """An install from before G-5 is read back (drift checks, `pack show`): it parses, and
    its digests are what they were, so a runtime upgrade alone is not drift."""
    document = demo_document()
    del _post(document)["keyRetention"]
    stored = parse_manifest(document)
    dumped = stored.model_dump(mode="json", by_alias=True)
    assert _post(dumped) == {"header": "Idempotency-Key"}
    declared = demo_manifest()
    assert manifest_digest(stored) != manifest_digest(declared)
    assert ProfileSnapshot.of(stored.profiles[0]).profile_payload_hash != (
        IDEMPOTENT.profile_payload_hash
    )


def test_g5_a_re_send_within_the_retention_goes_with_the_same_key() -> None:
    assert _decide(IDEMPOTENT, T0 + timedelta(hours=23))[0] is Step.RESEND_REPLAY_SAFE


def test_g5_a_re_send_past_the_retention_parks_without_a_locator() -> None:
    step, reason = _decide(IDEMPOTENT, T0 + timedelta(hours=25))
    assert step is Step.PARK_AMBIGUOUS
    assert "keyRetention 86400 s" in reason and "G-5" in reason


def test_g5_a_re_send_past_the_retention_looks_the_locator_up() -> None:
    assert _decide(BOTH, T0 + timedelta(hours=23))[0] is Step.RESEND_REPLAY_SAFE
    assert _decide(BOTH, T0 + timedelta(hours=25))[0] is Step.LOOKUP_LOCATOR


def test_g5_retention_counts_from_the_first_try_with_a_re_send_to_spare() -> None:
    """The first try's send starts the clock, not the newest; and the re-send decided now
    must reach the remote before the key lapses (one activity's start-to-close)."""
    expires = T0 + timedelta(seconds=DAY)
    later = JournalEntry(journal_id=2, outcome=SendOutcome.NO_ANSWER, sending_at=expires)
    just_before = expires - REMOTE_ACTIVITY_START_TO_CLOSE / 2
    assert _decide(IDEMPOTENT, just_before, _landed(), later)[0] is Step.PARK_AMBIGUOUS
    roomy = expires - 2 * REMOTE_ACTIVITY_START_TO_CLOSE
    assert _decide(IDEMPOTENT, roomy, _landed(), later)[0] is Step.RESEND_REPLAY_SAFE


def test_g5_unknown_clock_or_send_time_is_not_replay_safe() -> None:
    assert _decide(IDEMPOTENT, None)[0] is Step.PARK_AMBIGUOUS
    unknown = JournalEntry(journal_id=1, outcome=SendOutcome.NO_ANSWER)
    assert _decide(IDEMPOTENT, T0, unknown)[0] is Step.PARK_AMBIGUOUS


def test_g5_a_request_frozen_without_key_retention_is_never_re_sent() -> None:
    """Frozen before G-5 (the snapshot has no retention): retention 0, fail closed."""
    frozen = IDEMPOTENT.model_dump(mode="json")
    del frozen["post_key_retention_seconds"]
    legacy = ProfileSnapshot.model_validate(frozen)
    assert legacy.post_key_retention_seconds is None and not legacy.post_replay_safe
    step, reason = _decide(legacy, T0 + timedelta(minutes=1))
    assert step is Step.PARK_AMBIGUOUS
    assert "retention was not frozen" in reason
