"""SPEC §9 REV-2 against real Postgres: locks, zero-write validate, atomic apply, verify-only retry.

(The receipt table's append-only trigger is covered in test_receipts.py.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from activities.revalidation import apply, install_fingerprints, validate
from cli.main import app
from db import links as links_q
from db import revalidation as q
from protocol.link_row import (
    ROW_DIGEST_EXCLUDED_COLUMNS,
    LinkRowState,
    link_row_digest,
    plan_member,
)
from protocol.manifest import parse_manifest as parse_pack
from protocol.revalidation import ConflictReason, RevalidationResult, RevalidationStatus
from protocol.revalidation_manifest import (
    Approval,
    RevalidationManifest,
    build_manifest,
    document_digest,
)
from protocol.states import AttemptStatus
from tests.db.rows import (
    insert_attempt,
    insert_link,
    insert_pack_install,
    pack_document,
    rows_from_before_0090,
    set_status,
)

S = RevalidationStatus
C = ConflictReason
APPROVAL = Approval(approved_by="alice", approval_reference="CHG-42", reason="mapping v2")
Entry = Callable[[asyncpg.Connection, RevalidationManifest], Awaitable[RevalidationResult]]


def hex64(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


# Real installs to move to, each mapping more properties (so each moves the fingerprints).
TARGETS = {"2": ("email",), "3": ("email", "phone"), "4": ("email", "phone", "lastname")}


@dataclass
class Links:
    keys: list[str]
    old_pack: uuid.UUID
    installs: dict[str, uuid.UUID]

    @property
    def new_pack(self) -> uuid.UUID:
        return self.installs["2"]


@pytest.fixture
async def conn(db_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(db_dsn)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def links(conn: asyncpg.Connection) -> Links:
    return await make_links(conn)


async def make_links(conn: asyncpg.Connection) -> Links:
    """Three finalized links on one install, with sha256 fingerprints as real links carry."""
    old_pack = await insert_pack_install(conn)
    installs = {to: await insert_pack_install(conn, pack_document(*p)) for to, p in TARGETS.items()}
    keys = sorted([await insert_link(conn, old_pack) for _ in range(3)])
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )
    return Links(keys, old_pack, installs)


def produced(links: Links, to: str, row: LinkRowState) -> tuple[str, str]:
    """The fingerprints install `to` produces for `row` (what a plan must carry)."""
    fingerprints = install_fingerprints(
        parse_pack(pack_document(*TARGETS[to])), str(links.installs[to]), row
    )
    assert fingerprints is not None
    return fingerprints.mapping_fingerprint, fingerprints.body_fingerprint


async def plan(
    conn: asyncpg.Connection, links: Links, keys: list[str], op: str = "op-1", to: str = "2"
) -> RevalidationManifest:
    rows = await q.link_states(conn, keys)
    new = str(links.installs[to])
    members = [plan_member(r, *produced(links, to, r), new) for r in rows]
    return build_manifest(op, APPROVAL, members)


async def state(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every link row (row_version, updated_at included) and every receipt."""
    link_rows = await conn.fetch("SELECT * FROM connector_remote_link ORDER BY link_key")
    receipts = await conn.fetch(
        "SELECT * FROM connector_link_revalidation_receipt ORDER BY operation_id, link_key"
    )
    return [dict(r) for r in link_rows], [dict(r) for r in receipts]


def reasons(result: RevalidationResult) -> list[tuple[str, ConflictReason]]:
    assert result.status is S.REJECTED, result
    return [(c.link_key, c.reason) for c in result.conflicts]


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
@pytest.mark.parametrize("lock", ["link", "occupancy"])
async def test_validate_and_apply_wait_for_the_link_and_occupancy_locks(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links, entry: Entry, lock: str
) -> None:
    manifest = await plan(conn, links, links.keys)
    async with db_pool.acquire() as holder, holder.transaction():
        if lock == "link":  # the very key admission and dispatch take
            await links_q.lock_link_key(holder, links.keys[1])
        else:
            await q.lock_occupancy_key(holder, links.keys[1])
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
    attempt = await _attempt(conn, links, links.keys[1], status)
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
    await _attempt(conn, links, links.keys[1], AttemptStatus.SUPERSEDED)
    assert (await apply(conn, await plan(conn, links, links.keys))).status is S.APPLIED


