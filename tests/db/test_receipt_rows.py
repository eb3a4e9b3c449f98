"""Seed 000 "Single-Snapshot Contract" and "L0 Transaction Invariants" rows, on real Postgres.

V-7  (000:549-558): a stored receipt holds the manifest's digest, its approval digest and
     both fingerprint algorithm versions, exactly as the manifest file states them.
V-10 (000:568-569): links are locked in stable order, so two applies over overlapping
     links given in opposite orders both finish; no deadlock.
V-11 (000:570-571): each link-key lock is taken before that link's occupancy-key lock
     (issue 34: the owner scope lock covers both, before any row lock).
V-18 (000:600): connector_remote_link has no `effective_*` column (the PATCH half,
     V-6, is tests/unit/test_patch_path_imports.py).

SPEC §9 REV-2 / REV-3. The other revalidation invariants are in test_revalidation.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from db import link_batches as batches_q
from db import links as links_q
from db import revalidation_scope as scope_q
from db.records import Conn
from protocol.canonical import digest
from protocol.revalidation import RevalidationResult, RevalidationStatus
from protocol.revalidation_manifest import (
    BODY_FINGERPRINT_ALGORITHM,
    MAPPING_FINGERPRINT_ALGORITHM,
    RevalidationManifest,
    document_digest,
    parse_manifest,
)
from services.revalidation import apply, validate
from tests.db.revalidation_support import Links, hex64, make_links, plan
from tests.db.rows import insert_link
from tests.e2e.support import eventually

S = RevalidationStatus
Entry = Callable[[Conn, RevalidationManifest], Coroutine[Any, Any, RevalidationResult]]
# A lock as pg_locks shows an advisory bigint key: (classid, objid), the key's two halves.
LockId = tuple[int, int]
WAIT_SECONDS = 10.0


@pytest.fixture
async def links(conn: asyncpg.Connection) -> Links:
    """Four finalized links on one install (test_revalidation's three, and one more)."""
    made = await make_links(conn)
    extra = await insert_link(conn, made.old_pack)
    await conn.execute(
        "UPDATE connector_remote_link SET mapping_fingerprint = $1, body_fingerprint = $2",
        hex64("m1"),
        hex64("b1"),
    )
    return Links(sorted([*made.keys, extra]), made.old_pack, made.installs)


# -- V-7: the receipt read back ------------------------------------------------------------

RECEIPTS = """
SELECT * FROM connector_link_revalidation_receipt
WHERE operation_id = $1 ORDER BY link_key COLLATE "C"
"""


async def test_a_stored_receipt_carries_the_manifests_digests_and_algorithms(
    conn: asyncpg.Connection, links: Links, tmp_path: Path
) -> None:
    """V-7: every receipt row, read back from the table, against the manifest file."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps((await plan(conn, links, links.keys)).document()))
    document = json.loads(path.read_text())
    assert (await apply(conn, parse_manifest(document))).status is S.APPLIED

    rows = await conn.fetch(RECEIPTS, document["operation_id"])
    members = document["members"]
    assert [r["link_key"] for r in rows] == [m["link_key"] for m in members] == links.keys
    algorithms = (document["mapping_fingerprint_algorithm"], document["body_fingerprint_algorithm"])
    assert algorithms == (MAPPING_FINGERPRINT_ALGORITHM, BODY_FINGERPRINT_ALGORITHM)
    for row, member in zip(rows, members, strict=True):
        assert row["manifest_digest"] == document["manifest_digest"] == document_digest(document)
        assert row["approval_digest"] == digest(document["approval"])
        assert row["approval_digest"] != row["manifest_digest"]
        assert (row["mapping_fingerprint_algorithm"], row["body_fingerprint_algorithm"]) == (
            algorithms
        )
        # ...and the exact transition it records, as planned in the file.
        for field in ("mapping_fingerprint", "body_fingerprint"):
            assert row[f"old_{field}"] == member[f"old_{field}"]
            assert row[f"new_{field}"] == member[f"new_{field}"]
        assert str(row["old_pack_install_id"]) == member["old_pack_install_id"]
        assert str(row["new_pack_install_id"]) == member["new_pack_install_id"]
        assert row["before_row_digest"] == member["expected_row_digest"]


# -- V-10, V-11: the lock order ----------------------------------------------------------
# Issue 34: a revalidation no longer takes each member's link-key and occupancy-key locks
# (two per member filled Postgres's lock table). It takes its owner's scope lock first,
# exclusively: every link-key lock of that owner (admission, dispatch, operator actions,
# occupancy included) takes the same scope shared before it. So "each link is locked
# before its occupancy key, in link-key order" holds a fortiori: every link and occupancy
# key of the owner is locked, at once, before any row lock or occupancy read.

MY_ADVISORY_LOCK = """
SELECT classid::bigint AS classid, objid::bigint AS objid FROM pg_locks
WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND mode = 'ExclusiveLock'
"""

ADVISORY_LOCKS_OF = """
SELECT classid::bigint AS classid, objid::bigint AS objid, granted FROM pg_locks
WHERE pid = $1 AND locktype = 'advisory'
"""


async def scope_lock(conn: asyncpg.Connection, owner: str) -> LockId:
    """The owner scope lock as pg_locks shows it, learnt by taking it with the very
    function revalidation uses (so this test holds no copy of the key scheme)."""
    async with conn.transaction():
        await scope_q.lock_owner_scopes(conn, [owner])
        row = await conn.fetchrow(MY_ADVISORY_LOCK)
    assert row is not None
    return row["classid"], row["objid"]


async def waiting(
    observer: asyncpg.Connection, pid: int, task: asyncio.Task[RevalidationResult]
) -> dict[LockId, bool]:
    """`pid`'s advisory locks once it waits for one (its task must not end first)."""

    async def locks() -> dict[LockId, bool]:
        assert not task.done(), task
        rows = await observer.fetch(ADVISORY_LOCKS_OF, pid)
        return {(r["classid"], r["objid"]): r["granted"] for r in rows}

    return await eventually(
        locks, lambda seen: False in seen.values(), timeout_s=WAIT_SECONDS, interval_s=0.01
    )


async def no_row_locked(conn: asyncpg.Connection, keys: list[str]) -> bool:
    """Whether every one of `keys`' link rows can be locked right now (none is held)."""
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT 1 FROM connector_remote_link WHERE link_key = ANY($1::text[])"
                " FOR UPDATE NOWAIT",
                keys,
            )
            raise _RollBack
    except _RollBack:
        return True
    except asyncpg.LockNotAvailableError:
        return False


