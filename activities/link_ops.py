"""LinkWorkflow activities after the create: PATCH dispatch, remote evidence, parking on
exhausted retries and operator actions (SPEC PATCH-1..3, ING-6, REC-3, WF-3)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import JsonValue
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import remote
from activities.link_base import LinkActivityBase, fail
from activities.operator import ReadBackEtag, Refresh, apply_operator_action, park_in_flight
from activities.patch import PatchSend, plan_patch, record_outcome
from activities.rows import link_snapshot
from db import journal as jq
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
    StepKind,
    StepResult,
)
from protocol.operator import OperatorAction
from protocol.outcome import (
    PatchConflict,
    PatchEtagMoved,
    PatchRetry,
    PatchSucceeded,
    Transport,
    interpret_patch,
    parse_json,
)
from protocol.readback import readback_matches, readback_path, update_path_of
from protocol.recovery import Step, on_patch_conflict
from protocol.snapshots import LinkSnapshot, ProfileSnapshot


class LinkOpsActivities(LinkActivityBase):
    # -- PATCH (PATCH-1..3) -------------------------------------------------------------

    @activity.defn
    async def dispatch_patch(self, input: DispatchInput) -> StepResult:
        """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
        key = input.link_key
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            plan = await plan_patch(conn, key)
            if plan is None:
                return await self._settled(conn, key)
        journal_id = plan.journal_id
        if journal_id is None:
            async with self._pool.acquire() as conn:
                journal_id = await jq.checkpoint_patch(conn, plan.patch_id, plan.token)
                if journal_id is None:
                    raise fail(
                        E.TRANSITION_CONFLICT,
                        "PATCH claim lost; sent nothing",
                        await self._view(conn, key),
                    )
        activity.heartbeat()
        obs = await remote.send(
            self._http, "PATCH", plan.contract, plan.path, plan.headers, plan.body
        )
        obs = obs.model_copy(update={"now": datetime.now(UTC)})
        outcome = interpret_patch(obs, plan.contract)
        if isinstance(outcome, PatchConflict):
            outcome = await self._resolve_conflict(plan, outcome)
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            after = await record_outcome(conn, plan, journal_id, outcome, obs)
            if isinstance(after, float):
                view = await self._view(conn, key)
                detail = f"PATCH answered {obs.status} (not applied); re-sending in {after} s"
                return StepResult(
                    kind=StepKind.RETRY_LATER, view=view, detail=detail, retry_after_seconds=after
                )
            if after is None:
                return await self._settled(conn, key)
        raise after  # a Temporal retry, now that this try's outcome is durable

    async def _resolve_conflict(
        self, plan: PatchSend, conflict: PatchConflict
    ) -> PatchConflict | PatchSucceeded | PatchEtagMoved | PatchRetry:
        """PROF-2: a 409/412 after a write of ours that may have landed (an earlier try of
        this PATCH, or an earlier PATCH that ended ambiguous): read the object back. Holding
        this PATCH's values, it was applied; holding an earlier PATCH's, the entity tag moved
        because of us and this PATCH goes again; anything else is a real conflict."""
        earlier = plan.earlier_may_have_landed + len(plan.earlier_bodies)
        decision = on_patch_conflict(earlier, plan.contract)
        if decision.step is not Step.READ_BACK:
            return conflict
        read = await self._read_back(plan.contract, plan.link, plan.path)
        if read is None:
            return PatchRetry()  # inconclusive: retried once the 412 is in the journal
        document, etag = read
        if readback_matches(plan.body, document):
            return PatchSucceeded(etag=etag)
        if any(readback_matches(body, document) for body in plan.earlier_bodies):
            return PatchEtagMoved(etag=etag)
        return conflict

    async def _read_back(
        self, contract: ProfileSnapshot, link: LinkSnapshot, update_path: str
    ) -> tuple[JsonValue, str | None] | None:
        """GET the linked object (the profile's read-back path, else the update path)."""
        path = readback_path(contract, link, update_path)
        obs = await remote.send(self._http, "GET", contract, path, {}, None)
        if obs.transport is not Transport.RESPONSE or obs.status != 200:
            return None
        return parse_json(obs.body), obs.headers.get("etag")

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
