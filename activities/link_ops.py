"""LinkWorkflow activities after the create: PATCH dispatch, remote evidence, parking on
exhausted retries and operator actions (SPEC PATCH-1..3, ING-6, REC-3, WF-3)."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.patch_dispatch import PatchDispatch
from activities.rate_limit import paced
from db import links as q
from db import patches as pq
from protocol.errors import ActivityErrorType as E
from protocol.errors import SuspendReason
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    OperatorActionInput,
    OperatorResult,
    ParkInput,
    StepResult,
)
from protocol.operator import OperatorAction
from protocol.readback import update_path_of
from services.operator import ReadBackEtag, Refresh, apply_operator_action, park_in_flight
from services.rows import link_snapshot


class LinkOpsActivities(PatchDispatch):
    # -- PATCH (PATCH-1..3) -------------------------------------------------------------

    @activity.defn
    async def dispatch_patch(self, input: DispatchInput) -> StepResult:
        """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
        if (later := await paced(self._pool, input.link_key)) is not None:
            return later  # NF-8: the budget's next slot is out of reach; nothing was sent
        return await self._dispatch_patch(input.link_key)

    @activity.defn
    async def apply_remote_evidence(self, input: EvidenceInput) -> StepResult:
        """ING-6: the remote deleted the linked object: suspend the link, never re-create."""
        ev = input.evidence
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            detail = f"event {ev.event_id}: {ev.detail or ev.reason}"
            evidence = [{"surface": "remote", "disposition": "fail_closed", "detail": detail}]
            await pq.suspend_link(conn, input.link_key, ev.reason, evidence)
            await pq.supersede_queued(conn, input.link_key, f"link suspended: {ev.reason}")
            return await self._settled(conn, input.link_key)

    @activity.defn
    async def park_exhausted(self, input: ParkInput) -> StepResult:
        """REC-3: retries ran out; park what is in flight durably, never delete it."""
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            await park_in_flight(conn, input.link_key, input.error)
            return await self._settled(conn, input.link_key)

    async def _refreshed_etag(self, input: OperatorActionInput) -> Refresh:
        """PROF-2: revalidating a `remote_conflict` link reads the object back first, so
        the next PATCH carries the entity tag of what the operator accepted (no lock is
        held across remote I/O; the activity re-checks the link under its lock)."""
        if input.action != OperatorAction.REVALIDATE:
            return None
        async with self._pool.acquire() as conn:
            row = await q.link_by_key(conn, input.link_key)
        if row is None or row["suspend_reason"] != SuspendReason.REMOTE_CONFLICT.value:
            return None
        link = link_snapshot(row)
        if not link.profile.readback:
            return ReadBackEtag(etag=None, read=False)
        read = await self._read_back(link.profile, link, update_path_of(link))
        if read is None:
            raise ApplicationError(
                "revalidate refused: the read-back of the remote object failed; "
                "nothing changed, retry when the remote answers",
                type=E.TRANSITION_CONFLICT.value,
                non_retryable=True,
            )
        return ReadBackEtag(etag=read[1], read=True)

    @activity.defn
    async def apply_operator_action(self, input: OperatorActionInput) -> OperatorResult:
        """Apply one operator update under the link lock, re-checking it against Postgres."""
        etag = await self._refreshed_etag(input)
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            message = await apply_operator_action(conn, input, self._view, etag)
            return OperatorResult(
                accepted=True, message=message, view=await self._view(conn, input.link_key)
            )
