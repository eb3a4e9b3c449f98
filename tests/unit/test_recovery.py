"""REC-4 / JRN-2 / PROF-1 / PROF-2: the one recovery decision, driven by the send journal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from protocol.manifest import Profile
from protocol.messages import LinkView
from protocol.operator import OperatorAction, check_operator_action
from protocol.readback import readback_matches
from protocol.recovery import (
    JournalEntry,
    RecoveryInput,
    SendKind,
    SendOutcome,
    Step,
    definite_rejection,
    may_have_landed,
    next_step,
    on_definite_rejection,
    on_patch_conflict,
)
from protocol.remote_ids import RemoteIdError, check_remote_id, is_canonical
from protocol.snapshots import ProfileSnapshot, profile_payload_hash
from protocol.states import AttemptStatus, ProtocolError
from tests.unit.factories import demo_manifest

MANIFEST = demo_manifest()
IDEMPOTENT = ProfileSnapshot.of(MANIFEST.profiles[0])
PLAIN = ProfileSnapshot.of(MANIFEST.profiles[1])
LOCATOR = ProfileSnapshot.of(MANIFEST.profiles[2])
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

_ids = iter(range(1, 10_000))


def entry(
    outcome: SendOutcome | None, status: int | None = None, at: datetime = T0
) -> JournalEntry:
    return JournalEntry(
        journal_id=next(_ids),
        outcome=outcome,
        status=status,
        not_applied_statuses=(429,),
        sending_at=at,
    )


SENT = entry(SendOutcome.NO_ANSWER)
IN_FLIGHT = entry(None)
NOT_SENT = entry(SendOutcome.NOT_SENT)
REFUSED_429 = entry(SendOutcome.ANSWERED, 429)
REJECTED_400 = entry(SendOutcome.ANSWERED, 400)
ANSWERED_503 = entry(SendOutcome.ANSWERED, 503)


def create(
    journal: tuple[JournalEntry, ...],
    profile: ProfileSnapshot,
    status: str = "processing",
    **kw: object,
) -> Step:
    kw.setdefault("checkpoint_set", bool(journal))
    kw.setdefault("now", T0 + timedelta(minutes=1))  # well within the key's retention (G-5)
    return step_of(SendKind.CREATE, journal, profile, status, **kw)


def step_of(
    kind: SendKind,
    journal: tuple[JournalEntry, ...],
    profile: ProfileSnapshot,
    status: str = "processing",
    **kw: object,
) -> Step:
    """`next_step` of a send of `kind` with this journal and profile."""
    ctx = RecoveryInput(
        kind=kind,
        status=status,
        journal=journal,
        contract=profile,
        **kw,  # type: ignore[arg-type]
    )
    return next_step(ctx).step


@pytest.mark.parametrize(
    ("journal", "profile", "expected"),
    [
        ((), PLAIN, Step.SEND),
        ((NOT_SENT,), PLAIN, Step.SEND),
        ((NOT_SENT, NOT_SENT), PLAIN, Step.SEND),
        ((REFUSED_429,), PLAIN, Step.SEND),  # PROF-1: declared "not applied"
        ((SENT,), PLAIN, Step.PARK_AMBIGUOUS),
        ((IN_FLIGHT,), PLAIN, Step.PARK_AMBIGUOUS),  # a zombie may still be sending
        ((ANSWERED_503,), PLAIN, Step.PARK_AMBIGUOUS),
        ((SENT,), IDEMPOTENT, Step.RESEND_REPLAY_SAFE),
        ((SENT, NOT_SENT), IDEMPOTENT, Step.RESEND_REPLAY_SAFE),
        ((SENT,), LOCATOR, Step.LOOKUP_LOCATOR),
        # Problem 1: an earlier try landed, the later ones were not sent: still possible.
        ((SENT, NOT_SENT, NOT_SENT), PLAIN, Step.PARK_AMBIGUOUS),
    ],
)
def test_next_create_step(
    journal: tuple[JournalEntry, ...], profile: ProfileSnapshot, expected: Step
) -> None:
    assert create(journal, profile) is expected


def test_exhaustion_parks_ambiguous_whenever_a_try_may_have_landed() -> None:
    """Issue 10 problem 1: the checkpoint cleared after not_sent let supersede POST again."""
    decision = next_step(
        RecoveryInput(
            kind=SendKind.CREATE,
            status="processing",
            journal=(SENT, NOT_SENT, NOT_SENT),
            contract=IDEMPOTENT,
            checkpoint_set=True,
            exhausted=True,
        )
    )
    assert decision.step is Step.PARK_AMBIGUOUS
    assert decision.may_have_landed == 1
    assert "not sent" not in decision.reason and "not_sent" not in decision.reason
    assert create((NOT_SENT, NOT_SENT), IDEMPOTENT, exhausted=True) is Step.TERMINAL


def test_checkpoint_without_journal_counts_as_a_possible_effect() -> None:
    """A row checkpointed before the journal existed: one try of unknown outcome."""
    ctx = RecoveryInput(
        kind=SendKind.CREATE, status="processing", journal=(), contract=PLAIN, checkpoint_set=True
    )
    assert next_step(ctx).step is Step.PARK_AMBIGUOUS


def test_not_applied_waits_are_bounded_by_time_not_count() -> None:
    refusals = tuple(entry(SendOutcome.ANSWERED, 429, T0 + timedelta(seconds=i)) for i in range(50))
    budget = PLAIN.not_applied_budget_seconds
    inside = T0 + timedelta(seconds=budget - 1)
    outside = T0 + timedelta(seconds=budget + 1)
    assert create(refusals, PLAIN, now=inside) is Step.SEND
    assert create(refusals, PLAIN, now=outside) is Step.TERMINAL
    # Once something may have landed, the spent budget parks ambiguous instead.
    assert create((SENT, *refusals), LOCATOR, now=outside) is Step.PARK_AMBIGUOUS


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("writeback_pending", Step.RESUME_WRITEBACK),
        ("ambiguous_remote_effect", Step.NOTHING),
        ("terminal_failed", Step.NOTHING),
        ("finalized", Step.NOTHING),
        ("superseded", Step.NOTHING),
        ("pending", Step.SEND),
    ],
)
def test_settled_states(status: str, expected: Step) -> None:
    journal = () if status == "pending" else (SENT,)
    assert create(journal, IDEMPOTENT, status=status) is expected


def patch(journal: tuple[JournalEntry, ...], profile: ProfileSnapshot, **kw: object) -> Step:
    return step_of(SendKind.PATCH, journal, profile, checkpoint_set=True, **kw)


def test_patch_steps() -> None:
    replay_safe = PLAIN.model_copy(update={"patch_replay_safe": True})

    assert patch((NOT_SENT,), PLAIN) is Step.SEND
    assert patch((SENT,), PLAIN) is Step.PARK_AMBIGUOUS
    # C-2 (P-50): never re-sent, replay-safe or not; a declared read-back may prove it.
    assert patch((SENT,), replay_safe) is Step.PARK_AMBIGUOUS
    assert patch((SENT,), LOCATOR) is Step.READ_BACK
    assert patch((IN_FLIGHT,), LOCATOR.model_copy(update={"readback": False})) is (
        Step.PARK_AMBIGUOUS
    )
    assert on_patch_conflict(1, LOCATOR).step is Step.READ_BACK
    assert on_patch_conflict(0, LOCATOR).step is Step.SUSPEND_CONFLICT
    assert on_patch_conflict(1, PLAIN).step is Step.SUSPEND_CONFLICT  # no read-back declared


def test_definite_rejections() -> None:
    """SPEC §15 C-1 (P-77): a definite rejection proves only that *its* try had no effect.
    After a try that may have landed it never ends the attempt terminal: the same-key
    re-send's 422 may be the remote saying the object exists."""
    assert definite_rejection(SendKind.CREATE, 400)
    assert definite_rejection(SendKind.CREATE, 422)
    assert not definite_rejection(SendKind.CREATE, 409)  # an earlier try may have created it
    assert definite_rejection(SendKind.PATCH, 409)
    for status in (408, 425, 429, 500, 503, 201):
        assert not definite_rejection(SendKind.CREATE, status)
    assert may_have_landed((SENT, REJECTED_400, NOT_SENT, REFUSED_429), SendKind.CREATE) == 1

    def rejected(journal: tuple[JournalEntry, ...], checkpoint: bool = True) -> Step:
        ctx = RecoveryInput(
            kind=SendKind.CREATE,
            status="processing",
            journal=journal,
            contract=IDEMPOTENT,
            checkpoint_set=checkpoint,
        )
        return on_definite_rejection(ctx, 422).step

    rejected_422 = entry(SendOutcome.ANSWERED, 422)
    assert rejected((rejected_422,)) is Step.TERMINAL  # the only try: nothing landed
    assert rejected((NOT_SENT, REFUSED_429, rejected_422)) is Step.TERMINAL
    assert rejected((SENT, rejected_422)) is Step.PARK_AMBIGUOUS  # was terminal before C-1
    assert rejected((IN_FLIGHT, REJECTED_400)) is Step.PARK_AMBIGUOUS
    # Exhaustion after the same journal parks too, never terminal.
    assert create((SENT, rejected_422), IDEMPOTENT, exhausted=True) is Step.PARK_AMBIGUOUS


