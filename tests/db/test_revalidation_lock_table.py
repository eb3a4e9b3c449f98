"""A manifest larger than Postgres's lock table (SPEC §9 REV-2/3, docs/packs.md, revalidation):
validate and apply take two advisory locks per member until commit, and the server's
shared lock table holds about max_locks_per_transaction x max_connections of them. Past
that, the run must roll back whole (nothing written), exit 5 with one line naming the
setting to change, and the value it names must be one that makes the same manifest apply.

The server here is a private embedded Postgres with a deliberately small lock table
(10 x 20 connections), so 5,000 members (10,000 locks) cannot fit, as 50,000 members cannot
on a default-sized one."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bench.ingress_bench import prepare_database
from bench.revalidation_bench import APPROVAL, seed
from cli.errors import EXIT_UNAVAILABLE
from cli.stack.postgres import EmbeddedPostgres, free_port
from db.revalidation import lock_table_exhausted
from protocol.revalidation import RevalidationStatus
from protocol.revalidation_manifest import RevalidationManifest
from services import revalidation, revalidation_plan
from services.revalidation import LockTableTooSmall, lock_table_setting
from tests.db.revalidation_support import state
from tests.e2e.test_cli_errors import assert_one_line, run

MEMBERS = 5000
CONNECTIONS = 20


class SmallLockTable:
    """An embedded server whose lock table is 10 x CONNECTIONS slots, resizable."""

    def __init__(self, root: Path) -> None:
        port = free_port("127.0.0.1")
        self.server = EmbeddedPostgres(
            root / "data", "127.0.0.1", port, durable=False, max_connections=CONNECTIONS
        )

    async def configure(self, per_transaction: int) -> None:
        """Set max_locks_per_transaction and restart: the lock table is sized at start."""
        conn = await asyncpg.connect(self.server.dsn("postgres"))
        try:
            await conn.execute(f"ALTER SYSTEM SET max_locks_per_transaction = {per_transaction}")
        finally:
            await conn.close()
        self.server.stop()
        self.server.start()


@pytest.fixture
async def small() -> AsyncIterator[SmallLockTable]:
    root = Path(tempfile.mkdtemp(prefix="cp-pg-locks-"))
    root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
    server = SmallLockTable(root)
    try:
        server.server.start()
        await server.configure(10)
        yield server
    finally:
        server.server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _planned(dsn: str) -> RevalidationManifest:
    conn = await asyncpg.connect(dsn)
    try:
        install = await seed(conn, MEMBERS)
        request = revalidation_plan.PlanRequest(
            operation_id="big-move", approval=APPROVAL, new_pack_install_id=install
        )
        return await revalidation_plan.plan(conn, request)
    finally:
        await conn.close()


async def _state(dsn: str) -> tuple[Any, Any, int]:
    conn = await asyncpg.connect(dsn)
    try:
        audit = await conn.fetchval("SELECT count(*) FROM connector_operator_audit")
        return *(await state(conn)), audit
    finally:
        await conn.close()


async def test_a_manifest_past_the_lock_table_rolls_back_and_names_the_setting_that_fits(
    small: SmallLockTable, tmp_path: Path
) -> None:
    dsn = await prepare_database(small.server.dsn("postgres"))
    manifest = await _planned(dsn)
    assert len(manifest.members) == MEMBERS
    before = await _state(dsn)

    conn = await asyncpg.connect(dsn)
    try:
        for entry in (revalidation.validate, revalidation.apply):
            with pytest.raises(LockTableTooSmall) as raised:
                await entry(conn, manifest)
            assert raised.value.needed == lock_table_setting(MEMBERS, CONNECTIONS) == 1000
            # The connection is usable afterwards: the transaction was rolled back.
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()
    assert await _state(dsn) == before  # no receipt, no link move, no audit entry

    path = tmp_path / "big-move.json"
    path.write_text(json.dumps(manifest.document(), sort_keys=True), encoding="utf-8")
    for command in ("validate", "apply"):
        result = run("revalidate", command, str(path), "--database-url", dsn)
        line = assert_one_line(
            result,
            EXIT_UNAVAILABLE,
            "lock table",
            f"{MEMBERS:,} members",
            "max_locks_per_transaction = 10",
            f"max_connections = {CONNECTIONS}",
            "nothing was written",
            "at least 1000",
        )
        assert "unexpected error" not in line, line
    assert await _state(dsn) == before

    # The setting the message names is enough for this very manifest.
    await small.configure(1000)
    conn = await asyncpg.connect(dsn)
    try:
        applied = await revalidation.apply(conn, manifest)
        assert applied.status is RevalidationStatus.APPLIED
        receipts = await conn.fetchval(
            "SELECT count(*) FROM connector_link_revalidation_receipt WHERE operation_id = $1",
            "big-move",
        )
        assert receipts == MEMBERS
    finally:
        await conn.close()


def test_lock_table_exhaustion_is_told_apart_from_other_out_of_memory_errors() -> None:
    hint = 'You might need to increase "max_locks_per_transaction".'
    locks = asyncpg.PostgresError.new({"C": "53200", "M": "out of shared memory", "H": hint})
    memory = asyncpg.PostgresError.new({"C": "53200", "M": "out of memory"})
    assert lock_table_exhausted(locks)
    assert not lock_table_exhausted(memory)
    assert not lock_table_exhausted(asyncpg.PostgresError.new({"C": "40P01", "H": hint}))
