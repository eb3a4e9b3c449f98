"""Every request the PATCH path sends (SPEC PATCH-3, REC-1, C-2, PROF-2): the PATCH
itself, behind its fence, and the read-back GETs that may prove an earlier try applied.
Nothing else on this path reaches the remote."""

from __future__ import annotations

from datetime import UTC, datetime

from db import journal as jq
from protocol.outcome import Observation
from protocol.readback import readback_path
from protocol.snapshots import LinkSnapshot, ProfileSnapshot
from services import remote
from services.link_step import LinkStep, fenced
from services.patch.plan import PatchSend


async def send_patch(step: LinkStep, key: str, plan: PatchSend) -> tuple[int, Observation]:
    """REC-1: write this try's checkpoint and journal row under its claim (unless the
    claim wrote them), then send the frozen PATCH; its journal row and the answer."""
    journal_id = await fenced(
        step,
        key,
        plan.journal_id,
        lambda conn: jq.checkpoint_patch(conn, plan.patch_id, plan.token),
        "PATCH claim lost; sent nothing",
    )
    step.heartbeat()
    obs = await remote.send(step.http, "PATCH", plan.contract, plan.path, plan.headers, plan.body)
    return journal_id, obs.model_copy(update={"now": datetime.now(UTC)})


async def read_back(
    step: LinkStep, contract: ProfileSnapshot, link: LinkSnapshot, update_path: str
) -> Observation:
    """GET the linked object (the profile's read-back path, else the update path): a
    read, never a re-send, and no journal row."""
    path = readback_path(contract, link, update_path)
    return await remote.send(step.http, "GET", contract, path, {}, None)