@pytest.mark.parametrize(
    ("journal", "profile"),
    [((SENT,), IDEMPOTENT), ((IN_FLIGHT,), IDEMPOTENT), ((SENT,), LOCATOR), ((SENT,), PLAIN)],
)
def test_a_deferred_create_that_may_have_landed_is_never_replayed(
    journal: tuple[JournalEntry, ...], profile: ProfileSnapshot
) -> None:
    """SPEC §15 C-3 (P-49): even under a replay-safe or locator profile."""
    assert create(journal, profile, deferred=True) is Step.PARK_AMBIGUOUS
    # A deferred create none of whose tries can have had an effect may still be sent.
    assert create((NOT_SENT,), profile, deferred=True) is Step.SEND


def test_readback_comparison() -> None:
    sent = {"properties": {"dealname": "Big", "amount": 100, "closed": True}}
    document = {
        "id": "7",
        "properties": {"dealname": "Big", "amount": "100", "closed": "true", "other": "x"},
    }
    assert readback_matches(sent, document)
    changed = {"id": "7", "properties": {"dealname": "Big", "amount": "101", "closed": "true"}}
    assert not readback_matches(sent, changed)
    assert not readback_matches(sent, {"id": "7", "properties": {"dealname": "Big"}})
    assert not readback_matches({"properties": {"a": None}}, {"properties": {"a": ""}})


