"""Seed 000 "Single-Snapshot Contract" and "L0 Transaction Invariants" rows, on real Postgres.

V-7  (000:549-558): a stored receipt holds the manifest's digest, its approval digest and
     both fingerprint algorithm versions, exactly as the manifest file states them.
V-10 (000:568-569): links are locked in stable link-key order, so two applies over
     overlapping links given in opposite orders both finish; no deadlock.
V-11 (000:570-571): each link-key lock is taken before that link's occupancy-key lock.
V-18 (000:600): connector_remote_link has no `effective_*` column (the PATCH half,
     V-6, is tests/unit/test_patch_path_imports.py).

SPEC §9 REV-2 / REV-3. The other revalidation invariants are in test_revalidation.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from db import revalidation as q
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
from services import revalidation as revalidation_activity
from services.revalidation import apply, validate
from tests.db.revalidation_support import Links, hex64, make_links, plan
from tests.db.rows import insert_link

S = RevalidationStatus
Entry = Callable[[Conn, RevalidationManifest], Coroutine[Any, Any, RevalidationResult]]
# A lock as pg_locks shows an advisory bigint key: (classid, objid), the key's two halves.
LockId = tuple[int, int]
# What a lock is: ("link" | "occupancy", link key).
LockName = tuple[str, str]
WAIT_SECONDS = 10.0


@pytest.fixture
async def conn(db_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(db_dsn)
    try:
        yield connection
    finally:
        await connection.close()


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


# -- V-10, V-11: the advisory-lock order ------------------------------------------------------

MY_ADVISORY_LOCK = """
SELECT classid::bigint AS classid, objid::bigint AS objid FROM pg_locks
WHERE pid = pg_backend_pid() AND locktype = 'advisory'
"""

ADVISORY_LOCKS_OF = """
SELECT classid::bigint AS classid, objid::bigint AS objid, granted FROM pg_locks
WHERE pid = $1 AND locktype = 'advisory'
"""


async def lock_ids(conn: asyncpg.Connection, keys: list[str]) -> dict[LockId, LockName]:
    """Each key's link and occupancy lock as pg_locks shows it, learnt by taking it with
    the very functions revalidation uses (so this test holds no copy of the key scheme)."""
    ids: dict[LockId, LockName] = {}
    takers = {"link": q.lock_link_key, "occupancy": q.lock_occupancy_key}
    for key in keys:
        for kind, take in takers.items():
            async with conn.transaction():
                await take(conn, key)
                row = await conn.fetchrow(MY_ADVISORY_LOCK)
            assert row is not None
            ids[(row["classid"], row["objid"])] = (kind, key)
    return ids


async def locks_of(
    observer: asyncpg.Connection, pid: int, ids: dict[LockId, LockName]
) -> dict[LockName, bool]:
    """The link and occupancy locks backend `pid` holds (True) or waits for (False)."""
    rows = await observer.fetch(ADVISORY_LOCKS_OF, pid)
    return {ids[lock]: r["granted"] for r in rows if (lock := (r["classid"], r["objid"])) in ids}


async def waiting(
    observer: asyncpg.Connection,
    pid: int,
    ids: dict[LockId, LockName],
    task: asyncio.Task[RevalidationResult],
) -> dict[LockName, bool]:
    """`pid`'s locks once it waits for one (its task must not end first)."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            locks = await locks_of(observer, pid, ids)
            if False in locks.values():
                return locks
            assert not task.done(), task
            await asyncio.sleep(0.01)  # polling pg_locks for the condition, not a delay


def occupancy_after_link(locks: dict[LockName, bool]) -> None:
    """V-11: an occupancy lock held or awaited implies the same key's link lock is held."""
    for kind, key in locks:
        if kind == "occupancy":
            assert locks.get(("link", key)) is True, (key, locks)


@pytest.mark.parametrize("page", [1, revalidation_activity.PAGE], ids=["page-1", "one-page"])
@pytest.mark.parametrize("entry", [validate, apply], ids=["validate", "apply"])
@pytest.mark.parametrize("held", ["link", "occupancy"])
async def test_each_link_lock_is_taken_before_its_occupancy_lock(
    db_pool: asyncpg.Pool,
    conn: asyncpg.Connection,
    links: Links,
    monkeypatch: pytest.MonkeyPatch,
    entry: Entry,
    held: str,
    page: int,
) -> None:
    """V-11: with another transaction holding the second link's link (or occupancy) lock,
    the revalidation stops there holding, for every key it has an occupancy lock on (or
    awaits one for), that key's link lock; holding the link lock, no occupancy lock yet."""
    monkeypatch.setattr(revalidation_activity, "PAGE", page)
    manifest = await plan(conn, links, links.keys)
    ids = await lock_ids(conn, links.keys)
    blocked = links.keys[1]
    async with db_pool.acquire() as holder, db_pool.acquire() as runner:
        async with holder.transaction():
            take = q.lock_link_key if held == "link" else q.lock_occupancy_key
            await take(holder, blocked)
            task = asyncio.create_task(entry(runner, manifest))
            locks = await waiting(conn, runner.get_server_pid(), ids, task)
        result = await asyncio.wait_for(task, WAIT_SECONDS)
    assert [name for name, granted in locks.items() if not granted] == [(held, blocked)]
    occupancy_after_link(locks)
    if held == "link":
        assert ("occupancy", blocked) not in locks
    else:
        assert locks[("link", blocked)] is True
    assert result.status in (S.VALIDATED, S.APPLIED)


async def test_opposite_orders_over_overlapping_links_do_not_deadlock(
    db_pool: asyncpg.Pool, conn: asyncpg.Connection, links: Links
) -> None:
    """V-10: A plans keys 0-2 in ascending order, B keys 3-1 in descending order. With
    key 1 held elsewhere, A waits on it holding key 0; B must wait on key 1 too, holding
    nothing: had it locked in the order it was given, it would hold keys 3 and 2, and
    once key 1 is released A (holding 1, wanting 2) and B (holding 2, wanting 1) would
    deadlock. Both finish: A applies, B's members 1 and 2 moved under it, so it rejects."""
    k = links.keys
    first = await plan(conn, links, k[0:3], op="op-a")
    second = await plan(conn, links, [k[3], k[2], k[1]], op="op-b", to="3")
    assert [m.link_key for m in second.members] == k[1:4]  # the manifest is sorted ...
    unsorted: dict[str, Any] = json.loads(json.dumps(second.document()))
    unsorted["members"].reverse()
    unsorted["manifest_digest"] = document_digest(unsorted)
    with pytest.raises(ValueError, match="sorted"):  # ... and only a sorted one parses
        parse_manifest(unsorted)

    ids = await lock_ids(conn, k)
    async with (
        db_pool.acquire() as holder,
        db_pool.acquire() as a,
        db_pool.acquire() as b,
    ):
        async with holder.transaction():
            await q.lock_link_key(holder, k[1])
            task_a = asyncio.create_task(apply(a, first))
            locks_a = await waiting(conn, a.get_server_pid(), ids, task_a)
            task_b = asyncio.create_task(apply(b, second))
            locks_b = await waiting(conn, b.get_server_pid(), ids, task_b)
        done_a, done_b = await asyncio.wait_for(asyncio.gather(task_a, task_b), WAIT_SECONDS)
    assert locks_a == {("link", k[0]): True, ("link", k[1]): False}
    assert locks_b == {("link", k[1]): False}
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
