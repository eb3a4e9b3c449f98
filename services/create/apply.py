"""The states a create's answer leads to (SPEC POST-2, POST-3, ID-4, JRN-1): finalize the
link with its mirror, park the attempt for an operator, or only record the try; and
the mirror's own retries, which never re-send."""

from __future__ import annotations

import logging

from temporalio.exceptions import ApplicationError

from db import links as q
from db import slot_guard
from db.errors import RemoteLocatorClaimedError
from protocol.errors import ActivityErrorType as E
from protocol.messages import StepResult
from protocol.outcome import Observation, body_hash
from services.create.send import SentTry
from services.evidence import owner_of_remote_id, record_try
from services.link_step import (
    LinkStep,
    RetryKind,
    StepFailed,
    StepRetry,
    dependants,
    lock_link,
    view,
)
from services.mirror import finalize_with_mirror, write_mirror_now

log = logging.getLogger(__name__)


async def finalize(
    step: LinkStep, key: str, sent: SentTry, remote_id: str, obs: Observation, body_hash: str
) -> StepResult:
    """POST-2: the link `finalized` with the remote id and the mirror, in one transaction;
    another link owning that remote object parks the attempt (ID-4)."""
    status = obs.status
    # The entity tag, when the remote sends one, guards later PATCHes (If-Match).
    etag = obs.headers.get("etag")
    response = {"status": status, "remote_id": remote_id, "body_hash": body_hash, "etag": etag}
    async with step.pool.acquire() as conn:
        try:
            async with conn.transaction():
                # The link key's lock, like admission: otherwise an admission could read
                # "no link" before this commits and "attempt finalized, slot free" after
                # it (READ COMMITTED, statement by statement) and reserve a second create.
                # In the same statement, the owner's apply lock that the finalization
                # holds from the link's birth to its slot check (C-9, G-4).
                held = await slot_guard.lock_link_key_and_owner_shared(conn, key, sent.attempt_id)
                await record_try(conn, sent.journal_id, obs, remote_id)
                kind = await finalize_with_mirror(
                    conn, sent.attempt_id, sent.token, remote_id, response, apply_lock=held
                )
                now = await view(conn, key)
                waiting = await dependants(conn, now)
                log.info(
                    "create finalized with remote id %s",
                    remote_id,
                    extra={"link_key": key, "attempt_id": sent.attempt_id},
                )
                return StepResult(kind=kind, view=now, dependants=waiting)
        except RemoteLocatorClaimedError:
            owner = await owner_of_remote_id(conn, sent.attempt_id, remote_id)
        except ApplicationError as lost:
            if lost.type != E.TRANSITION_CONFLICT.value:
                raise
            # This try's claim is gone (it outlived its timeout and a retry claimed or
            # parked the attempt), so it finalizes nothing; but the answer it got is
            # evidence that only grows (JRN-1): keep the outcome and the remote id for
            # the operator who reconciles, then fail as before.
            await record_try(conn, sent.journal_id, obs, remote_id)
            log.warning(
                "create answered with remote id %s after this try lost its claim",
                remote_id,
                extra={"link_key": key, "attempt_id": sent.attempt_id},
            )
            raise
    # ID-4: another link owns this remote object: never PATCH two links to one object.
    # Our create may have landed (the remote answered with an id), so the attempt parks
    # ambiguous for an operator, never terminal (JRN-2).
    return await park(
        step,
        key,
        sent,
        obs,
        "ambiguous_remote_effect",
        E.STALE_REMOTE_LOCATOR,
        f"remote id {remote_id} is already linked to {owner} (stale_remote_locator)",
        remote_id=remote_id,
    )


async def park(
    step: LinkStep,
    key: str,
    sent: SentTry,
    obs: Observation,
    target: str,
    kind: E,
    message: str,
    remote_id: str | None = None,
    recorded: bool = False,
) -> StepResult:
    """Move the attempt this try claimed to `target` with what the answer was, then
    raise `kind` for the workflow (never returns)."""
    async with step.tx(key) as conn:
        if not recorded:
            await record_try(conn, sent.journal_id, obs, remote_id)
        moved = await q.move_attempt(
            conn,
            sent.attempt_id,
            ["processing", "post_sent"],
            target,
            token=sent.token,
            last_error=message,
            # What the answer was, like a 201's snapshot (POST-2, POST-4).
            response={
                "status": obs.status,
                "remote_id": remote_id,
                "body_hash": body_hash(obs.body),
                "etag": obs.headers.get("etag"),
            },
        )
        now = await view(conn, key)
    if not moved:
        raise StepFailed(E.TRANSITION_CONFLICT, "attempt moved under this claim", now)
    log.warning(
        "attempt parked %s (%s): %s",
        target,
        kind.value,
        message,
        extra={"link_key": key, "attempt_id": sent.attempt_id},
    )
    raise StepFailed(kind, message, now)


async def record_only(step: LinkStep, sent: SentTry, obs: Observation) -> None:
    """This try's journal outcome alone: the attempt stays as it is for the next try."""
    async with step.pool.acquire() as conn:
        await record_try(conn, sent.journal_id, obs)


async def write_mirror(step: LinkStep, key: str, attempt_id: str, give_up: bool) -> StepResult:
    """POST-3: retry the compatibility mirror only, never the create; `give_up` (the last
    try) records it skipped, the link staying authoritative."""
    async with step.tx(key) as conn:
        await lock_link(conn, key)
        attempt = await q.attempt_by_id(conn, attempt_id)
        assert attempt is not None, "attempts are never deleted"
        kind = await write_mirror_now(conn, attempt, give_up=give_up)
        now = await view(conn, key)
    if kind is None:
        raise StepRetry(
            RetryKind.MIRROR_CONFLICT, "mirror compare-and-set conflict; retrying the mirror only"
        )
    return StepResult(kind=kind, view=now)