@pytest.mark.parametrize(
    "raw", [" 1002", "1002 ", "10\x002", "10\n02", "\u00a01002", "1002\u200b", ""]
)
def test_non_canonical_remote_ids_are_refused(raw: str) -> None:
    assert not is_canonical(raw)


def test_refusal_names_the_canonical_form() -> None:
    with pytest.raises(RemoteIdError) as refused:
        check_remote_id(" 1002")
    assert refused.value.canonical == "1002"
    assert check_remote_id("1002", r"[0-9]+") == "1002"
    assert not is_canonical("abc", r"[0-9]+")


def test_an_upgrade_alone_does_not_move_the_profile_payload_hash() -> None:
    """Links frozen before §14.2 keep their profile_payload_hash: new declarations at
    their defaults are left out; declaring one is a change (drift, by design)."""
    document = {
        "name": "p",
        "credentialRef": "env:T",
        "endpointClass": "objects-api",
        "baseUrl": "http://127.0.0.1:1",
        "retryPolicy": {"maxAttempts": 1, "initialIntervalMs": 1},
    }
    bare = Profile.model_validate(document)
    # The digest of this document as the runtime computed it before the new fields.
    before = "af627e1e719a8caada17eca82f2e29c721b08c952ca56d107e9016d6fd38b1f5"
    declared = Profile.model_validate({**document, "notAppliedStatuses": [429]})
    assert profile_payload_hash(declared) != profile_payload_hash(bare)
    assert profile_payload_hash(bare) == before


def test_supersede_is_refused_after_a_try_that_may_have_landed() -> None:
    """SPEC §15 C-1 (P-77): the UI validator and the operator activity both ask
    `check_operator_action`; the refusal says why and names reconcile."""
    landed = LinkView(
        link_key="k",
        attempt_status=AttemptStatus.TERMINAL_FAILED,
        attempt_tries_may_have_landed=1,
    )
    with pytest.raises(ProtocolError, match=r"may have landed.*reconcile"):
        check_operator_action(OperatorAction.SUPERSEDE, landed)
    proven = landed.model_copy(update={"attempt_tries_may_have_landed": 0})
    check_operator_action(OperatorAction.SUPERSEDE, proven)


def test_a_daily_refusal_waits_for_the_reset_and_restarts_the_time_budget() -> None:
    """Issue 33 item 3: a 429 naming the daily policy ends the budget's day; the wait for
    the reset is not the remote refusing for longer than the budget."""
    budget = PLAIN.not_applied_budget_seconds
    burst = entry(SendOutcome.ANSWERED, 429, T0)
    daily = entry(SendOutcome.ANSWERED, 429, T0 + timedelta(seconds=5)).model_copy(
        update={"daily_refusal": True}
    )
    next_day = T0 + timedelta(hours=14)

    assert create((burst, daily), PLAIN, now=next_day) is Step.SEND
    # Refusals after the day's end count again, from the first of them.
    after = entry(SendOutcome.ANSWERED, 429, next_day)
    assert create((burst, daily, after), PLAIN, now=next_day + timedelta(seconds=1)) is Step.SEND
    late = next_day + timedelta(seconds=budget + 1)
    assert create((burst, daily, after), PLAIN, now=late) is Step.TERMINAL


def test_an_unresolved_patch_conflict_parks_instead_of_failing_when_retries_run_out() -> None:
    """Found by `make chaos` (seed 72): a PATCH answered 412 after an earlier PATCH of ours
    that may have landed; PROF-2's read-back GET failed on every try, so the conflict was
    never settled either way. Ending `failed` ("no try had an effect") would drop the
    save while the object may hold another PATCH's values: it parks for an operator,
    whose reconcile reads it back. A definite refusal (400) still ends terminal."""

    def exhausted(journal: tuple[JournalEntry, ...]) -> Step:
        return patch(journal, LOCATOR, exhausted=True)

    answered_412 = entry(SendOutcome.ANSWERED, 412)
    assert exhausted((NOT_SENT, answered_412, answered_412)) is Step.PARK_AMBIGUOUS
    assert exhausted((entry(SendOutcome.ANSWERED, 409),)) is Step.PARK_AMBIGUOUS
    assert exhausted((answered_412, NOT_SENT)) is Step.PARK_AMBIGUOUS  # newest *answer*
    assert exhausted((NOT_SENT, REJECTED_400)) is Step.TERMINAL
    assert exhausted((answered_412, REJECTED_400)) is Step.TERMINAL
    assert exhausted((NOT_SENT,)) is Step.TERMINAL
