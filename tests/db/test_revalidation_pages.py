"""Bulk revalidation in pages (issue 16 P4): a manifest spanning several pages behaves as
one transaction, exactly as a one-page manifest does (SPEC §9 REV-2)."""

from __future__ import annotations

import asyncpg
import pytest

from db import revalidation as q
from protocol.link_row import link_row_digest
from protocol.revalidation import ConflictReason, Judgement, LockedMember, RevalidationStatus
from protocol.revalidation_manifest import RevalidationManifest, RevalidationMember
from services import revalidation as revalidation_activity
from services.revalidation import Phase, apply, validate
from tests.db.revalidation_support import Links, plan, state
from tests.db.revalidation_support import links as links  # the fixture, re-exported
from tests.db.rows import insert_attempt, rows_from_before_0090

PAGE = 2  # three links: a full page and a partial one


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revalidation_activity, "PAGE", PAGE)


async def test_every_page_is_locked_checked_and_written_in_link_key_order(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    steps: list[tuple[Phase, str]] = []
    result = await apply(conn, manifest, lambda phase, key: steps.append((phase, key)))
    assert result.status is RevalidationStatus.APPLIED
    assert [k for p, k in steps if p is Phase.LOCKED] == links.keys
    assert [k for p, k in steps if p is Phase.WRITTEN] == links.keys
    for member, receipt in zip(manifest.members, result.receipts, strict=True):
        row = await q.link_state_for_update(conn, member.link_key)
        # The install's own fingerprints (REV-2 binds them to new_pack_install_id).
        assert row is not None and row.mapping_fingerprint == member.new_mapping_fingerprint
        assert link_row_digest(row) == receipt.after_row_digest
    assert await q.operation_receipts(conn, "op-1") == list(result.receipts)


async def test_a_conflict_on_the_last_page_rejects_the_members_of_the_first(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    async with rows_from_before_0090(conn):
        await insert_attempt(conn, links.old_pack, link_key=links.keys[-1])  # pending: occupies
    before = await state(conn)
    for entry in (validate, apply):
        result = await entry(conn, manifest)
        assert [(c.link_key, c.reason) for c in result.conflicts] == [
            (links.keys[-1], ConflictReason.OCCUPIED)
        ]
    assert await state(conn) == before


async def test_a_retry_across_pages_is_verify_only(conn: asyncpg.Connection, links: Links) -> None:
    manifest = await plan(conn, links, links.keys)
    applied = await apply(conn, manifest)
    after = await state(conn)
    again = await apply(conn, manifest)
    assert again.status is RevalidationStatus.ALREADY_APPLIED
    assert again.receipts == applied.receipts
    assert await state(conn) == after


class JudgingBroke(Exception):
    pass


@pytest.mark.parametrize("write", [False, True], ids=["validate", "apply"])
async def test_a_failure_while_the_next_page_is_being_read_rolls_back_cleanly(
    conn: asyncpg.Connection, links: Links, monkeypatch: pytest.MonkeyPatch, write: bool
) -> None:
    # The first page is judged while the second page's locks are taken (issue 16 P4). A
    # failure there must wait for that read, roll everything back and surface as itself,
    # leaving the connection usable: not collide with a statement still running.
    manifest = await plan(conn, links, links.keys)
    before = await state(conn)
    judge = revalidation_activity.judge_new_member

    def judge_or_fail(
        manifest: RevalidationManifest,
        member: RevalidationMember,
        lock: LockedMember,
        *,
        project: bool = True,
    ) -> Judgement:
        if member.link_key == links.keys[1]:  # the first page's last: page 2 is being read
            raise JudgingBroke(member.link_key)
        return judge(manifest, member, lock, project=project)

    monkeypatch.setattr(revalidation_activity, "judge_new_member", judge_or_fail)
    with pytest.raises(JudgingBroke):
        await (apply if write else validate)(conn, manifest)
    assert not conn.is_in_transaction()
    assert await state(conn) == before
    monkeypatch.setattr(revalidation_activity, "judge_new_member", judge)
    assert (await apply(conn, manifest)).status is RevalidationStatus.APPLIED


async def test_a_dry_run_counts_every_receipt_makes_only_those_it_shows_and_still_judges_the_rest(
    conn: asyncpg.Connection, links: Links, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 34: validate makes no receipt past the SHOWN it reports (nor the after-state
    # digest only a receipt holds), yet counts every member and checks each one's row.
    monkeypatch.setattr(revalidation_activity, "SHOWN", 1)
    manifest = await plan(conn, links, links.keys)
    dry = await validate(conn, manifest)
    assert (dry.status, dry.receipt_count, len(dry.receipts)) == (
        RevalidationStatus.VALIDATED,
        len(links.keys),
        1,
    )
    set_path = "UPDATE connector_remote_link SET update_path_template = $2 WHERE link_key = $1"
    path = await conn.fetchval(
        "SELECT update_path_template FROM connector_remote_link WHERE link_key = $1",
        links.keys[-1],
    )
    await conn.execute(set_path, links.keys[-1], "/v2/{remoteId}")  # past the receipt shown
    changed = await validate(conn, manifest)
    assert [(c.link_key, c.reason) for c in changed.conflicts] == [
        (links.keys[-1], ConflictReason.ROW_DIGEST_MISMATCH)
    ]
    assert changed.receipt_count == 0
    await conn.execute(set_path, links.keys[-1], path)
    applied = await apply(conn, manifest)
    assert applied.receipt_count == len(links.keys)
    assert applied.receipts == dry.receipts  # the one shown is the one written
