"""LinkWorkflow activities after the create: PATCH dispatch, remote evidence, parking on
exhausted retries and operator actions (SPEC PATCH-1..3, ING-6, REC-3, WF-3)."""

from __future__ import annotations

from temporalio import activity

from activities import remote
from activities.link_base import LinkActivityBase, fail
from activities.operator import apply_operator_action, park_in_flight
from activities.patch import plan_patch, record_outcome
from db import links as q
from db import patches as pq
from protocol.errors import ActivityErrorType as E
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    OperatorActionInput,
    OperatorResult,
    ParkInput,
    StepResult,
)
from protocol.outcome import Transport, interpret_patch


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
        if not plan.checkpointed:
            async with self._pool.acquire() as conn:
                if not await pq.checkpoint_patch(conn, plan.patch_id, plan.token):
                    raise fail(
                        E.TRANSITION_CONFLICT,
                        "PATCH claim lost; sent nothing",
                        await self._view(conn, key),
                    )
        activity.heartbeat()
        obs = await remote.send(
            self._http,
            "PATCH",
            plan.link.profile,
            plan.path,
            plan.headers,
            plan.body,
            previously_started=plan.checkpointed,
        )
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            if obs.transport is Transport.NOT_SENT:
                await pq.clear_patch_checkpoint(conn, plan.patch_id, plan.token)
            outcome = interpret_patch(obs, plan.link.profile.patch_replay_safe)
            await record_outcome(conn, plan, outcome, obs)
            return await self._settled(conn, key)

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

    @activity.defn
    async def apply_operator_action(self, input: OperatorActionInput) -> OperatorResult:
        """Apply one operator update under the link lock, re-checking it against Postgres."""
        async with self._tx(input.link_key) as conn:
            await q.lock_link_key(conn, input.link_key)
            message = await apply_operator_action(conn, input, self._view)
            return OperatorResult(
                accepted=True, message=message, view=await self._view(conn, input.link_key)
            )
