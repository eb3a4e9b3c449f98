"""A `remote_deleted` signal acted on only for a stored event (SPEC S-2, ING-6).

Whoever can signal a link's workflow can name any event id; the worker suspends the
link only when Postgres holds that event as a deletion of the very object the link
points at (the event row, or the G-8 evidence recorded from it). The suspension's
reason and detail come from that stored fact, never from the signal. Anything else
suspends nothing: the link's view is returned as it is, and the refusal is logged.
"""

from __future__ import annotations

import logging

from db import remote_deletions as deletions_q
from protocol.ingress_policy import InboundHandler
from protocol.messages import RemoteEvidence, StepResult
from services import link_ops
from services.link_step import LinkStep, settled

log = logging.getLogger(__name__)


async def apply_stored_remote_evidence(
    step: LinkStep, key: str, signalled: RemoteEvidence
) -> StepResult:
    """Suspend the link for a stored deletion event of its object; otherwise change nothing."""
    async with step.pool.acquire() as conn:
        deleted = await deletions_q.link_object_deleted_by(
            conn, key, signalled.event_id, InboundHandler.REMOTE_DELETION
        )
        if deleted is None:
            log.warning(
                "remote_deleted signal refused: no stored deletion event of this link's "
                "remote object has that id; nothing suspended",
                extra={"link_key": key},
            )
            return await settled(conn, key)
    evidence = RemoteEvidence(
        event_id=signalled.event_id,
        detail=f"{deleted.target_object} {deleted.remote_id} deleted remotely",
    )
    return await link_ops.apply_remote_evidence(step, key, evidence)
