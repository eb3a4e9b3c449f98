"""Inputs and results of the LinkWorkflow, its activities, updates and query (STYLE rule 4).

Plain pydantic values shared by `workflows/` and `activities/`; evolve them only
by adding optional fields, because histories hold them.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from protocol.landing import Landing
from protocol.rate_limit import RemoteBudgetResult
from protocol.states import AttemptStatus, LinkStatus, PatchStatus


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- workflow ------------------------------------------------------------------


class LinkWorkflowState(Message):
    """What a run carries into continue-as-new: the key, the remote budget it was paced
    with, and what its signals left unhandled (G-8); Postgres holds the rest."""

    link_key: str
    runs: int = 0
    budget: RemoteBudgetResult | None = None
    # G-8: queued `remote_deleted` evidence, a pending operator hold and the NF-8 bulk
    # flag of the saves so far (a queued save needs nothing: every run starts woken).
    evidence: list[RemoteEvidence] = Field(default_factory=list)
    hold: bool = False
    bulk: bool | None = None


class LinkWorkflowInput(Message):
    link_key: str
    state: LinkWorkflowState | None = None
    # PROF-3: the remote budget, when the starter knew it (the CRM entry does, from the
    # reservation); otherwise the run looks it up once before its first remote step.
    budget: RemoteBudgetResult | None = None


class LinkWorkflowResult(Message):
    link_key: str
    reason: str


class RecordSaved(Message):
    """Signal: "there may be work for this link" — the work itself is read from Postgres."""

    save_id: str | None = None
    # An operator command sends its update next: a run that would end (WF-1') waits
    # for it a bounded time (`workflows.link.OPERATOR_HOLD`).
    for_operator: bool = False
    # NF-8: admitted by a bulk `push`: the link's remote steps queue behind single saves
    # (a lower Temporal priority). Any save that is not bulk lifts the run back.
    bulk: bool = False


# -- activity: dispatch the create --------------------------------------------


class DispatchInput(Message):
    link_key: str


class StepKind(StrEnum):
    IDLE = "idle"  # nothing for this worker to do
    FINALIZED = "finalized"  # link finalized, mirror written or skipped
    WRITEBACK_PENDING = "writeback_pending"  # remote id durable, mirror to retry
    PARKED = "parked"  # needs an operator: ambiguous, terminal, foreign lane
    WAITING = "waiting"  # deferred association target not finalized yet
    PATCH_PENDING = "patch_pending"  # a finalized link has a queued PATCH
    # PROF-1: the remote answered "not applied"; wait `retry_after_seconds`, send again.
    RETRY_LATER = "retry_later"


class LinkView(Message):
    """The durable state the workflow mirrors into search attributes and its query."""

    link_key: str
    connector_owner_key: str | None = None
    destination_slot_id: str | None = None
    source_object: str | None = None
    source_record_id: str | None = None
    link_status: LinkStatus | None = None
    remote_id: str | None = None
    attempt_id: str | None = None
    attempt_status: AttemptStatus | None = None
    attempt_ordinal: int | None = None
    dispatch_lane: str | None = None
    last_error: str | None = None
    pending_patches: list[PatchStatus] = Field(default_factory=list)
    suspend_reason: str | None = None
    last_patch_status: PatchStatus | None = None
    # JRN-1: tries of the newest attempt / newest PATCH that may have reached the remote.
    attempt_tries_may_have_landed: int = 0
    patch_tries_may_have_landed: int = 0
    # G-6: what the send journal of a parked ambiguous attempt proves (`protocol.landing`);
    # None: not judged (any other state, or a view from before G-6: fail closed).
    attempt_landing: Landing | None = None
    # Set by the workflow's `state` query once the run has read Postgres.
    loaded: bool = False
    # Daily quota: the link's budget has spent its daily quota (or the remote refused
    # the day); the run sends nothing before this instant.
    quota_wait_until: datetime | None = None

    @property
    def needs_operator(self) -> bool:
        """A parked attempt or a suspended link. The LinkWorkflow also lists a link whose
        newest PATCH has an unknown outcome (`patch_outcome_unknown`)."""
        parked = {AttemptStatus.AMBIGUOUS_REMOTE_EFFECT, AttemptStatus.TERMINAL_FAILED}
        return self.attempt_status in parked or self.link_status is LinkStatus.SUSPENDED_DRIFT

    @property
    def patch_failed(self) -> bool:
        """REC-3: the newest PATCH failed with no effect (retries exhausted, or refused for
        good) and none is queued: the remote lags the record until a save's PATCH, so the
        failure is operator-visible, not silent."""
        return (
            self.link_status is LinkStatus.FINALIZED
            and self.last_patch_status is PatchStatus.FAILED
            and not self.pending_patches
        )

    @property
    def patch_outcome_unknown(self) -> bool:
        """The newest PATCH may or may not have landed: the remote may not hold the record's
        latest state until the next save's PATCH (always the full state) converges it."""
        return (
            self.link_status is LinkStatus.FINALIZED
            and self.last_patch_status is PatchStatus.AMBIGUOUS_REMOTE_EFFECT
            and not self.pending_patches
        )


class StepResult(Message):
    kind: StepKind
    view: LinkView
    detail: str | None = None
    retry_after_seconds: float | None = None
    # Links whose deferred create waited on this one (LANE-2): the workflow wakes them.
    dependants: list[str] = Field(default_factory=list)


class RemoteEvidence(Message):
    """Signal: the remote says the linked object is gone (ING-6); the link suspends."""

    event_id: str
    reason: str = "remote_deleted"
    detail: str | None = None


class EvidenceInput(Message):
    link_key: str
    evidence: RemoteEvidence


class ParkInput(Message):
    """Activity input after a step exhausted its retries (REC-3): make it durable and visible."""

    link_key: str
    error: str


class MirrorInput(Message):
    link_key: str
    attempt_id: str


# -- operator updates (WF-3) ---------------------------------------------------


class OperatorInput(Message):
    """Who and why, carried by every operator action."""

    operator: str = Field(min_length=1)
    reason: str = Field(min_length=1)


class SupersedeInput(OperatorInput):
    reserve_next: bool = True
    idempotency_key: str | None = None  # filled by the update handler, deterministically


class ReconcileInput(OperatorInput):
    remote_id: str = Field(min_length=1)
    evidence: str = Field(min_length=1)


class RetireInput(OperatorInput):
    pass


class MarkTerminalInput(OperatorInput):
    pass


class RevalidateInput(OperatorInput):
    pass


class OperatorActionInput(Message):
    """Activity input: the action, the target link and when the workflow accepted it."""

    link_key: str
    action: str
    operator: str
    reason: str
    accepted_at: datetime
    remote_id: str | None = None
    evidence: str | None = None
    reserve_next: bool = False
    new_idempotency_key: str | None = None
    # S-5: the update that carried the action, so the activity can read the client
    # identity the server recorded for it (None in histories older than the field).
    update_id: str | None = None


class OperatorResult(Message):
    accepted: bool
    message: str
    view: LinkView
