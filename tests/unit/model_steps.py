"""The steps of a link's work in the model-based test (tests/unit/test_model_rules.py), in
the shape of services/create and services/patch: admit a save, claim and gate a request,
send it, apply the remote's answer. Each step asks the product's pure rules what to do
and does it on the `World`; the send-time invariants are asserted where a request
leaves (`send_create`, `send_patch`), read off the model's own state."""

from __future__ import annotations

import json
from datetime import timedelta

from protocol.active import ActiveMetadata
from protocol.admission import AdmissionDecision, CreateReserved, PatchQueued, Rejected
from protocol.drift import Disposition, classify, fails_closed, suspend_reason
from protocol.errors import RejectReason
from protocol.gates import decide_admission, decide_patch
from protocol.outcome import (
    Ambiguous,
    Created,
    NotApplied,
    Observation,
    PatchAmbiguous,
    PatchFailed,
    PatchSucceeded,
    RemoteRejected,
    Transport,
    interpret_patch,
    interpret_post,
    send_outcome,
)
from protocol.recovery import (
    Decision,
    RecoveryInput,
    SendKind,
    Step,
    may_have_landed,
    next_step,
    on_definite_rejection,
)
from protocol.send_gate import GateInput, KeyAge, Refusal, Refused, RequestKind, SourceNow, decide
from protocol.snapshots import AttemptSnapshot, LinkSnapshot
from protocol.states import AttemptStatus, LinkStatus, PatchStatus
from tests.unit.factories import NOW
from tests.unit.model_world import (
    PERMISSIONS,
    AttemptRow,
    LinkRow,
    PatchRow,
    Sendable,
    World,
    admission_context,
    attempt_of,
    link_of,
    save_request,
)

A, P, L = AttemptStatus, PatchStatus, LinkStatus
# The G-1 row of each create step that sends (services/create/claim.py).
REQUEST_KIND = {
    Step.SEND: RequestKind.CREATE_FIRST,
    Step.RESEND_REPLAY_SAFE: RequestKind.CREATE_RESEND,
}
LIVE_ATTEMPT = (A.PENDING, A.PROCESSING, A.POST_SENT)


def observation(answer: str, created: str | None, success: int) -> Observation:
    """What the transport saw for one try (`created`: the id a landed create names)."""
    if answer == "lost":
        return Observation(transport=Transport.TIMEOUT)
    status = {"landed": success, "not_applied": 429, "4xx": 422, "5xx": 500}[answer]
    body = json.dumps({"id": created}).encode() if created and answer == "landed" else None
    return Observation(transport=Transport.RESPONSE, status=status, body=body, now=NOW)


def fail_closed(frozen: LinkSnapshot | AttemptSnapshot, active: ActiveMetadata) -> list[str]:
    """The drift matrix's fail-closed surfaces for `frozen` now (the invariant's oracle)."""
    found = classify(frozen, active)
    return [f.surface.value for f in found if f.disposition is Disposition.FAIL_CLOSED]


def recovery(world: World, row: Sendable, kind: SendKind, exhausted: bool = False) -> RecoveryInput:
    if isinstance(row, AttemptRow):
        status, contract = row.status.value, row.snap.request.profile
    else:
        assert isinstance(row, PatchRow) and row.contract is not None
        status, contract = row.status.value, row.contract
    return RecoveryInput(
        kind=kind,
        status=status,
        journal=tuple(row.journal),
        contract=contract,
        checkpoint_set=row.checkpoint,
        exhausted=exhausted,
        now=world.now,
    )


# -- admission ---------------------------------------------------------------------


def save(world: World, slot: str) -> AdmissionDecision | None:
    """A save reported under `slot`, admitted (saves are decided one after the other: the
    real serialization is a Postgres lock, so the gate's rule alone must refuse)."""
    active = world.install.active(slot)
    if not active.usable:
        return None  # the slot does not resolve: refused before any row is read
    n = world.next_id()
    request = save_request(slot, active.destination_slot_id)
    decision = decide_admission(
        admission_context(world.rows, world.install, active, request, f"idem-{n}")
    )
    admit(world, decision, n)
    return decision


