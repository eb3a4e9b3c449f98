"""A model-based test of the pure rules (SPEC §15, §17; issue 50 item 3).

Hypothesis drives random interleavings of saves of one record under one or two action
slots that create at one remote destination (on one destination slot or two, declared
separate owners or not), the remote's answers (landed, lost, declared not applied, 4xx,
5xx), crashes (a try whose answer is never recorded: the next step is decided from the
journal alone), pack applies (mapping, credential, endpoint, a slot removed or put back,
the same pack again, each a new install, or a reinstall), time passing beyond the
idempotency key's retention, and operator actions. Every decision is the product's own
pure function (`decide_admission`, `recovery.next_step`, `send_gate.decide`,
`outcome.interpret_*`, `operator.check_operator_action`, `restore_rule.refusal`); the
steps (tests/unit/model_steps.py, model_operator.py) only carry out what they decide on
the rows and the remote of tests/unit/model_world.py, as the services do.

Invariants, each read off the model rather than off the rule under test:
- at most one remote object per record and remote destination (per action slot where
  the pack declares the two slots separate); an object is released when its link retires;
- no POST or PATCH sent while the drift matrix fails it closed (the send gate's verdict),
  no PATCH sent again after a try that may have landed (C-2'), no create sent again after
  a try that may have landed unless replay-safe within its key's retention (G-5);
- every status move is in `protocol.states`' tables (a `ProtocolError` fails the run);
- every parked link's remedy names an operator action the guards accept (G-6);
- reconcile and revalidation never finalize or restore a link under a slot the active
  pack lacks (G-4, C-9).

`make test` runs a bounded profile, `CONNECTOR_PUSH_THOROUGH=1` a long one
(docs/testing-and-benchmarks.md, "The model-based test of the rules").
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from protocol.admission import CreateReserved, PatchQueued
from protocol.park import park_reason, remedy_for
from protocol.states import AttemptStatus, LinkStatus, PatchStatus
from tests.examples import THOROUGH
from tests.unit import model_operator as ops
from tests.unit import model_steps as steps
from tests.unit.model_world import SLOT_A, SLOT_B, AttemptRow, Config, Install, PatchRow, World

T = TypeVar("T")
PICK = st.integers(min_value=0, max_value=7)
# Weighted towards the answers that let a run go on to its next step.
ANSWERS = st.sampled_from(["landed", "landed", "lost", "not_applied", "not_applied", "4xx", "5xx"])
RARELY = st.sampled_from([False, False, False, True])  # retries exhausted
CHANGES = st.sampled_from(["mapping", "credential", "endpoint", "remove_a", "remove_b", "same"])
# Seconds: a retry's wait, an outage, and past the demo profile's 24 h keyRetention.
ELAPSED = st.sampled_from([5, 600, 3_600, 90_000])


def one_of(candidates: list[T], pick: int) -> T:
    return candidates[pick % len(candidates)]


class RulesMachine(RuleBasedStateMachine):
    """One owner, one record, its rows and the remote, driven through the pure rules."""

    world: World

    @initialize(
        two_slots=st.booleans(),
        second_destination=st.booleans(),
        separate=st.booleans(),
        profile=st.sampled_from(["sandbox-idempotent", "sandbox-plain"]),
    )
    def install_pack(
        self, two_slots: bool, second_destination: bool, separate: bool, profile: str
    ) -> None:
        config = Config(two_slots, second_destination, separate and two_slots, profile)
        self.world = World(Install(config, "install-0", frozenset()))

    @rule(pick=PICK)
    def save(self, pick: int) -> None:
        config = self.world.install.config
        steps.save(self.world, one_of([SLOT_A, SLOT_B] if config.two_slots else [SLOT_A], pick))

    @rule(pick=PICK, answer=ANSWERS, applied=st.booleans())
    def save_round_trip(self, pick: int, answer: str, applied: bool) -> None:
        """A save, the create or PATCH it queued dispatched at once and its try answered:
        the common case in one step, so that runs reach a PATCH between its tries often."""
        config = self.world.install.config
        slot = one_of([SLOT_A, SLOT_B] if config.two_slots else [SLOT_A], pick)
        decision = steps.save(self.world, slot)
        if isinstance(decision, CreateReserved):
            row = self.world.rows.attempts[decision.reservation.link_key][-1]
            steps.dispatch_create(self.world, row, exhausted=False)
            if row.in_flight is not None:
                steps.answer_create(self.world, row, answer, applied)
        elif isinstance(decision, PatchQueued) and decision.link_key in steps.queued_patch_keys(
            self.world
        ):
            steps.dispatch_patch(self.world, decision.link_key, exhausted=False)
            patches = self.world.rows.patches[decision.link_key]
            flying = [p for p in patches if p.in_flight is not None]
            if flying:
                steps.answer_patch(self.world, flying[0], answer, applied)

    @precondition(lambda self: self.world.install.config.two_slots)
    @rule(first=st.sampled_from([SLOT_A, SLOT_B]))
    def two_slot_save(self, first: str) -> None:
        """One record saved under both action slots at once (the chaos campaign's
        `two_slot_save`): admitted one after the other, as the record's lock orders them."""
        for slot in (first, SLOT_B if first == SLOT_A else SLOT_A):
            steps.save(self.world, slot)

    @precondition(lambda self: bool(steps.dispatchable_attempts(self.world)))
    @rule(pick=PICK, exhausted=RARELY)
    def dispatch_create(self, pick: int, exhausted: bool) -> None:
        row = one_of(steps.dispatchable_attempts(self.world), pick)
        steps.dispatch_create(self.world, row, exhausted)

    @precondition(lambda self: bool(steps.dispatchable_attempts(self.world)))
    @rule(pick=PICK, answer=ANSWERS, applied=st.booleans())
    def create_round_trip(self, pick: int, answer: str, applied: bool) -> None:
        """A dispatch whose try is answered at once: the common case, in one step, so that
        runs reach the states after it (links, PATCHes) often."""
        row = one_of(steps.dispatchable_attempts(self.world), pick)
        steps.dispatch_create(self.world, row, exhausted=False)
        if row.in_flight is not None:
            steps.answer_create(self.world, row, answer, applied)

    @precondition(lambda self: bool(self._flying_attempts()))
    @rule(pick=PICK, answer=ANSWERS, applied=st.booleans())
    def answer_create(self, pick: int, answer: str, applied: bool) -> None:
        steps.answer_create(self.world, one_of(self._flying_attempts(), pick), answer, applied)

    @precondition(lambda self: bool(steps.queued_patch_keys(self.world)))
    @rule(pick=PICK, exhausted=RARELY)
    def dispatch_patch(self, pick: int, exhausted: bool) -> None:
        steps.dispatch_patch(
            self.world, one_of(steps.queued_patch_keys(self.world), pick), exhausted
        )

    @precondition(lambda self: bool(steps.queued_patch_keys(self.world)))
    @rule(pick=PICK, answer=ANSWERS, applied=st.booleans())
    def patch_round_trip(self, pick: int, answer: str, applied: bool) -> None:
        key = one_of(steps.queued_patch_keys(self.world), pick)
        steps.dispatch_patch(self.world, key, exhausted=False)
        flying = [p for p in self.world.rows.patches[key] if p.in_flight is not None]
        if flying:
            steps.answer_patch(self.world, flying[0], answer, applied)

    @precondition(lambda self: bool(self._flying_patches()))
    @rule(pick=PICK, answer=ANSWERS, applied=st.booleans())
    def answer_patch(self, pick: int, answer: str, applied: bool) -> None:
        steps.answer_patch(self.world, one_of(self._flying_patches(), pick), answer, applied)

    @precondition(lambda self: bool(self._flying_attempts() + self._flying_patches()))
    @rule(pick=PICK, applied=st.booleans())
    def crash(self, pick: int, applied: bool) -> None:
        flying = [*self._flying_attempts(), *self._flying_patches()]
        steps.crash(self.world, one_of(flying, pick), applied)

    @precondition(lambda self: bool(self.world.rows.attempts))
    @rule(change=CHANGES, reinstall=RARELY)
    def apply_pack(self, change: str, reinstall: bool) -> None:
        ops.apply_pack(self.world, change, reinstall)

    @precondition(lambda self: bool(self._between_tries()))
    @rule(pick=PICK, change=CHANGES, reinstall=RARELY)
    def apply_pack_between_tries(self, pick: int, change: str, reinstall: bool) -> None:
        """A pack applied while a create or a PATCH waits for its next try (the chaos
        campaign's `pack_apply` with requests in flight), and that try resumed at once:
        the re-send meets the new configuration at its gate."""
        row = one_of(self._between_tries(), pick)
        ops.apply_pack(self.world, change, reinstall)
        if isinstance(row, AttemptRow):
            steps.dispatch_create(self.world, row, exhausted=False)
        else:
            steps.dispatch_patch(self.world, row, exhausted=False)

    @precondition(lambda self: bool(self.world.rows.attempts))
    @rule(seconds=ELAPSED)
    def time_passes(self, seconds: int) -> None:
        self.world.now += timedelta(seconds=seconds)

    # -- operator actions --------------------------------------------------------------

    @precondition(lambda self: bool(ops.ambiguous_with_an_object(self.world)))
    @rule(pick=PICK)
    def reconcile(self, pick: int) -> None:
        ops.reconcile(self.world, *one_of(ops.ambiguous_with_an_object(self.world), pick))

    @precondition(lambda self: bool(ops.newest_attempts(self.world, AttemptStatus.TERMINAL_FAILED)))
    @rule(pick=PICK)
    def supersede(self, pick: int) -> None:
        terminal = ops.newest_attempts(self.world, AttemptStatus.TERMINAL_FAILED)
        ops.supersede(self.world, one_of(terminal, pick))

    @precondition(lambda self: bool(ops.newest_attempts(self.world, AttemptStatus.PENDING)))
    @rule(pick=PICK)
    def mark_terminal(self, pick: int) -> None:
        ops.mark_terminal(
            self.world, one_of(ops.newest_attempts(self.world, AttemptStatus.PENDING), pick)
        )

    @precondition(
        lambda self: bool(
            ops.links_in(self.world, LinkStatus.FINALIZED, LinkStatus.SUSPENDED_DRIFT)
        )
    )
    @rule(pick=PICK)
    def retire(self, pick: int) -> None:
        live = ops.links_in(self.world, LinkStatus.FINALIZED, LinkStatus.SUSPENDED_DRIFT)
        ops.retire(self.world, one_of(live, pick))

    @precondition(lambda self: bool(ops.links_in(self.world, LinkStatus.SUSPENDED_DRIFT)))
    @rule(pick=PICK)
    def revalidate_link(self, pick: int) -> None:
        ops.revalidate_link(
            self.world, one_of(ops.links_in(self.world, LinkStatus.SUSPENDED_DRIFT), pick)
        )

    @precondition(lambda self: bool(self.world.rows.links))
    @rule()
    def revalidate_owner(self) -> None:
        ops.revalidate_owner(self.world)

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def one_remote_object_per_record_and_destination(self) -> None:
        owners = {a.snap.attempt_id: a.snap.link_key for a in self.world.rows.all_attempts()}
        separate = self.world.install.config.separate
        held: dict[tuple[object, ...], set[str]] = defaultdict(set)
        for obj in self.world.remote.objects:
            link = self.world.rows.links.get(owners[obj.attempt_id])
            if link is not None and link.status is LinkStatus.RETIRED:
                continue  # released by the operator
            held[(obj.destination, obj.action_slot if separate else "")].add(obj.remote_id)
        doubled = {where: ids for where, ids in held.items() if len(ids) > 1}
        assert not doubled, f"one record owns several remote objects at {doubled}"

    @invariant()
    def every_parked_link_has_an_exit(self) -> None:
        for key in self.world.rows.link_keys():
            view = self.world.rows.view(key)
            reason = park_reason(view)
            if reason is None:
                continue
            remedy = remedy_for(reason, view.suspend_reason, view.attempt_landing)
            accepted = [a for a in remedy.actions if ops.guard_accepts(a, view)]
            assert accepted, f"{key} parked {reason.value}: no action of {remedy.actions} applies"

    def _between_tries(self) -> list[AttemptRow | str]:
        """Creates and PATCHes (by link key) with a try sent and answered, the next to come."""
        attempts: list[AttemptRow | str] = [
            a for a in steps.dispatchable_attempts(self.world) if a.journal
        ]
        patches = self.world.rows.patches
        keys = [
            key
            for key in steps.queued_patch_keys(self.world)
            if any(p.status is PatchStatus.PROCESSING and p.journal for p in patches[key])
        ]
        return [*attempts, *keys]

    def _flying_attempts(self) -> list[AttemptRow]:
        return [a for a in self.world.rows.all_attempts() if a.in_flight is not None]

    def _flying_patches(self) -> list[PatchRow]:
        patches = self.world.rows.patches
        flying = [p for key in sorted(patches) for p in patches[key] if p.in_flight is not None]
        assert all(p.status is PatchStatus.PROCESSING for p in flying)
        return flying


RulesMachine.TestCase.settings = settings(
    max_examples=2_000 if THOROUGH else 100,
    stateful_step_count=50 if THOROUGH else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestModelRules = RulesMachine.TestCase
