"""Every request the create path sends (SPEC POST-1, REC-1, REC-4, §17 G-1): the frozen
create, behind its fence, and the look-up of its unique locator, each after the send
gate passed in the transaction that claimed or checkpointed it (`services.create.claim`)
and each with its journal row. Nothing else on this path reaches the remote."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from db import journal as jq
from protocol.outcome import Observation
from protocol.request import locator_lookup_path
from services import remote
from services.create.claim import CreateSend, LocatorLookup
from services.evidence import record_try
from services.link_step import LinkStep, fenced


@dataclass(frozen=True)
class SentTry:
    """One try that passed its fence: its claim and its journal row (None for a GET)."""

    attempt_id: str
    token: uuid.UUID
    journal_id: int | None


async def send_create(step: LinkStep, key: str, plan: CreateSend) -> tuple[SentTry, Observation]:
    """REC-1: write this try's checkpoint and journal row under its claim (unless the
    claim wrote them), then send the frozen request, never one rebuilt from live data."""
    await step.hooks.before_checkpoint(plan.attempt_id)
    journal_id = await fenced(
        step,
        key,
        plan.journal_id,
        lambda conn: jq.checkpoint_attempt(conn, plan.attempt_id, plan.token),
        "claim lost before remote I/O; sent nothing",
    )
    step.heartbeat()
    request = plan.request
    obs = await remote.send(
        step.http,
        request.method,
        request.profile,
        request.relative_path,
        request.headers,
        request.body,
        deadline=step.deadline,
        turn=step.turn(request.remote_scope),
    )
    obs = obs.model_copy(update={"now": datetime.now(UTC)})
    await step.hooks.after_answer(plan.attempt_id)
    return SentTry(plan.attempt_id, plan.token, journal_id), obs


async def look_up_locator(step: LinkStep, lookup: LocatorLookup) -> Observation:
    """GET the remote objects carrying the attempt's unique locator (REC-4): a read, its
    journal row written by the claim and its outcome right after the answer."""
    request = lookup.request
    recovery = request.profile.locator_recovery
    assert recovery is not None and request.locator_value is not None
    path = locator_lookup_path(recovery, request.target_object, request.locator_value)
    step.heartbeat()
    turn = step.turn(request.remote_scope)
    obs = await remote.send(
        step.http, "GET", request.profile, path, {}, None, deadline=step.deadline, turn=turn
    )
    obs = obs.model_copy(update={"now": datetime.now(UTC)})
    async with step.pool.acquire() as conn:
        await record_try(conn, lookup.journal_id, obs)
    return obs