def admit(world: World, decision: AdmissionDecision, n: int) -> None:
    if isinstance(decision, CreateReserved):
        attempts = world.rows.attempts.setdefault(decision.reservation.link_key, [])
        snap = attempt_of(decision.reservation, f"att-{n}", len(attempts) + 1)
        attempts.append(AttemptRow(snap=snap))
    elif isinstance(decision, PatchQueued):
        world.rows.patches.setdefault(decision.link_key, []).append(PatchRow())


# -- the create path ---------------------------------------------------------------


def dispatchable_attempts(world: World) -> list[AttemptRow]:
    rows = world.rows.all_attempts()
    return [a for a in rows if a.status in LIVE_ATTEMPT and a.in_flight is None]


def dispatch_create(world: World, row: AttemptRow, exhausted: bool) -> None:
    """The claim: the journal decides the next step, the send gate checks its request."""
    decision = next_step(recovery(world, row, SendKind.CREATE, exhausted))
    assert decision.step is not Step.LOOKUP_LOCATOR, "the model declares no locator"
    kind = REQUEST_KIND.get(decision.step)
    if kind is None:
        park_attempt(row, decision)
        return
    age = key_age(world, row) if kind is RequestKind.CREATE_RESEND else KeyAge()
    active = world.install.active_for(row.snap)
    verdict = decide(GateInput(kind=kind, frozen=row.snap, active=active, key_age=age))
    if isinstance(verdict, Refused):
        row.move(A.AMBIGUOUS_REMOTE_EFFECT if decision.may_have_landed else A.TERMINAL_FAILED)
        return
    send_create(world, row)


def key_age(world: World, row: AttemptRow) -> KeyAge:
    """G-5's input, as services/create/gate.py computes it: counted from the first send."""
    first = min(e.sending_at for e in row.journal if e.sending_at is not None)
    kept = row.snap.request.profile.post_key_retention_seconds
    return KeyAge(
        age_seconds=(world.now - first).total_seconds(),
        retention_seconds=float(kept) if kept else None,
    )


def park_attempt(row: AttemptRow, decision: Decision) -> None:
    if decision.step is Step.PARK_AMBIGUOUS:
        row.move(A.AMBIGUOUS_REMOTE_EFFECT)
    elif decision.step is Step.TERMINAL:
        row.move(A.TERMINAL_FAILED)


def send_create(world: World, row: AttemptRow) -> None:
    """The POST leaves: nothing fails it closed, and a re-send after a try that may have
    landed is replay-safe with its key still kept by the remote (G-5)."""
    closed = fail_closed(row.snap, world.install.active_for(row.snap))
    assert not closed, f"a create POST was sent against fail-closed drift: {closed}"
    profile = row.snap.request.profile
    if may_have_landed(row.journal, SendKind.CREATE):
        first = min(e.sending_at for e in row.journal if e.sending_at is not None)
        kept = timedelta(seconds=profile.post_key_retention_seconds or 0)
        assert profile.post_replay_safe, "a create that may have landed was sent again"
        assert world.now - first <= kept, "a create was re-sent after its key expired"
    if row.status is A.PENDING:
        row.move(A.PROCESSING)
    row.sent(world.next_id(), world.now, profile.not_applied_statuses)


