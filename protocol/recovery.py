"""Recovery from the send journal (SPEC JRN-1, JRN-2, REC-4, PROF-1, PROF-2, §15 C-1..C-3, §17 G-5).

Rules kept in this module:
1. A journal entry is one try that passed its fence (its checkpoint
   compare-and-set). Until its outcome is recorded it may have landed.
2. A try proves it had no effect only when it never left the process, or the
   remote answered with a definite rejection, or with a status the frozen
   contract declares "not applied". Anything else may have landed.
3. Evidence only grows: once any try may have landed, the attempt or PATCH is
   effect-possible for good. It never ends terminal (`terminal_failed`, a failed
   PATCH), whatever a later try answers: a 409/422 on a same-key re-send may be
   the remote saying the object exists (C-1). Nothing may re-send it unless the
   frozen contract makes a re-send of a *create* harmless (replay-safe idempotency,
   unique-locator recovery), and never a deferred-lane create (C-3) or a PATCH
   (C-2): a PATCH may only be proved applied by a read-back GET. A PATCH whose
   newest answer was a 409/412 that no read-back settled (an earlier PATCH of ours
   may be what moved the entity tag) parks too when its retries run out.
4. A replay-safe re-send counts on the remote still honouring the key (G-5): only
   within the frozen `keyRetention`, counted from the first try's send, with one
   remote activity's start-to-close to spare. Past it, or where the retention, the
   first send's time or the clock is unknown, a re-send is not replay-safe: the unique
   locator is looked up if declared, otherwise the create parks ambiguous.
5. `next_step` (and `on_definite_rejection` for an answered refusal) is the one
   decision every path takes (activity retries, retry exhaustion, operator
   actions); the database enforces rules 1-3 with the same status sets
   (migrations 0010 and 0100, tested against this module).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from protocol.snapshots import ProfileSnapshot, Snapshot
from protocol.states import AttemptStatus, PatchStatus
from protocol.timeouts import REMOTE_ACTIVITY_START_TO_CLOSE

# 408 Request Timeout, 425 Too Early, 429 Too Many Requests: "not processed (yet)" by
# convention, but only a profile's declaration (PROF-1) makes one proof of no effect.
RETRYABLE_4XX: Final = frozenset({408, 425, 429})
# A create answered 409 (a unique value exists) may mean an earlier try landed.
CREATE_NOT_DEFINITE: Final = RETRYABLE_4XX | {409}
PATCH_NOT_DEFINITE: Final = RETRYABLE_4XX
# A PATCH answered 409/412: the object changed, perhaps by an earlier write of ours (PROF-2).
PATCH_CONFLICT: Final = frozenset({409, 412})


class SendKind(StrEnum):
    CREATE = "create"
    PATCH = "patch"


class SendOutcome(StrEnum):
    NOT_SENT = "not_sent"  # the connection never carried the request
    NO_ANSWER = "no_answer"  # sent (or maybe sent): timeout, reset, broken response
    ANSWERED = "answered"  # a status line was read


class JournalEntry(Snapshot):
    """One try that passed its fence; `outcome` None means it may still be in flight."""

    journal_id: int
    outcome: SendOutcome | None = None
    status: int | None = None
    not_applied_statuses: tuple[int, ...] = ()
    sending_at: datetime | None = None
    retry_after_seconds: float | None = None
    # A 429 naming the remote's daily policy: the budget's day ended (NF-8's daily share).
    daily_refusal: bool = False


def definite_rejection(kind: SendKind, status: int) -> bool:
    """A 4xx that says the request was refused, not "try again" (POST-4, PATCH-3)."""
    excluded = CREATE_NOT_DEFINITE if kind is SendKind.CREATE else PATCH_NOT_DEFINITE
    return 400 <= status <= 499 and status not in excluded


def not_applied(entry: JournalEntry) -> bool:
    """Answered with a status the frozen contract declares "not processed" (PROF-1)."""
    return entry.outcome is SendOutcome.ANSWERED and entry.status in entry.not_applied_statuses


def proves_no_effect(entry: JournalEntry, kind: SendKind) -> bool:
    if entry.outcome is SendOutcome.NOT_SENT:
        return True
    if entry.outcome is not SendOutcome.ANSWERED or entry.status is None:
        return False
    return not_applied(entry) or definite_rejection(kind, entry.status)


def may_have_landed(journal: Iterable[JournalEntry], kind: SendKind) -> int:
    """How many tries may have reached the remote (shown to operators)."""
    return sum(1 for entry in journal if not proves_no_effect(entry, kind))


class Step(StrEnum):
    SEND = "send"  # (re)send the frozen request: no try so far can have had an effect
    RESEND_REPLAY_SAFE = "resend_replay_safe"  # same frozen request; the remote de-duplicates
    LOOKUP_LOCATOR = "lookup_locator"  # find the object by its unique locator first
    READ_BACK = "read_back"  # GET the object and compare it with the frozen body
    SUSPEND_CONFLICT = "suspend_conflict"  # a real precondition failure: remote_conflict
    RESUME_WRITEBACK = "resume_writeback"  # the remote id is durable: mirror only
    PARK_AMBIGUOUS = "park_ambiguous"
    TERMINAL = "terminal"  # terminal_failed (create) or failed (PATCH): nothing landed
    NOTHING = "nothing"  # settled or parked already


class Decision(Snapshot):
    step: Step
    reason: str
    may_have_landed: int = 0


class RecoveryInput(Snapshot):
    """What `next_step` reads: the durable row, its journal and the frozen contract."""

    kind: SendKind
    status: str
    journal: tuple[JournalEntry, ...]
    contract: ProfileSnapshot
    # RemoteIOStartedAt: set before any send; a row checkpointed before the journal
    # existed has no entries, and counts as one try that may have landed.
    checkpoint_set: bool
    # C-3: a create of the deferred association lane is never replayed.
    deferred: bool = False
    exhausted: bool = False
    # The caller's clock when it decides (a re-send's key retention, G-5; PROF-1's
    # budget); None: no time-bound allowance is proven (fail closed).
    now: datetime | None = None


def next_step(ctx: RecoveryInput) -> Decision:
    """What the next try of this create or PATCH may do (REC-4)."""
    settled = _settled(ctx)
    if settled is not None:
        return settled
    landed = effect_possible(ctx)
    budget = _budget_spent(ctx)
    if ctx.exhausted or budget is not None:
        why = budget or "retries exhausted"
        if ctx.kind is SendKind.PATCH and landed == 0 and _unresolved_conflict(ctx.journal):
            return Decision(
                step=Step.PARK_AMBIGUOUS,
                reason=(
                    f"{why}; the remote answered 409/412 after an earlier PATCH of ours that"
                    " may have landed, and no read-back could tell whose values the object"
                    " holds (PROF-2): reconcile reads it back"
                ),
            )
        return _exhausted(landed, why)
    if landed == 0:
        first = not ctx.journal
        reason = "first try" if first else "every earlier try proved it had no effect"
        return Decision(step=Step.SEND, reason=reason)
    return _after_possible_effect(ctx, landed)


def effect_possible(ctx: RecoveryInput) -> int:
    """How many tries of this row may have landed (a checkpoint with no journal row at
    all counts as one): any at all and the row never ends terminal (C-1)."""
    landed = may_have_landed(ctx.journal, ctx.kind)
    if ctx.checkpoint_set and not ctx.journal:
        landed = 1
    return landed


def on_definite_rejection(ctx: RecoveryInput, status: int) -> Decision:
    """The remote refused this try for good (POST-4, PATCH-3; the try is in `ctx.journal`
    with its answer). Terminal only if no try of the row may have landed; otherwise an
    earlier try may have created or applied it and the refusal may say so (C-1)."""
    landed = effect_possible(ctx)
    if landed:
        return Decision(
            step=Step.PARK_AMBIGUOUS,
            reason=(
                f"remote answered {status} after {landed} earlier try(s) that may have landed;"
                " the object may exist (C-1)"
            ),
            may_have_landed=landed,
        )
    return Decision(step=Step.TERMINAL, reason=f"remote rejected the {ctx.kind} with {status}")


def on_patch_conflict(earlier: int, contract: ProfileSnapshot) -> Decision:
    """A PATCH answered 409/412 (PROF-2): possibly our own earlier try, if `earlier` tries
    may have landed and the contract lets us read the object back; else a real conflict."""
    if earlier and contract.readback:
        return Decision(
            step=Step.READ_BACK,
            reason=f"precondition failed after {earlier} try(s) that may have landed",
            may_have_landed=earlier,
        )
    return Decision(step=Step.SUSPEND_CONFLICT, reason="the remote object changed (conflict)")


def key_retained(ctx: RecoveryInput) -> bool:
    """G-5: the remote still honours the create's frozen idempotency key for a re-send
    decided at `ctx.now` (rule 4): the frozen retention, counted from the first try's
    send, has at least one remote activity's start-to-close (the re-send's whole life)
    left. Unknown retention, send time or clock: not retained."""
    retention = ctx.contract.post_key_retention_seconds
    sent = [e.sending_at for e in ctx.journal if e.sending_at is not None]
    if not ctx.contract.post_replay_safe or retention is None or ctx.now is None or not sent:
        return False
    if len(sent) != len(ctx.journal):
        return False  # a try without its send time: its key's age is unknown
    expires = min(sent) + timedelta(seconds=retention)
    return ctx.now + REMOTE_ACTIVITY_START_TO_CLOSE < expires


def _settled(ctx: RecoveryInput) -> Decision | None:
    if ctx.kind is SendKind.CREATE:
        status = AttemptStatus(ctx.status)
        if status is AttemptStatus.WRITEBACK_PENDING:
            return Decision(step=Step.RESUME_WRITEBACK, reason="remote id already durable")
        if status in {AttemptStatus.PENDING, AttemptStatus.PROCESSING, AttemptStatus.POST_SENT}:
            return None
    elif PatchStatus(ctx.status) in {PatchStatus.PENDING, PatchStatus.PROCESSING}:
        return None
    return Decision(step=Step.NOTHING, reason=f"{ctx.status}: nothing to send")


def _budget_spent(ctx: RecoveryInput) -> str | None:
    """PROF-1: "not applied" waits are bounded by time, not by the retry count."""
    refusals = [e for e in ctx.journal if not_applied(e) and e.sending_at is not None]
    # A daily refusal waits for the quota's reset, however long: the budget counts the
    # remote's refusals after the newest one, never the day's wait itself.
    daily = [i for i, e in enumerate(refusals) if e.daily_refusal]
    if daily:
        refusals = refusals[daily[-1] + 1 :]
    if not refusals or ctx.now is None:
        return None
    first = refusals[0].sending_at
    assert first is not None
    budget = ctx.contract.not_applied_budget_seconds
    if (ctx.now - first).total_seconds() <= budget:
        return None
    return f"the remote refused every try as not applied for more than {budget} s"


def _unresolved_conflict(journal: Iterable[JournalEntry]) -> bool:
    """The newest answered try of a PATCH was a 409/412 and the PATCH is still running: the
    conflict is not settled (a real one suspends the link at once), so the read-back that
    PROF-2 asks for was inconclusive. `failed` would claim a refusal the remote may not
    have meant (an earlier PATCH of ours may be what moved the entity tag); fail closed."""
    answered = [e for e in journal if e.outcome is SendOutcome.ANSWERED]
    return bool(answered) and answered[-1].status in PATCH_CONFLICT


def _exhausted(landed: int, why: str) -> Decision:
    if landed:
        return Decision(
            step=Step.PARK_AMBIGUOUS,
            reason=f"{why}; {landed} try(s) may have landed, outcome unknown",
            may_have_landed=landed,
        )
    return Decision(step=Step.TERMINAL, reason=f"{why}; no try had an effect on the remote")


def _after_possible_effect(ctx: RecoveryInput, landed: int) -> Decision:
    contract = ctx.contract
    why = f"{landed} earlier try(s) may have landed"
    if ctx.kind is SendKind.PATCH:
        # C-2: a PATCH that may have landed is never sent again; a declared read-back may
        # prove it applied (a GET), else it is ambiguous for an operator.
        if contract.readback:
            return Decision(step=Step.READ_BACK, reason=why, may_have_landed=landed)
        return Decision(
            step=Step.PARK_AMBIGUOUS,
            reason=f"{why}; a PATCH that may have landed is never re-sent (C-2)",
            may_have_landed=landed,
        )
    if ctx.deferred:
        return Decision(
            step=Step.PARK_AMBIGUOUS,
            reason=f"{why}; a deferred-lane create is never replayed (C-3)",
            may_have_landed=landed,
        )
    if key_retained(ctx):
        return Decision(step=Step.RESEND_REPLAY_SAFE, reason=why, may_have_landed=landed)
    if contract.post_idempotency_header is not None:
        why = f"{why}; {_key_not_retained(contract)}"
    if contract.locator_recovery is not None:
        return Decision(step=Step.LOOKUP_LOCATOR, reason=why, may_have_landed=landed)
    return Decision(
        step=Step.PARK_AMBIGUOUS,
        reason=f"{why}; the profile declares no safe re-send",
        may_have_landed=landed,
    )


def _key_not_retained(contract: ProfileSnapshot) -> str:
    """Why a re-send under the idempotency key is not replay-safe (G-5), for operators."""
    retention = contract.post_key_retention_seconds
    if retention is None:
        return (
            "the idempotency key's retention was not frozen with this request (keyRetention"
            " undeclared): treated as expired (G-5)"
        )
    return f"the idempotency key may have expired (keyRetention {retention} s, G-5)"
