"""A manifest far larger than Postgres's lock table could hold a lock per member of
(issue 34, SPEC §9 REV-2, NF-7): validate and apply take one advisory lock per owner key
and row locks (kept in the rows), so the lock table's size does not bound a manifest.

The server here is a private embedded Postgres with a deliberately small lock table
(max_locks_per_transaction 10 x 20 connections; with Postgres's slack it holds fewer than
1,500 locks in one transaction, which the test shows first), so 1,000 members stand for
what a million would be on a stock server (64 x 100): the design before this one took
2,000 locks for them and failed here. A small server keeps the test to a few seconds
where 20,000+ members on a default one would take far longer."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from bench.ingress_bench import prepare_database
from bench.revalidation_bench import APPROVAL, seed
from cli.stack.postgres import EmbeddedPostgres, free_port
from protocol.revalidation import RevalidationStatus
from services import revalidation, revalidation_plan
from services.revalidation_source import ManifestFile

MEMBERS = 1000
CONNECTIONS = 20
PER_TRANSACTION = 10


@pytest.fixture
async def small_dsn() -> AsyncIterator[str]:
    """The admin DSN of a server whose lock table is PER_TRANSACTION x CONNECTIONS."""
    root = Path(tempfile.mkdtemp(prefix="cp-pg-locks-"))
    root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
    server = EmbeddedPostgres(
        root / "data", "127.0.0.1", free_port("127.0.0.1"), durable=False,
        max_connections=CONNECTIONS,
    )  # fmt: skip
    try:
        server.start()
        conn = await asyncpg.connect(server.dsn("postgres"))
        try:
            await conn.execute(f"ALTER SYSTEM SET max_locks_per_transaction = {PER_TRANSACTION}")
        finally:
            await conn.close()
        server.stop()
        server.start()  # the lock table is sized at start
        yield server.dsn("postgres")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_manifest_past_what_the_lock_table_holds_per_member_validates_and_applies(
    small_dsn: str, tmp_path: Path
) -> None:
    dsn = await prepare_database(small_dsn)
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SHOW max_locks_per_transaction") == str(PER_TRANSACTION)
        # Two locks per member (the design before issue 34) do not fit in this server.
        with pytest.raises(asyncpg.OutOfMemoryError, match="shared memory"):
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(i) FROM generate_series(1, $1::int) AS i",
                    2 * MEMBERS,
                )
        install = await seed(conn, MEMBERS)
        request = revalidation_plan.PlanRequest(
            operation_id="big-move", approval=APPROVAL, new_pack_install_id=install
        )
        path = tmp_path / "big-move.jsonl"
        with path.open("wb") as out:
            await revalidation_plan.write_plan(conn, request, out)
        manifest = ManifestFile.open(path)
        assert manifest.head.member_count == MEMBERS
        validated = await revalidation.validate(conn, manifest)
        assert validated.status is RevalidationStatus.VALIDATED
        applied = await revalidation.apply(conn, manifest)
        assert applied.status is RevalidationStatus.APPLIED
        assert applied.receipt_count == MEMBERS
        receipts = await conn.fetchval(
            "SELECT count(*) FROM connector_link_revalidation_receipt WHERE operation_id = $1",
            "big-move",
        )
        assert receipts == MEMBERS
    finally:
        await conn.close()
