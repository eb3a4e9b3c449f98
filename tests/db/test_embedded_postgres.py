"""The embedded Postgres launcher `connector-push dev` and the fixtures share."""

from __future__ import annotations

import socket
from pathlib import Path

import asyncpg
import pytest

from cli.stack.postgres import EmbeddedPostgres, StackError, free_port


async def _query(server: EmbeddedPostgres, sql: str) -> object:
    conn = await asyncpg.connect(server.dsn())
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_a_second_start_reuses_the_data(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", "127.0.0.1", free_port(), durable=False)
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


def test_a_busy_port_names_the_port_and_the_setting(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = EmbeddedPostgres(tmp_path / "pg", "127.0.0.1", port)
        with pytest.raises(StackError, match=rf"127\.0\.0\.1:{port} is busy.*postgres\.port"):
            server.start()
    assert not server.is_running()