def answer_create(world: World, row: AttemptRow, answer: str, applied: bool) -> None:
    """The remote's answer to a create's try (services/create/answer.py); a lost answer
    or a 5xx may or may not have created the object (`applied`)."""
    assert row.in_flight is not None
    sent_at = row.journal[row.in_flight].sending_at
    assert sent_at is not None
    made = answer == "landed" or (answer in ("lost", "5xx") and applied)
    created = world.remote.create(row.snap, sent_at) if made else None
    obs = observation(answer, created, 201)
    request = row.snap.request
    outcome = interpret_post(obs, request.response_id_path, request.profile)
    row.answered(outcome=send_outcome(obs), status=obs.status)
    match outcome:
        case Created(remote_id=remote_id):
            finalize(world, row, remote_id)
        case RemoteRejected(status=status):
            park_attempt(row, on_definite_rejection(recovery(world, row, SendKind.CREATE), status))
        case NotApplied():
            park_attempt(row, next_step(recovery(world, row, SendKind.CREATE)))
        case Ambiguous():
            row.move(A.AMBIGUOUS_REMOTE_EFFECT)
        case _:
            pass  # the next dispatch retries the same frozen request, as the journal allows


def finalize(world: World, row: AttemptRow, remote_id: str) -> None:
    """POST-2: the link finalized with the remote id, unless a live link holds that id
    (ID-4: parked ambiguous)."""
    links = world.rows.links.values()
    if any(k.snap.remote_id == remote_id and k.status is not L.RETIRED for k in links):
        row.move(A.AMBIGUOUS_REMOTE_EFFECT)
        return
    row.move(A.WRITEBACK_PENDING)
    row.move(A.FINALIZED)
    world.rows.links[row.snap.link_key] = LinkRow(link_of(row.snap, remote_id))


# -- the PATCH path ----------------------------------------------------------------


def queued_patch_keys(world: World) -> list[str]:
    """Links with a PATCH to claim or resume, none of whose tries is awaiting its answer."""
    keys = []
    for key, patches in sorted(world.rows.patches.items()):
        live = [p for p in patches if p.status in (P.PENDING, P.PROCESSING)]
        if live and all(p.in_flight is None for p in live):
            keys.append(key)
    return keys


def dispatch_patch(world: World, key: str, exhausted: bool) -> None:
    """services/patch/claim.py: resume the PATCH in flight as its journal allows, or claim
    the queued one; the send gate checks the request either way (C-2')."""
    link, patches = world.rows.links[key], world.rows.patches[key]
    if link.status is not L.FINALIZED:
        for queued in (p for p in patches if p.status is P.PENDING):
            queued.move(P.SUPERSEDED)
        return
    resumed = next((p for p in patches if p.status is P.PROCESSING), None)
    if resumed is not None:
        resume_patch(world, link, resumed, exhausted)
        return
    patch = next(p for p in patches if p.status is P.PENDING)
    patch.move(P.PROCESSING)
    if gate_patch(world, link, patch, frozenset()):
        plan_patch(world, link, patch)


def resume_patch(world: World, link: LinkRow, patch: PatchRow, exhausted: bool) -> None:
    decision = next_step(recovery(world, patch, SendKind.PATCH, exhausted))
    assert decision.step is not Step.READ_BACK, "the model declares no read-back"
    if decision.step is Step.SEND:
        if gate_patch(world, link, patch, patch.fields_sent):
            send_patch(world, link, patch)
    elif decision.step is Step.PARK_AMBIGUOUS:
        patch.move(P.AMBIGUOUS_REMOTE_EFFECT)
    elif decision.step is Step.TERMINAL:
        patch.move(P.FAILED)


def gate_patch(world: World, link: LinkRow, patch: PatchRow, fields: frozenset[str]) -> bool:
    """G-1's PATCH row (services/patch/gate.py); a refusal fails the PATCH and suspends
    the link as the matrix says. True: the request may go."""
    source = SourceNow(exists=True, permissions=PERMISSIONS, fields_sent=fields)
    active = world.install.active_for(link.snap)
    gate = GateInput(kind=RequestKind.PATCH, frozen=link.snap, active=active, source=source)
    verdict = decide(gate)
    if not isinstance(verdict, Refused):
        return True
    patch.move(P.AMBIGUOUS_REMOTE_EFFECT if verdict.refusal is Refusal.PARK else P.FAILED)
    if verdict.refusal is not Refusal.FAIL_PATCH and fails_closed(list(verdict.findings)):
        suspend(world, link, suspend_reason(verdict.findings))
    return False


