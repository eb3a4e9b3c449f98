"""SPEC §9 REV-2 against real Postgres: locks, zero-write validate, atomic apply, occupancy.

(Verify-only retries are in test_revalidation_retries.py, the CLI in test_revalidate_cli.py,
the receipt table's append-only trigger in test_receipts.py.)
"""

from __future__ import annotations

import asyncpg
import pytest

from db import link_batches as batches_q
from db import links as links_q
from db import revalidation as q
from protocol.link_row import (
    link_row_digest,
)
from protocol.revalidation import RevalidationResult
from protocol.revalidation_manifest import (
    RevalidationManifest,
)
from protocol.states import AttemptStatus
from services.revalidation import apply, validate
from tests.db.revalidation_support import (
    C,
    Entry,
    Links,
    S,
    attempt_at,
    plan,
    produced,
    reasons,
    state,
)
from tests.db.revalidation_support import links as links

# -- invariant 6: validate ---------------------------------------------------------------


async def test_validate_projects_the_receipts_apply_writes_and_writes_nothing(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    before = await state(conn)
    projected = await validate(conn, manifest)
    assert projected.status is S.VALIDATED
    assert [r.link_key for r in projected.receipts] == links.keys
    assert await state(conn) == before
    applied = await apply(conn, manifest)
    assert applied.status is S.APPLIED and applied.receipts == projected.receipts


@pytest.mark.parametrize("entry", [validate, apply], ids=["validate", "apply"])
@pytest.mark.parametrize("lock", ["link", "batch"])
async def test_validate_and_apply_wait_for_a_holder_of_a_member_links_lock(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links, entry: Entry, lock: str
) -> None:
    # The very locks admission, dispatch and operator actions take (one key, or a batch's):
    # each first takes its link's owner scope shared, which validate and apply take
    # exclusively (issue 34: one lock per owner, not two per member).
    manifest = await plan(conn, links, links.keys)
    async with db_pool.acquire() as holder, holder.transaction():
        if lock == "link":
            await links_q.lock_link_key(holder, links.keys[1])
        else:
            await batches_q.lock_link_keys(holder, [links.keys[2], "lk1_" + "0" * 64])
        await conn.execute("SET lock_timeout = '200ms'")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await entry(conn, manifest)
    await conn.execute("RESET lock_timeout")
    assert (await state(conn))[1] == []


# -- invariant 4: apply --------------------------------------------------------------------


async def test_apply_moves_every_member_and_writes_one_receipt_each(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    result = await apply(conn, manifest)
    assert result.status is S.APPLIED
    assert await q.operation_receipts(conn, "op-1") == list(result.receipts)
    for key, receipt in zip(links.keys, result.receipts, strict=True):
        row = await q.link_state_for_update(conn, key)
        assert row is not None
        assert (row.mapping_fingerprint, row.body_fingerprint) == produced(links, "2", row)
        assert row.last_validated_pack_install_id == str(links.new_pack)
        assert row.last_mapping_revalidation_operation_id == "op-1"
        assert link_row_digest(row) == receipt.after_row_digest
        assert (
            receipt.before_row_digest == manifest.members[links.keys.index(key)].expected_row_digest
        )
        assert receipt.previous_operation_id is None


async def test_a_member_changed_after_planning_rejects_the_whole_manifest(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    await conn.execute(
        "UPDATE connector_remote_link SET update_path_template = '/v2/{remoteId}'"
        " WHERE link_key = $1",
        links.keys[2],
    )
    before = await state(conn)
    result = await apply(conn, manifest)
    assert reasons(result) == [(links.keys[2], C.ROW_DIGEST_MISMATCH)]
    assert await state(conn) == before


async def cas_lost_and_rolled_back(
    conn: asyncpg.Connection, manifest: RevalidationManifest, key: str
) -> RevalidationResult:
    """apply refuses the whole manifest for `key`'s lost compare-and-set and writes nothing."""
    before = await state(conn)
    result = await apply(conn, manifest)
    assert reasons(result) == [(key, C.CAS_LOST)]
    assert await state(conn) == before
    return result


async def test_a_lost_compare_and_set_on_the_last_member_rolls_back_the_earlier_ones(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    # A writer that ignores the locks: the last member's UPDATE silently matches nothing.
    await conn.execute(
        """
        CREATE FUNCTION skip_update() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN RETURN NULL; END; $$;
        CREATE TRIGGER skip_update_tg BEFORE UPDATE ON connector_remote_link
            FOR EACH ROW WHEN (OLD.link_key = '"""
        + links.keys[2]
        + """')
            EXECUTE FUNCTION skip_update();
        """
    )
    await cas_lost_and_rolled_back(conn, manifest, links.keys[2])


@pytest.mark.parametrize(
    "rewrite",
    [
        "NEW.update_path_template := '/v9/{remoteId}'",  # a digested column that never moves
        "NEW.body_fingerprint := repeat('0', 64)",  # a moved column, to another value
    ],
)
async def test_a_move_that_does_not_land_on_the_planned_after_state_rolls_back(
    conn: asyncpg.Connection, links: Links, rewrite: str
) -> None:
    manifest = await plan(conn, links, links.keys)
    # A trigger that rewrites the moved row: the CAS matches, the after-state does not.
    await conn.execute(
        f"""
        CREATE FUNCTION rewrite_row() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN {rewrite}; RETURN NEW; END; $$;
        CREATE TRIGGER rewrite_row_tg BEFORE UPDATE ON connector_remote_link
            FOR EACH ROW WHEN (OLD.link_key = '{links.keys[1]}') EXECUTE FUNCTION rewrite_row();
        """
    )
    result = await cas_lost_and_rolled_back(conn, manifest, links.keys[1])
    assert "row changed" in result.conflicts[0].detail


async def test_a_write_between_the_locked_read_and_the_move_loses_the_compare_and_set(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    # Inside apply's own transaction, after the read: the row is not the tuple read, even
    # though its fingerprints, install and pointer are still the old ones.
    await conn.execute(
        f"""
        CREATE FUNCTION touch_link() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN
            UPDATE connector_remote_link SET update_path_template = '/v9/{{remoteId}}'
            WHERE link_key = NEW.link_key;
            RETURN NEW;
        END; $$;
        CREATE TRIGGER touch_link_tg BEFORE INSERT ON connector_link_revalidation_receipt
            FOR EACH ROW WHEN (NEW.link_key = '{links.keys[0]}') EXECUTE FUNCTION touch_link();
        """
    )
    result = await cas_lost_and_rolled_back(conn, manifest, links.keys[0])
    assert "matched no row" in result.conflicts[0].detail


# -- invariant 3: occupancy ----------------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [
        AttemptStatus.PENDING,
        AttemptStatus.PROCESSING,
        AttemptStatus.AMBIGUOUS_REMOTE_EFFECT,
        AttemptStatus.TERMINAL_FAILED,
    ],
)
async def test_an_occupying_attempt_on_any_member_blocks_the_whole_manifest(
    conn: asyncpg.Connection, links: Links, status: AttemptStatus
) -> None:
    attempt = await attempt_at(conn, links, links.keys[1], status)
    manifest = await plan(conn, links, links.keys)
    attempt_before = await conn.fetchrow(
        "SELECT * FROM connector_push_attempt WHERE attempt_id = $1", attempt
    )
    before = await state(conn)
    for entry in (validate, apply):
        assert reasons(await entry(conn, manifest)) == [(links.keys[1], C.OCCUPIED)]
    assert await state(conn) == before
    assert (
        await conn.fetchrow("SELECT * FROM connector_push_attempt WHERE attempt_id = $1", attempt)
        == attempt_before
    )


async def test_a_superseded_attempt_does_not_occupy(conn: asyncpg.Connection, links: Links) -> None:
    await attempt_at(conn, links, links.keys[1], AttemptStatus.SUPERSEDED)
    assert (await apply(conn, await plan(conn, links, links.keys))).status is S.APPLIED