class _RollBack(Exception):
    pass


@pytest.mark.parametrize("entry", [validate, apply], ids=["validate", "apply"])
@pytest.mark.parametrize("held", ["link", "links"])
async def test_the_owner_scope_is_locked_before_any_link_row_or_occupancy_read(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links, entry: Entry, held: str
) -> None:
    """V-11: with another transaction holding one member's link-key lock (as admission,
    dispatch or a batch of saves takes it), the revalidation waits for the owner scope,
    holding nothing else: no link row locked, no occupancy read; then it runs whole."""
    manifest = await plan(conn, links, links.keys)
    owner = await conn.fetchval(
        "SELECT connector_owner_key FROM connector_remote_link WHERE link_key = $1", links.keys[0]
    )
    scope = await scope_lock(conn, owner)
    async with db_pool.acquire() as holder, db_pool.acquire() as runner:
        async with holder.transaction():
            if held == "link":
                await links_q.lock_link_key(holder, links.keys[1])
            else:
                await batches_q.lock_link_keys(holder, links.keys[2:])
            task = asyncio.create_task(entry(runner, manifest))
            locks = await waiting(conn, runner.get_server_pid(), task)
            assert locks == {scope: False}
            assert await no_row_locked(conn, links.keys)
        result = await asyncio.wait_for(task, WAIT_SECONDS)
    assert result.status in (S.VALIDATED, S.APPLIED)


async def test_opposite_orders_over_overlapping_links_do_not_deadlock(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links
) -> None:
    """V-10: A plans keys 0-2 in ascending order, B keys 3-1 in descending order. With
    key 1 held elsewhere, A and B both wait for the owner scope, holding nothing (had B
    locked its links in the order it was given, it would hold keys 3 and 2, and A and B
    could deadlock). Both finish: A applies, B's members 1 and 2 moved under it, so it
    rejects."""
    k = links.keys
    first = await plan(conn, links, k[0:3], op="op-a")
    second = await plan(conn, links, [k[3], k[2], k[1]], op="op-b", to="3")
    assert [m.link_key for m in second.members] == k[1:4]  # the manifest is sorted ...
    unsorted: dict[str, Any] = json.loads(json.dumps(second.document()))
    unsorted["members"].reverse()
    unsorted["manifest_digest"] = document_digest(unsorted)
    with pytest.raises(ValueError, match="sorted"):  # ... and only a sorted one parses
        parse_manifest(unsorted)

    async with (
        db_pool.acquire() as holder,
        db_pool.acquire() as a,
        db_pool.acquire() as b,
    ):
        async with holder.transaction():
            await links_q.lock_link_key(holder, k[1])
            task_a = asyncio.create_task(apply(a, first))
            locks_a = await waiting(conn, a.get_server_pid(), task_a)
            task_b = asyncio.create_task(apply(b, second))
            locks_b = await waiting(conn, b.get_server_pid(), task_b)
            assert await no_row_locked(conn, k)
        done_a, done_b = await asyncio.wait_for(asyncio.gather(task_a, task_b), WAIT_SECONDS)
    assert list(locks_a.values()) == [False] and locks_b == locks_a  # the one owner scope
    assert done_a.status is S.APPLIED
    assert done_b.status is S.REJECTED
    assert {c.link_key for c in done_b.conflicts} == {k[1], k[2]}
    receipts = await conn.fetch("SELECT operation_id FROM connector_link_revalidation_receipt")
    assert sorted(r["operation_id"] for r in receipts) == ["op-a"] * 3


# -- V-18: one serving snapshot ------------------------------------------------------------

EFFECTIVE_COLUMNS = """
SELECT table_name, column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'connector_remote_link'
  AND column_name ILIKE 'effective%'
"""


async def test_the_link_table_has_no_effective_columns(conn: asyncpg.Connection) -> None:
    """V-18: the link's mapping/body fingerprints are the one serving snapshot; no
    `effective_*` column (an alternate PATCH authority) exists on the migrated schema."""
    columns = await conn.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = 'connector_remote_link'"
    )
    assert {"mapping_fingerprint", "body_fingerprint"} <= {c["column_name"] for c in columns}
    assert await conn.fetch(EFFECTIVE_COLUMNS) == []


async def test_the_check_sees_an_effective_column(conn: asyncpg.Connection) -> None:
    """The check can fail: a migration adding one would be caught."""
    await conn.execute(
        "ALTER TABLE connector_remote_link ADD COLUMN effective_mapping_fingerprint text"
    )
    found = await conn.fetch(EFFECTIVE_COLUMNS)
    assert [r["column_name"] for r in found] == ["effective_mapping_fingerprint"]
