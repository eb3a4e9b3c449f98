"""The LinkWorkflow's steps beside a create and a PATCH (SPEC ING-6, REC-3, WF-3,
PROF-2): remote evidence, parking what ran out of retries, and operator actions, each
under the link key's lock; what each does to the rows is `services.operator`'s."""

from __future__ import annotations

from temporalio.client import Client

from db import links as q
from db import patches as pq
from protocol.errors import ActivityErrorType as E
from protocol.errors import SuspendReason
from protocol.messages import (
    OperatorActionInput,
    OperatorResult,
    RemoteEvidence,
    StepResult,
)
from protocol.operator import OperatorAction
from protocol.send_gate import Refused
from services.link_step import LinkStep, StepFailed, lock_link, settled, view
from services.operator import ReadBackEtag, Refresh, apply_operator_action, park_in_flight
from services.patch.answer import object_read
from services.patch.send import read_linked_object
from services.rows import link_snapshot


async def apply_remote_evidence(step: LinkStep, key: str, ev: RemoteEvidence) -> StepResult:
    """ING-6: the remote deleted the linked object: suspend the link, never re-create."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        detail = f"event {ev.event_id}: {ev.detail or ev.reason}"
        evidence = [{"surface": "remote", "disposition": "fail_closed", "detail": detail}]
        await pq.suspend_link(conn, key, ev.reason, evidence)
        await pq.supersede_queued(conn, key, f"link suspended: {ev.reason}")
        return await settled(conn, key)


async def park_exhausted(step: LinkStep, key: str, error: str) -> StepResult:
    """REC-3: retries ran out; park what is in flight durably, never delete it."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        await park_in_flight(conn, key, error)
        return await settled(conn, key)


async def operator_action(
    step: LinkStep, input: OperatorActionInput, temporal_identity: str | None = None
) -> OperatorResult:
    """Apply one operator update under the link lock, re-checking it against Postgres;
    `temporal_identity` goes to the audit entry beside the declared operator (S-5)."""
    etag = await _refreshed_etag(step, input)
    async with step.tx(input.link_key) as conn:
        await lock_link(conn, input.link_key)
        message = await apply_operator_action(conn, input, view, etag, temporal_identity)
        return OperatorResult(accepted=True, message=message, view=await view(conn, input.link_key))


async def update_identity(
    client: Client, workflow_id: str | None, run_id: str | None, update_id: str | None
) -> str:
    """S-5: the client identity the Temporal server recorded for update `update_id` of
    this run (its accepted event); the worker's own, marked as such, when the history has
    none (an action scheduled before updates carried their id).

    One history read per operator action: they are rare, and the accepted event precedes
    the activity's scheduling, so it is there when the activity runs.
    """
    if update_id is not None and workflow_id is not None:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        async for event in handle.fetch_history_events():
            if not event.HasField("workflow_execution_update_accepted_event_attributes"):
                continue
            meta = event.workflow_execution_update_accepted_event_attributes.accepted_request.meta
            if meta.update_id == update_id:
                return meta.identity
    return f"{client.identity} (the worker's: update {update_id} not found in the history)"


async def _refreshed_etag(step: LinkStep, input: OperatorActionInput) -> Refresh:
    """PROF-2: revalidating a `remote_conflict` link reads the object back first, so
    the next PATCH carries the entity tag of what the operator accepted (no lock is
    held across remote I/O; the step re-checks the link under its lock)."""
    if input.action != OperatorAction.REVALIDATE:
        return None
    async with step.pool.acquire() as conn:
        row = await q.link_by_key(conn, input.link_key)
    if row is None or row["suspend_reason"] != SuspendReason.REMOTE_CONFLICT.value:
        return None
    link = link_snapshot(row)
    if not link.profile.readback:
        return ReadBackEtag(etag=None, read=False)
    obs = await read_linked_object(step, link)
    if isinstance(obs, Refused):  # G-1: the read would go elsewhere, or as someone else
        raise StepFailed(E.GATE_FAILED, f"revalidate refused: nothing was read: {obs.detail}", None)
    read = object_read(obs)
    if read is None:
        raise StepFailed(
            E.TRANSITION_CONFLICT,
            "revalidate refused: the read-back of the remote object failed; "
            "nothing changed, retry when the remote answers",
            None,
        )
    return ReadBackEtag(etag=read[1], read=True)