def suspend(world: World, link: LinkRow, reason: str) -> None:
    link.move(L.SUSPENDED_DRIFT, suspend_reason=reason)
    for queued in world.rows.patches.get(link.snap.link_key, []):
        if queued.status is P.PENDING:
            queued.move(P.SUPERSEDED)


def plan_patch(world: World, link: LinkRow, patch: PatchRow) -> None:
    """PATCH-1 under the claim (services/patch/plan.py), then the body frozen and sent."""
    slot = link.snap.slot
    active = world.install.active_for(link.snap)
    request = save_request(slot.action_slot_id, slot.destination_slot_id)
    ctx = admission_context(world.rows, world.install, active, request, "patch")
    decision = decide_patch(ctx)
    if isinstance(decision, Rejected):
        patch.move(P.FAILED)
        if decision.reason is RejectReason.DRIFT_FAIL_CLOSED:
            suspend(world, link, suspend_reason(decision.findings))
        return
    patch.fields_sent = frozenset(decision.authority.allowed_fields)
    patch.contract = link.snap.profile
    send_patch(world, link, patch)


def send_patch(world: World, link: LinkRow, patch: PatchRow) -> None:
    """The PATCH leaves: the matrix's finalized-link column fails nothing closed, and no
    earlier try of this PATCH may have landed (C-2')."""
    active = world.install.active_for(link.snap)
    readable = active.model_copy(update={"readable_fields": PERMISSIONS.readable_fields})
    closed = fail_closed(link.snap, readable)
    assert not closed, f"a PATCH was sent against fail-closed drift: {closed}"
    assert not may_have_landed(patch.journal, SendKind.PATCH), (
        "a PATCH that may have landed re-sent"
    )
    assert patch.contract is not None
    patch.sent(world.next_id(), world.now, patch.contract.not_applied_statuses)


def answer_patch(world: World, patch: PatchRow, answer: str, applied: bool) -> None:
    """The remote's answer to a PATCH's try (services/patch/answer.py, apply.py)."""
    assert patch.contract is not None
    if answer == "landed" or (answer in ("lost", "5xx") and applied):
        world.remote.patches_applied += 1
    obs = observation(answer, None, 200)
    outcome = interpret_patch(obs, patch.contract)
    patch.answered(outcome=send_outcome(obs), status=obs.status)
    match outcome:
        case PatchSucceeded():
            patch.move(P.SUCCEEDED)
        case PatchAmbiguous():
            patch.move(P.AMBIGUOUS_REMOTE_EFFECT)
        case PatchFailed(status=status):
            park_patch(patch, on_definite_rejection(recovery(world, patch, SendKind.PATCH), status))
        case NotApplied():
            park_patch(patch, next_step(recovery(world, patch, SendKind.PATCH)))
        case _:
            raise AssertionError(f"an answer the model does not give: {outcome}")


def park_patch(patch: PatchRow, decision: Decision) -> None:
    if decision.step is Step.PARK_AMBIGUOUS:
        patch.move(P.AMBIGUOUS_REMOTE_EFFECT)
    elif decision.step is Step.TERMINAL:
        patch.move(P.FAILED)


def crash(world: World, row: Sendable, applied: bool) -> None:
    """The worker dies with a try in flight: its answer is never recorded (the journal
    keeps it as possibly landed) and the next step is decided from the journal alone."""
    if applied:
        if isinstance(row, AttemptRow):
            at = row.journal[row.in_flight or 0].sending_at
            assert at is not None
            world.remote.create(row.snap, at)
        else:
            world.remote.patches_applied += 1
    row.in_flight = None
