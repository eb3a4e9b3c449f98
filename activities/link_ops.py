"""The LinkWorkflow's activities after the create: PATCH dispatch, remote evidence,
parking on exhausted retries and operator actions (SPEC PATCH-1..3, ING-6, REC-3,
WF-3): thin adapters over `services.patch`, `services.remote_evidence` and
`services.link_ops`."""

from __future__ import annotations

import asyncpg
import httpx
from temporalio import activity

from activities.link import link_step, pace_slot, step_error
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    OperatorActionInput,
    OperatorResult,
    ParkInput,
    StepResult,
)
from services import link_ops
from services.dispatch_hooks import DispatchHooks
from services.link_step import StepFailed, StepRetry
from services.patch.dispatch import dispatch_patch
from services.remote_evidence import apply_stored_remote_evidence


class LinkOpsActivities:
    """Bound to the worker's pool and HTTP client (and the test seams)."""

    def __init__(
        self, pool: asyncpg.Pool, http: httpx.AsyncClient, hooks: DispatchHooks | None = None
    ) -> None:
        self._pool = pool
        self._http = http
        self._hooks = hooks or DispatchHooks()

    @activity.defn
    async def dispatch_patch(self, input: DispatchInput) -> StepResult:
        """Claim the queued PATCH, gate it, send it to the link's remote id, record the outcome."""
        step = link_step(self._pool, self._http, self._hooks)
        try:
            return await dispatch_patch(step, input.link_key, pace_slot())
        except (StepFailed, StepRetry) as error:
            raise step_error(error) from None

    @activity.defn
    async def apply_remote_evidence(self, input: EvidenceInput) -> StepResult:
        """ING-6: the remote deleted the linked object: suspend the link, never re-create;
        only for a deletion event Postgres holds for that object (S-2)."""
        step = link_step(self._pool, self._http, self._hooks)
        return await apply_stored_remote_evidence(step, input.link_key, input.evidence)

    @activity.defn
    async def park_exhausted(self, input: ParkInput) -> StepResult:
        """REC-3: retries ran out; park what is in flight durably, never delete it."""
        step = link_step(self._pool, self._http, self._hooks)
        return await link_ops.park_exhausted(step, input.link_key, input.error)

    @activity.defn
    async def apply_operator_action(self, input: OperatorActionInput) -> OperatorResult:
        """Apply one operator update under the link lock, re-checking it against Postgres;
        the audit entry names the client identity of the update that carried it (S-5)."""
        info = activity.info()
        identity = await link_ops.update_identity(
            activity.client(), info.workflow_id, info.workflow_run_id, input.update_id
        )
        step = link_step(self._pool, self._http, self._hooks)
        try:
            return await link_ops.operator_action(step, input, identity)
        except StepFailed as error:
            raise step_error(error) from None
