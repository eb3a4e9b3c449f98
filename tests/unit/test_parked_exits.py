"""Every parked state has an exit the seed allows (SPEC §17 G-6, WF-3, OPS-1, OPS-2, §5.4).

Every park reason (`protocol.park_reason.ParkReason`, with each `SuspendReason` and drift
surface a suspended link can carry) is crossed with every send journal its attempt or
PATCH can hold (each per-try outcome of `protocol.recovery`, alone and in pairs, judged
by `protocol.landing.landing`). For each combination the view is built as
`services.landing.with_landing` builds it, and the remedy that `links show` and the
workflow's details print must name at least one update that the guards
(`protocol.operator.check_operator_action`) accept, that the audit trail records
(`protocol.audit.OPERATOR_ACTION_COMMANDS`), and no update that they refuse, with the
evidence that decides it. An ambiguous attempt whose journal proves that no try landed
is told so, and is pointed at the migration policy (§10), never at finding an object.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from protocol.audit import OPERATOR_ACTION_COMMANDS
from protocol.drift import DriftSurface
from protocol.errors import ActivityErrorType, SuspendReason, drift_reason
from protocol.landing import PROOF, Landing, landing
from protocol.messages import LinkView
from protocol.operator import OperatorAction, check_operator_action
from protocol.park import PROVED_NOT_LANDED, ParkReason, Remedy, park_reason, remedy_for
from protocol.recovery import JournalEntry, SendKind, SendOutcome, may_have_landed
from protocol.states import (
    ATTEMPT_TRANSITIONS,
    AttemptStatus,
    LinkStatus,
    PatchStatus,
    ProtocolError,
)
from workflows.details import details_markdown

KEY = "lk1_" + "c" * 64
DECLARED = (429,)  # the frozen profile's notAppliedStatuses (PROF-1)

# One try's recorded outcome: (outcome, status); None is a try still in flight.
TRY_OUTCOMES: dict[str, tuple[SendOutcome | None, int | None]] = {
    "in_flight": (None, None),
    "not_sent": (SendOutcome.NOT_SENT, None),
    "no_answer": (SendOutcome.NO_ANSWER, None),
    "answered_201": (SendOutcome.ANSWERED, 201),
    "answered_500": (SendOutcome.ANSWERED, 500),
    "answered_409": (SendOutcome.ANSWERED, 409),
    "answered_412": (SendOutcome.ANSWERED, 412),
    "answered_429_declared": (SendOutcome.ANSWERED, 429),
    "answered_408_undeclared": (SendOutcome.ANSWERED, 408),
    "answered_400": (SendOutcome.ANSWERED, 400),
    "answered_422": (SendOutcome.ANSWERED, 422),
}


def _journals() -> Iterator[tuple[str, tuple[JournalEntry, ...]]]:
    """Every journal of up to two tries (the late answer of a timed-out try is simply an
    answered row: the outcome is recorded once, whenever it arrives)."""
    for size in range(3):
        for names in itertools.product(TRY_OUTCOMES, repeat=size):
            entries = tuple(
                JournalEntry(
                    journal_id=i + 1,
                    outcome=TRY_OUTCOMES[name][0],
                    status=TRY_OUTCOMES[name][1],
                    not_applied_statuses=DECLARED,
                )
                for i, name in enumerate(names)
            )
            yield "+".join(names) or "empty", entries


JOURNALS = dict(_journals())


@dataclass(frozen=True)
class Parked:
    """A park reason as Postgres holds it: the durable rows but the journal."""

    reason: ParkReason
    fields: dict[str, object]
    journal_of: SendKind  # whose journal varies: the newest attempt's or PATCH's


_SUSPENDED = {"link_status": LinkStatus.SUSPENDED_DRIFT, "remote_id": "r-1"}
_LINKED = {"attempt_status": AttemptStatus.FINALIZED, "attempt_id": "a-1"}
PARKED: dict[str, Parked] = {
    "ambiguous": Parked(
        ParkReason.AMBIGUOUS_REMOTE_EFFECT,
        {"attempt_status": AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, "attempt_id": "a-1"},
        SendKind.CREATE,
    ),
    "terminal": Parked(
        ParkReason.TERMINAL_FAILED,
        {"attempt_status": AttemptStatus.TERMINAL_FAILED, "attempt_id": "a-1"},
        SendKind.CREATE,
    ),
    "patch_outcome_unknown": Parked(
        ParkReason.PATCH_OUTCOME_UNKNOWN,
        {
            **_LINKED,
            "link_status": LinkStatus.FINALIZED,
            "remote_id": "r-1",
            "last_patch_status": PatchStatus.AMBIGUOUS_REMOTE_EFFECT,
        },
        SendKind.PATCH,
    ),
    # REC-3: the newest PATCH failed with no effect (retries exhausted, or refused).
    "patch_failed": Parked(
        ParkReason.PATCH_FAILED,
        {
            **_LINKED,
            "link_status": LinkStatus.FINALIZED,
            "remote_id": "r-1",
            "last_patch_status": PatchStatus.FAILED,
        },
        SendKind.PATCH,
    ),
    **{
        f"suspended:{reason}": Parked(
            ParkReason(reason.value),
            {**_SUSPENDED, **_LINKED, "suspend_reason": reason.value},
            SendKind.PATCH,
        )
        for reason in SuspendReason
        if reason is not SuspendReason.DRIFT
    },
    "suspended:drift": Parked(
        ParkReason.DRIFT, {**_SUSPENDED, **_LINKED, "suspend_reason": "drift"}, SendKind.PATCH
    ),
    **{
        f"suspended:{drift_reason(surface.value)}": Parked(
            ParkReason.DRIFT,
            {**_SUSPENDED, **_LINKED, "suspend_reason": drift_reason(surface.value)},
            SendKind.PATCH,
        )
        for surface in DriftSurface
    },
}

# Combinations Postgres never holds, with the rule that refuses them. A terminal attempt
# had no try that may have landed when it moved (migration 0100, C-1), and its count of
# such tries never grows: no try is claimed once it is terminal, and a recorded outcome
# only ever turns an unanswered try into an answered one (JRN-1, migration 0010).
UNREACHABLE = {("terminal", Landing.MAY_HAVE_LANDED)}

# The command an operator types for each update (the CLI's names; `revalidate-link`).
SAID_AS = {
    OperatorAction.SUPERSEDE: "supersede",
    OperatorAction.RECONCILE: "reconcile",
    OperatorAction.RETIRE: "retire",
    OperatorAction.MARK_TERMINAL: "mark-terminal",
    OperatorAction.REVALIDATE: "revalidate",
}


def view_of(parked: Parked, journal: tuple[JournalEntry, ...]) -> LinkView:
    """The view `services.rows.view_of` + `services.landing.with_landing` publish."""
    landed = may_have_landed(journal, parked.journal_of)
    counts = (
        {"attempt_tries_may_have_landed": landed}
        if parked.journal_of is SendKind.CREATE
        else {"patch_tries_may_have_landed": landed}
    )
    ambiguous = parked.fields.get("attempt_status") is AttemptStatus.AMBIGUOUS_REMOTE_EFFECT
    judged = {"attempt_landing": landing(journal, SendKind.CREATE)} if ambiguous else {}
    return LinkView.model_validate({"link_key": KEY, **parked.fields, **counts, **judged})


def accepted(action: OperatorAction, view: LinkView) -> bool:
    try:
        check_operator_action(action, view)
    except ProtocolError:
        return False
    return True


def problems(name: str, parked: Parked, journal_name: str) -> list[str]:
    """What is wrong with the exit of one combination (empty: it has a good one)."""
    journal = JOURNALS[journal_name]
    verdict = landing(journal, parked.journal_of)
    if (name, verdict) in UNREACHABLE:
        return []
    view = view_of(parked, journal)
    reason = park_reason(view)
    if reason is not parked.reason:
        return [f"parks as {reason}, not {parked.reason}"]
    remedy = remedy_for(reason, view.suspend_reason, view.attempt_landing)
    found = [f"names {a} the guards refuse" for a in remedy.actions if not accepted(a, view)]
    found += [f"names {a}, not audited" for a in remedy.actions if a not in _AUDITED]
    found += [f"never says {SAID_AS[a]!r}" for a in remedy.actions if not _said(a, remedy)]
    if not remedy.actions:
        found.append("names no update")
    if not remedy.evidence:
        found.append("names no evidence")
    return found


_AUDITED = {OperatorAction(a) for a in OPERATOR_ACTION_COMMANDS}


def _said(action: OperatorAction, remedy: Remedy) -> bool:
    return SAID_AS[action] in remedy.what.lower()


@pytest.mark.parametrize("name", list(PARKED))
def test_every_journal_of_every_park_reason_has_an_exit_the_guards_accept(name: str) -> None:
    """G-6: at least one legal, audited update, named by the remedy with its evidence, and
    no update the guards would refuse, for every journal the parked row can hold."""
    parked = PARKED[name]
    failures = {j: p for j in JOURNALS if (p := problems(name, parked, j))}
    assert not failures, f"{name}: {dict(itertools.islice(failures.items(), 5))}"


def test_the_enumeration_covers_every_park_reason_and_journal_verdict() -> None:
    """Nothing is left out: every park reason, every suspend reason and drift surface, and
    every journal verdict of a parked ambiguous attempt (reachable or not)."""
    assert {p.reason for p in PARKED.values()} == set(ParkReason)
    suspend = {str(p.fields.get("suspend_reason", "")).split(":")[0] for p in PARKED.values()}
    assert {r.value for r in SuspendReason} <= suspend
    verdicts = {landing(j, SendKind.CREATE) for j in JOURNALS.values()}
    assert verdicts == set(Landing)
    # The error types of §5.4 each leave one of these durable states, or no parked one
    # (TransitionConflict, LaneNotClaimable: the row is as it was; a pending attempt in an
    # unknown lane still has `mark_terminal`).
    assert len(ActivityErrorType) == 7
    pending = LinkView(link_key=KEY, attempt_status=AttemptStatus.PENDING, attempt_id="a-1")
    assert accepted(OperatorAction.MARK_TERMINAL, pending)


def test_unreachable_combinations_are_the_ones_the_guards_would_strand() -> None:
    """The one combination left out would have no exit (supersede refused after a try
    that may have landed, C-1), which is why Postgres never holds it."""
    journal = JOURNALS["no_answer"]
    view = view_of(PARKED["terminal"], journal)
    assert not any(accepted(a, view) for a in OperatorAction)


def test_the_seed_allows_one_way_out_of_ambiguous_and_no_more() -> None:
    """G-6 adds no transition: `ambiguous_remote_effect` leaves only by reconciliation."""
    assert ATTEMPT_TRANSITIONS[AttemptStatus.AMBIGUOUS_REMOTE_EFFECT] == frozenset(
        {AttemptStatus.WRITEBACK_PENDING}
    )
    proved = view_of(PARKED["ambiguous"], JOURNALS["answered_400"])
    assert [a for a in OperatorAction if accepted(a, proved)] == [OperatorAction.RECONCILE]


@pytest.mark.parametrize(
    "journal_name",
    [
        "answered_400",  # the late answer of a timed-out try: refused for good
        "answered_429_declared",  # "not applied" by the frozen profile (PROF-1)
        "answered_429_declared+answered_422",
        "not_sent+answered_400",
    ],
)
def test_an_ambiguous_attempt_whose_journal_proves_no_landing_is_told_so(
    journal_name: str,
) -> None:
    """G-6: the remedy and the workflow's details say that no try landed and name the
    migration policy (retire, or a declared rebind); reconcile stays the one update, for
    an object made elsewhere; nothing tells the operator to find our object."""
    view = view_of(PARKED["ambiguous"], JOURNALS[journal_name])
    assert view.attempt_landing is Landing.PROVED_NOT_LANDED
    remedy = remedy_for(ParkReason.AMBIGUOUS_REMOTE_EFFECT, None, view.attempt_landing)
    assert remedy is PROVED_NOT_LANDED
    assert "no try of this create landed" in remedy.what
    assert "migration policy" in remedy.what and "rebind" in remedy.what
    assert "retire" in remedy.what and "Find the object" not in remedy.what
    assert "connector-push retire" not in remedy.what  # the attempt has no link to retire
    assert (remedy.update, remedy.alternatives) == (None, (OperatorAction.RECONCILE,))
    details = details_markdown(view, ParkReason.AMBIGUOUS_REMOTE_EFFECT)
    assert f"**no try landed**: {PROOF}" in details
    assert remedy.what in details and f"connector-push links show {KEY}" in details
    assert "tries that may have landed" not in details


@pytest.mark.parametrize(
    "journal_name",
    ["empty", "in_flight", "no_answer", "answered_500", "answered_409", "answered_400+no_answer"],
)
def test_an_ambiguous_attempt_that_may_have_landed_keeps_find_and_reconcile(
    journal_name: str,
) -> None:
    """Fail closed: an unanswered try, an answer that proves nothing (a 409 may be the
    remote saying the object exists, C-1) or no journal at all proves no absence."""
    view = view_of(PARKED["ambiguous"], JOURNALS[journal_name])
    assert view.attempt_landing is not Landing.PROVED_NOT_LANDED
    remedy = remedy_for(ParkReason.AMBIGUOUS_REMOTE_EFFECT, None, view.attempt_landing)
    assert remedy.update is OperatorAction.RECONCILE and "Find the object" in remedy.what
    assert "no try landed" not in details_markdown(view, ParkReason.AMBIGUOUS_REMOTE_EFFECT)


def test_a_view_from_before_the_verdict_fails_closed() -> None:
    """A view recorded before G-6 has no verdict (histories replay with it): the remedy is
    the ambiguous one, whatever the try counts say."""
    old = LinkView(
        link_key=KEY,
        attempt_status=AttemptStatus.AMBIGUOUS_REMOTE_EFFECT,
        attempt_tries_may_have_landed=0,
    )
    remedy = remedy_for(ParkReason.AMBIGUOUS_REMOTE_EFFECT, None, old.attempt_landing)
    assert remedy.update is OperatorAction.RECONCILE
