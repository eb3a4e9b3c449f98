"""The embedded Postgres launcher `connector-push dev` and the fixtures share."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from cli.stack.postgres import EmbeddedPostgres, StackError, free_port


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    # Not tmp_path: pytest resets its base dir to 0700 at every session start,
    # which locks out the unprivileged user Postgres runs as under root.
    root = Path(tempfile.mkdtemp(prefix="cp-pg-launcher-"))
    yield root / "pg"
    shutil.rmtree(root, ignore_errors=True)


async def _query(server: EmbeddedPostgres, sql: str) -> object:
    conn = await asyncpg.connect(server.dsn())
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_a_second_start_reuses_the_data(cluster_dir: Path) -> None:
    server = EmbeddedPostgres(cluster_dir, "127.0.0.1", free_port(), durable=False)
    try:
        server.start()
        assert server.is_running()
        await _query(server, "CREATE TABLE kept AS SELECT 42 AS answer")
        server.stop()
        assert not server.is_running()
        server.start()
        assert await _query(server, "SELECT answer FROM kept") == 42
        assert await _query(server, "SHOW max_connections") == "200"
        assert await _query(server, "SHOW fsync") == "off"
    finally:
        server.stop()
    assert not server.is_running()


def test_a_busy_port_names_the_port_and_the_setting(cluster_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = EmbeddedPostgres(cluster_dir, "127.0.0.1", port)
        with pytest.raises(StackError, match=rf"127\.0\.0\.1:{port} is busy.*postgres\.port"):
            server.start()
    assert not server.is_running()
    assert not (cluster_dir / "PG_VERSION").exists(), "fails before initialising a cluster"