A = AttemptStatus
# Legal walks from `pending` (protocol/states.py ATTEMPT_TRANSITIONS).
WALKS: dict[AttemptStatus, list[AttemptStatus]] = {
    A.PENDING: [],
    A.PROCESSING: [A.PROCESSING],
    A.AMBIGUOUS_REMOTE_EFFECT: [A.PROCESSING, A.AMBIGUOUS_REMOTE_EFFECT],
    A.TERMINAL_FAILED: [A.TERMINAL_FAILED],
    A.SUPERSEDED: [A.TERMINAL_FAILED, A.SUPERSEDED],
}


async def _attempt(
    conn: asyncpg.Connection, links: Links, key: str, status: AttemptStatus
) -> uuid.UUID:
    async with rows_from_before_0090(conn):
        attempt = await insert_attempt(conn, links.old_pack, link_key=key)
    for step in WALKS[status]:
        await set_status(conn, "attempt", attempt, step.value)
    return attempt


# -- invariant 5: verify-only retries ------------------------------------------------------


async def test_reapplying_is_already_applied_and_writes_nothing(
    conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)
    first = await apply(conn, manifest)
    after = await state(conn)
    for entry in (apply, validate):
        again = await entry(conn, manifest)
        assert again.status is S.ALREADY_APPLIED and again.receipts == first.receipts
    assert await state(conn) == after


async def test_concurrent_applies_of_one_operation_apply_once(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links
) -> None:
    manifest = await plan(conn, links, links.keys)

    async def run() -> RevalidationStatus:
        async with db_pool.acquire() as c:
            return (await apply(c, manifest)).status

    statuses = await asyncio.gather(run(), run())
    assert sorted(statuses) == sorted([S.APPLIED, S.ALREADY_APPLIED])
    assert len((await state(conn))[1]) == len(links.keys)


async def test_a_retry_after_another_operation_moved_a_member_fails_closed(
    conn: asyncpg.Connection, links: Links
) -> None:
    first = await plan(conn, links, links.keys[:2], op="op-1")
    assert (await apply(conn, first)).status is S.APPLIED
    second = await plan(conn, links, links.keys[1:2], op="op-2", to="3")
    assert (await apply(conn, second)).status is S.APPLIED
    before = await state(conn)
    assert reasons(await apply(conn, first)) == [(links.keys[1], C.DIVERGENT_LINK)]
    assert await state(conn) == before


async def test_reusing_an_operation_id_for_more_members_is_mixed_state(
    conn: asyncpg.Connection, links: Links
) -> None:
    wider = await plan(conn, links, links.keys[:2])  # same op id, one more member
    assert (await apply(conn, await plan(conn, links, links.keys[:1]))).status is S.APPLIED
    before = await state(conn)
    assert (links.keys[1], C.MIXED_STATE) in reasons(await apply(conn, wider))
    assert await state(conn) == before


# -- the receipt chain ------------------------------------------------------------------------


async def test_the_next_operation_chains_on_the_receipt_and_needs_its_evidence(
    conn: asyncpg.Connection, links: Links
) -> None:
    key = links.keys[0]
    assert (await apply(conn, await plan(conn, links, [key], op="op-1"))).status is S.APPLIED
    second = await apply(conn, await plan(conn, links, [key], op="op-2", to="3"))
    assert second.status is S.APPLIED and second.receipts[0].previous_operation_id == "op-1"
    # An out-of-band write leaves the fingerprints unexplained by the pointed-at receipt.
    await conn.execute(
        "UPDATE connector_remote_link SET body_fingerprint = $2 WHERE link_key = $1",
        key,
        hex64("hand-edited"),
    )
    third = await apply(conn, await plan(conn, links, [key], op="op-3", to="4"))
    assert reasons(third) == [(key, C.RECEIPT_CHAIN_BROKEN)]


async def test_every_link_column_is_digested_or_deliberately_excluded(
    conn: asyncpg.Connection,
) -> None:
    columns = await conn.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = 'connector_remote_link'"
    )
    digested = set(LinkRowState.model_fields)
    assert {c["column_name"] for c in columns} == digested | ROW_DIGEST_EXCLUDED_COLUMNS
    assert not digested & ROW_DIGEST_EXCLUDED_COLUMNS


# -- the CLI: invariant 1 before any connection, and the exit codes --------------------------


def _cli(*args: str) -> Awaitable[Any]:
    return asyncio.to_thread(CliRunner().invoke, app, ["revalidate", *args])


