"""Sending a link's queued PATCH (SPEC PATCH-1..3, PROF-2): shared by the PATCH activity
and the create activity, which carries on with the queued PATCH when it finds the link
finalized (one activity per PATCH, not two: issue 16, P8). Not an activity itself."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import JsonValue
from temporalio import activity

from activities.link_base import LinkActivityBase, QuotaExhausted
from db import journal as jq
from db import links as q
from protocol.daily_quota import names_daily_policy
from protocol.messages import StepKind, StepResult
from protocol.outcome import (
    Observation,
    PatchAmbiguous,
    PatchConflict,
    PatchEtagMoved,
    PatchOutcome,
    PatchRetry,
    PatchSucceeded,
    Transport,
    interpret_patch,
    parse_json,
)
from protocol.readback import readback_matches, readback_path
from protocol.recovery import Step, on_patch_conflict
from protocol.snapshots import LinkSnapshot, ProfileSnapshot
from services import daily_quota, remote
from services.patch import PatchSend, plan_patch, record_outcome


class PatchDispatch(LinkActivityBase):
    async def _dispatch_patch(self, key: str) -> StepResult:
        """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
        try:
            async with self._tx(key) as conn:
                await q.lock_link_key(conn, key)
                plan = await plan_patch(conn, key)
                if plan is None:
                    return await self._settled(conn, key)
                # The PATCH (or its read-back) spends the daily quota under its claim.
                await self._spend(conn, plan.link.remote_scope, plan.link.profile.credential_ref)
        except QuotaExhausted as exhausted:  # the claim rolled back: nothing was written
            return await self._quota_wait(key, exhausted.wait)
        journal_id: int | None = None
        outcome: PatchOutcome
        if plan.read_back_only:
            # C-2: an earlier try may have landed; a GET may prove it, nothing is sent.
            outcome, obs = await self._confirm_by_read_back(plan, "an earlier try may have landed")
        else:
            journal_id = await self._fenced(
                key,
                plan.journal_id,
                lambda conn: jq.checkpoint_patch(conn, plan.patch_id, plan.token),
                "PATCH claim lost; sent nothing",
            )
            activity.heartbeat()
            obs = await remote.send(
                self._http, "PATCH", plan.contract, plan.path, plan.headers, plan.body
            )
            obs = obs.model_copy(update={"now": datetime.now(UTC)})
            outcome = interpret_patch(obs, plan.contract)
            if isinstance(outcome, PatchConflict):
                outcome = await self._resolve_conflict(plan, outcome)
            elif isinstance(outcome, PatchAmbiguous) and plan.contract.readback:
                # C-2: this try may have landed; it is never sent again, but a declared
                # read-back may prove it applied. The try's own outcome is journalled.
                outcome, _ = await self._confirm_by_read_back(plan, outcome.reason)
        async with self._tx(key) as conn:
            await q.lock_link_key(conn, key)
            after = await record_outcome(conn, plan, journal_id, outcome, obs)
            daily = isinstance(after, float) and names_daily_policy(obs.status, obs.body)
            if daily:  # the remote's daily limit: the whole budget waits (issue 33 item 3)
                link = plan.link
                wait = await daily_quota.refuse_day(
                    self._pool,
                    conn,
                    link.remote_scope,
                    link.profile.credential_ref,
                    self._hooks.now(),
                )
            elif isinstance(after, float):
                view = await self._view(conn, key)
                detail = f"PATCH answered {obs.status} (not applied); re-sending in {after} s"
                return StepResult(
                    kind=StepKind.RETRY_LATER, view=view, detail=detail, retry_after_seconds=after
                )
            if after is None:
                return await self._settled(conn, key)
        if daily:
            return await self._quota_wait(key, wait)
        assert not isinstance(after, float | None)
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

    async def _confirm_by_read_back(
        self, plan: PatchSend, why: str
    ) -> tuple[PatchSucceeded | PatchAmbiguous, Observation]:
        """C-2 / PROF-2: GET the object; holding every value of the frozen body, the PATCH
        was applied (`succeeded`, the read's ETag stored); anything else (a different
        value, an unreadable object) leaves it `ambiguous_remote_effect`. A read, never a
        re-send: the returned observation is the GET's."""
        path = readback_path(plan.contract, plan.link, plan.path)
        obs = await remote.send(self._http, "GET", plan.contract, path, {}, None)
        obs = obs.model_copy(update={"now": datetime.now(UTC)})
        if obs.transport is not Transport.RESPONSE or obs.status != 200:
            return PatchAmbiguous(reason=f"{why}; read-back inconclusive"), obs
        if readback_matches(plan.body, parse_json(obs.body)):
            return PatchSucceeded(etag=obs.headers.get("etag")), obs
        return PatchAmbiguous(reason=f"{why}; read-back differs from the frozen body"), obs

    async def _read_back(
        self, contract: ProfileSnapshot, link: LinkSnapshot, update_path: str
    ) -> tuple[JsonValue, str | None] | None:
        """GET the linked object (the profile's read-back path, else the update path)."""
        path = readback_path(contract, link, update_path)
        obs = await remote.send(self._http, "GET", contract, path, {}, None)
        if obs.transport is not Transport.RESPONSE or obs.status != 200:
            return None
        return parse_json(obs.body), obs.headers.get("etag")
