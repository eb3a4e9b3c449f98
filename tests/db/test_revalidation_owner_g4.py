"""`revalidate owner` follows the per-link rules (SPEC §17 G-4, C-9): a link whose slot the
active pack lacks, or with another fail-closed finding, is neither restored nor moved; it
is listed once, as skipped, with its remedy, and stays as it was."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
from typer.testing import CliRunner

from cli.main import app
from db import revalidation_owner as owner_q
from protocol.drift import INSTALL_REASONS
from services.packs import apply_pack
from tests.db import rows
from tests.db.test_revalidation_owner import fingerprints, link, run, suspend, upgraded

ARGS = [
    "revalidate", "owner", "--owner-key", "owner-1", "--approved-by", "alice",
    "--approval-reference", "CHG-47", "--reason", "install change only", "--json",
]  # fmt: skip


def without_action_1(document: dict[str, Any]) -> dict[str, Any]:
    """The same pack with its one action slot recreated under a new id (no lineage): a
    link under `action-1` has no slot in it (C-9)."""
    new = json.loads(json.dumps(document))
    new["actionSlots"][0]["id"] = "action-2"
    return new


def other_scope(document: dict[str, Any]) -> dict[str, Any]:
    """The same pack whose destination now addresses another remote scope (fail closed)."""
    new = upgraded(document)
    new["destinationSlots"][0]["remoteScope"] = "portal-2"
    return new


async def link_row(conn: asyncpg.Connection, key: str) -> dict[str, Any]:
    row = await conn.fetchrow("SELECT * FROM connector_remote_link WHERE link_key = $1", key)
    assert row is not None
    return dict(row)


async def written(conn: asyncpg.Connection) -> tuple[int, int]:
    audit = await conn.fetchval(
        "SELECT count(*) FROM connector_operator_audit WHERE command LIKE 'revalidate-%'"
    )
    receipts = await conn.fetchval("SELECT count(*) FROM connector_link_revalidation_receipt")
    return audit, receipts


async def test_g4_a_suspended_link_whose_slot_a_later_apply_removed_is_skipped_once(
    db_pool: asyncpg.Pool, db_dsn: str
) -> None:
    """G-4, C-9 (issue 47's reproduction): a link suspended `drift:pack_upgraded`, then a
    pack apply that removes its action slot. `revalidate owner --json` leaves it suspended
    and lists it once, as skipped, with the remedy (rebind through a lineage, or retire);
    nothing is written; exit 0 (skipped links are reported, not an error: the command's
    epilog). Fails on the old main: the link came back `finalized` under a slot the install
    lacks, and the JSON listed it both restored and skipped."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        key = await link(conn, uuid.UUID(first.pack_install_id), fingerprints(document))
        await apply_pack(conn, upgraded(document))
        await suspend(conn, key, "pack_upgraded")
        removed = await apply_pack(conn, without_action_1(document))
        before = await link_row(conn, key)
        result = await asyncio.to_thread(CliRunner().invoke, app, [*ARGS, "--database-url", db_dsn])
        after = await link_row(conn, key)
        assert await written(conn) == (0, 0)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["restored"] == [] and report["restored_count"] == 0
    assert report["skipped_count"] == 1
    [skipped] = report["skipped"]
    assert skipped["link_key"] == key and skipped["reason"] == "slot_not_in_active_pack"
    assert f"'action-1' is not in the active install {removed.pack_install_id}" in skipped["detail"]
    assert "declared lineage" in skipped["remedy"] and f"retire {key}" in skipped["remedy"]
    assert report["outcome"] == "nothing_to_do" and report["links_revalidated"] == 0
    assert after == before and after["status"] == "suspended_drift"
    assert after["suspend_reason"] == "drift:pack_upgraded"


async def test_g4_another_fail_closed_finding_is_skipped_suspended_or_finalized(
    db_pool: asyncpg.Pool,
) -> None:
    """G-4: an install whose destination addresses another remote scope (fail closed, not
    an install change): neither the link suspended for the install change nor a finalized
    one is restored or moved; each is skipped once, naming the finding."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        waiting = await link(conn, install, fingerprints(document))
        plain = await link(conn, install, fingerprints(document))
        await apply_pack(conn, other_scope(document))
        await suspend(conn, waiting, "pack_upgraded")
        result = await run(conn)
        states = {k: (await link_row(conn, k))["status"] for k in (waiting, plain)}
        assert await written(conn) == (0, 0)
    assert result.restored == () and result.moved == 0
    assert sorted(r.link_key for r in result.skipped) == sorted([waiting, plain])
    assert result.skipped_count == 2
    assert {r.blocker.value for r in result.skipped} == {"fail_closed_finding"}
    assert all("remote_scope" in r.detail for r in result.skipped)
    assert states == {waiting: "suspended_drift", plain: "finalized"}


async def test_g4_the_restoring_statement_itself_refuses_a_slot_the_install_lacks(
    db_pool: asyncpg.Pool,
) -> None:
    """G-4 under a race: whatever the caller judged, the UPDATE restores a link only while
    the install it names is active and has the link's (action slot, destination slot)."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        key = await link(conn, uuid.UUID(first.pack_install_id), fingerprints(document))
        second = await apply_pack(conn, upgraded(document))
        await suspend(conn, key, "pack_upgraded")
        who, reasons = ("alice", "race"), list(INSTALL_REASONS)
        guards = [
            owner_q.RestoreGuard(second.pack_install_id, ["action-2"], ["dest-1"]),
            owner_q.RestoreGuard(second.pack_install_id, ["action-1"], ["dest-2"]),
            owner_q.RestoreGuard(first.pack_install_id, ["action-1"], ["dest-1"]),  # inactive
        ]
        refused = [
            await owner_q.restore_install_suspended(conn, [key], reasons, who, guard)
            for guard in guards
        ]
        still = (await link_row(conn, key))["status"]
        kept = owner_q.RestoreGuard(second.pack_install_id, ["action-1"], ["dest-1"])
        restored = await owner_q.restore_install_suspended(conn, [key], reasons, who, kept)
    assert refused == [[], [], []] and still == "suspended_drift"
    assert restored == [(key, "drift:pack_upgraded")]


async def test_g8_a_suspended_link_whose_object_was_deleted_stays_suspended(
    db_pool: asyncpg.Pool,
) -> None:
    """G-8 with G-4: the remote reported the link's object deleted while the link waited
    for revalidation after an install change. `revalidate owner` does not restore it: it is
    skipped once, naming the event, with the remedy (retire); its twin is restored."""
    document = rows.pack_document("email")
    async with db_pool.acquire() as conn:
        first = await apply_pack(conn, document)
        install = uuid.UUID(first.pack_install_id)
        gone = await link(conn, install, fingerprints(document))
        kept = await link(conn, install, fingerprints(document))
        await apply_pack(conn, upgraded(document))
        for key in (gone, kept):
            await suspend(conn, key, "pack_upgraded")
        row = await link_row(conn, gone)
        await conn.execute(
            "INSERT INTO connector_remote_deletion (event_id, target_object, remote_scope,"
            " remote_id, event_type, endpoint) VALUES ('evt-g8', $1, $2, $3, 'deleted', 'hs')",
            row["target_object"],
            row["remote_scope"],
            row["remote_id"],
        )
        result = await run(conn)
        states = {k: (await link_row(conn, k))["status"] for k in (gone, kept)}
    assert result.restored == (kept,)
    [skipped] = result.skipped
    assert skipped.link_key == gone and skipped.blocker.value == "remote_object_deleted"
    assert "evt-g8" in skipped.detail and "retire" in skipped.remedy
    assert states == {gone: "suspended_drift", kept: "finalized"}
