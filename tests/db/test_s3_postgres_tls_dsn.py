"""SPEC S-3: TLS to Postgres is configured in `DATABASE_URL` (`sslmode=verify-full&
sslrootcert=...`, docs/deployment.md), so `db.pool.create_pool` must hand the DSN to asyncpg
unchanged. Against the embedded Postgres, which serves no TLS: verify-full is in force (the
named root is read and the plaintext server is refused, never fallen back to)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from db.pool import CONNECT_ERRORS, create_pool
from tests.fixtures.tls import make_private_ca


def _with(dsn: str, query: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


async def test_s3_the_pool_reads_the_root_certificate_the_dsn_names(db_dsn: str) -> None:
    with pytest.raises(FileNotFoundError):
        await create_pool(
            _with(db_dsn, "sslmode=verify-full&sslrootcert=/no/such/ca.pem"), min_size=1, max_size=1
        )


async def test_s3_verify_full_refuses_a_server_without_tls(db_dsn: str, tmp_path: Path) -> None:
    ca = make_private_ca(tmp_path).ca
    with pytest.raises(CONNECT_ERRORS) as refused:
        await create_pool(
            _with(db_dsn, f"sslmode=verify-full&sslrootcert={ca}"), min_size=1, max_size=1
        )
    assert "ssl" in str(refused.value).lower()


async def test_sslmode_disable_still_connects(db_dsn: str) -> None:
    pool = await create_pool(_with(db_dsn, "sslmode=disable"), min_size=1, max_size=1)
    try:
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()
    assert isinstance(pool, asyncpg.Pool)
