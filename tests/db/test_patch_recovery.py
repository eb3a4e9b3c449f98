"""PATCH lease recovery (SPEC §4 PAT; seed "Deferred Association Dispatch Lane": a
`processing` PATCH returns to `pending` with its retry count advanced only when
`RemoteIOStartedAt` is null; issue 15)."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from db import journal as jq
from db import patches as pq
from protocol.snapshots import ProfileSnapshot
from protocol.states import PatchStatus, ProtocolError
from services.operator import park_in_flight
from tests.db.rows import insert_link, insert_pack_install, insert_patch
from tests.unit.factories import demo_manifest

# The demo pack's locator profile: it declares a read-back (PROF-2).
LOCATOR = ProfileSnapshot.of(demo_manifest().profiles[2])


async def _row(conn: asyncpg.Connection, patch_id: uuid.UUID) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT status, retry_count, claim_token, last_error FROM connector_patch_dispatch "
        "WHERE patch_id = $1",
        patch_id,
    )
    assert row is not None
    return row


async def _lost(conn: asyncpg.Connection, link_key: str) -> uuid.UUID:
    patch_id = await insert_patch(conn, link_key=link_key)
    assert await pq.claim_patch(conn, patch_id, uuid.uuid4())
    return patch_id


async def test_a_lost_claim_without_checkpoint_returns_to_pending_counting_the_retry(
    db_pool: asyncpg.Pool,
) -> None:
    async with db_pool.acquire() as conn:
        link = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await _lost(conn, link)
        assert await pq.release_lost_patch(conn, patch_id) == "pending"
        row = await _row(conn, patch_id)
        assert (row["status"], row["retry_count"], row["claim_token"]) == ("pending", 1, None)


async def test_with_a_newer_queued_patch_the_lost_one_fails_and_the_queued_one_goes(
    db_pool: asyncpg.Pool,
) -> None:
    """One pending PATCH per link: the newer queued one (the latest state) is what goes."""
    async with db_pool.acquire() as conn:
        link = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await _lost(conn, link)
        queued = await insert_patch(conn, link_key=link)
        assert await pq.release_lost_patch(conn, patch_id) == "failed"
        row = await _row(conn, patch_id)
        assert (row["status"], row["retry_count"]) == ("failed", 1)
        assert "claim lost before any remote I/O" in row["last_error"]
        assert (await _row(conn, queued))["status"] == "pending"


async def test_a_checkpointed_or_unknown_lane_patch_is_not_released(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        link = await insert_link(conn, await insert_pack_install(conn))
        sent = await _lost(conn, link)
        await conn.execute(
            "UPDATE connector_patch_dispatch SET remote_io_started_at = now() WHERE patch_id = $1",
            sent,
        )
        assert await pq.release_lost_patch(conn, sent) is None
        foreign = await _lost(conn, await insert_link(conn, await insert_pack_install(conn)))
        await conn.execute(
            "UPDATE connector_patch_dispatch SET dispatch_lane = 'lane_from_the_future' "
            "WHERE patch_id = $1",
            foreign,
        )
        assert await pq.release_lost_patch(conn, foreign) is None
        assert (await _row(conn, sent))["status"] == "processing"
        assert (await _row(conn, foreign))["status"] == "processing"


async def test_retries_exhausted_after_an_unsettled_412_park_the_patch_not_fail_it(
    db_pool: asyncpg.Pool,
) -> None:
    """Chaos seed 72 (PROF-2): every try of this PATCH was answered 412 and its read-back
    could not tell whose values the object holds; when its retries run out it parks
    `ambiguous_remote_effect` for reconcile. The same PATCH refused 400 ends `failed`."""

    async def exhausted_after(status: int) -> str:
        async with db_pool.acquire() as conn:
            link = await insert_link(conn, await insert_pack_install(conn))
            await conn.execute(  # the link's frozen contract: a profile with a read-back
                "UPDATE connector_remote_link SET profile_snapshot = $2::jsonb, "
                "mirror_remote_id_field = 'remote_id__c', "
                "mirror_provenance_field = 'remote_provenance__c', "
                "mirror_source_object = source_object "
                "WHERE link_key = $1",
                link,
                json.dumps(LOCATOR.model_dump(mode="json")),
            )
            patch_id = await insert_patch(conn, link_key=link)
            token = uuid.uuid4()
            assert await pq.claim_patch(conn, patch_id, token)
            journal_id = await jq.checkpoint_patch(conn, patch_id, token)
            assert journal_id is not None
            assert await jq.record_outcome(conn, journal_id, "answered", status, None, None)
            async with conn.transaction():
                await park_in_flight(conn, link, "retries exhausted")
            return str((await _row(conn, patch_id))["status"])

    assert await exhausted_after(412) == "ambiguous_remote_effect"
    assert await exhausted_after(400) == "failed"


async def test_finishing_a_patch_into_a_state_pat_forbids_is_refused_before_the_statement(
    db_pool: asyncpg.Pool,
) -> None:
    """`finish_patch` moves a `processing` PATCH; a target the table does not allow from
    there (superseded: only queued or failed ones are) is a ProtocolError naming both
    states, raised before Postgres's trigger could see it, and the row is untouched."""
    async with db_pool.acquire() as conn:
        link = await insert_link(conn, await insert_pack_install(conn))
        patch_id = await _lost(conn, link)
        with pytest.raises(ProtocolError, match="processing -> superseded"):
            await pq.finish_patch(conn, patch_id, PatchStatus.SUPERSEDED, last_error="x")
        assert (await _row(conn, patch_id))["status"] == "processing"