def _redigest_forgery(document: dict[str, Any], edit: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(document))
    if edit == "digest-mismatch":
        doc["members"][0]["new_body_fingerprint"] = hex64("forged")
        return doc
    if edit == "duplicate":
        doc["members"] = [doc["members"][0], doc["members"][0]]
    else:
        doc["approval"]["reason"] = ""
    doc["manifest_digest"] = document_digest(doc)
    return doc


@pytest.mark.parametrize("edit", ["digest-mismatch", "duplicate", "empty-approval"])
async def test_bad_manifests_exit_2_before_touching_the_database(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path, edit: str
) -> None:
    manifest = await plan(conn, links, links.keys)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_redigest_forgery(manifest.document(), edit)))
    before = await state(conn)
    for command in ("validate", "apply"):
        result = await _cli(command, str(path), "--database-url", db_dsn)
        assert result.exit_code == 2, result.output
        # An unreachable database would exit 1: the check never opens a connection.
        unreachable = "postgresql://nobody@127.0.0.1:1/none"
        assert (await _cli(command, str(path), "--database-url", unreachable)).exit_code == 2
    assert await state(conn) == before


@pytest.mark.parametrize("field", ["new_mapping_fingerprint", "new_body_fingerprint"])
async def test_an_edited_member_with_a_recomputed_digest_is_rejected_exit_3(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path, field: str
) -> None:
    """Item 6 / REV-2: the digest proves the file consistent, not the values; each member's
    new fingerprints are recomputed from its new install, so a forgery writes nothing."""
    doc: dict[str, Any] = (await plan(conn, links, links.keys)).document()
    doc["members"][1][field] = "0" * 64
    doc["manifest_digest"] = document_digest(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    before = await state(conn)
    for command in ("validate", "apply"):
        result = await _cli(command, str(path), "--json", "--database-url", db_dsn)
        assert result.exit_code == 3, result.output
        answer = json.loads(result.output)
        assert answer["status"] == "rejected" and answer["receipts"] == []
        assert [(c["link_key"], c["reason"]) for c in answer["conflicts"]] == [
            (links.keys[1], "not_the_installs_fingerprints")
        ]
    assert await state(conn) == before


async def test_a_member_moving_to_an_install_without_its_slot_is_rejected(
    conn: asyncpg.Connection, links: Links
) -> None:
    rows = await q.link_states(conn, links.keys[:1])
    empty = str(links.old_pack)  # its manifest is not a pack: it produces nothing
    members = [plan_member(rows[0], *produced(links, "2", rows[0]), empty)]
    manifest = build_manifest("op-x", APPROVAL, members)
    for entry in (validate, apply):
        assert reasons(await entry(conn, manifest)) == [
            (links.keys[0], C.NOT_THE_INSTALLS_FINGERPRINTS)
        ]


async def test_cli_exit_codes_distinguish_applied_already_applied_and_rejected(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps((await plan(conn, links, links.keys[:2])).document()))
    bad.write_text(json.dumps((await plan(conn, links, links.keys[2:], op="op-9")).document()))
    await _attempt(conn, links, links.keys[2], AttemptStatus.PENDING)
    expected = [
        ("validate", good, 0, "validated"),
        ("apply", good, 0, "applied"),
        ("apply", good, 4, "already_applied"),
        ("validate", good, 4, "already_applied"),
        ("apply", bad, 3, "rejected"),
    ]
    for command, path, code, status in expected:
        result = await _cli(command, str(path), "--json", "--database-url", db_dsn)
        assert (result.exit_code, json.loads(result.output)["status"]) == (code, status)
    human = await _cli("apply", str(good), "--database-url", db_dsn)
    assert human.exit_code == 4 and "already applied" in human.output


async def test_a_large_manifest_applies_through_the_cli_with_a_human_table(
    conn: asyncpg.Connection, links: Links, db_dsn: str, tmp_path: Path
) -> None:
    keys = links.keys + [await insert_link(conn, links.old_pack) for _ in range(60)]
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )
    path = tmp_path / "large.json"
    path.write_text(json.dumps((await plan(conn, links, keys)).document()))
    result = await _cli("apply", str(path), "--database-url", db_dsn)
    assert result.exit_code == 0, result.output
    assert "applied" in result.output and "63 link(s)" in result.output
    assert len((await state(conn))[1]) == 63
