"""A TCP proxy in front of Postgres that can make one kind of statement hang.

Every byte is passed through both ways, except that a client message containing
`hold` (by default the pool's reset query, which asyncpg sends as one simple query
ending `RESET ALL;`) is swallowed: the server never sees it, so the client waits for
an answer that never comes, exactly as if the server hung on that one statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

RESET_QUERY_MARK = b"RESET ALL;"


class HoldingProxy:
    def __init__(self, upstream_host: str, upstream_port: int, hold: bytes) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._hold = hold
        self.holding = False  # switched on by the test once the pool is warm
        self.held = 0  # client messages swallowed
        self.held_at: float | None = None  # time.monotonic() of the first one
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while chunk := await reader.read(65536):
                if from_client and self.holding and self._hold in chunk:
                    self.held += 1
                    if self.held_at is None:
                        self.held_at = time.monotonic()
                    await asyncio.Event().wait()  # this connection never speaks again
                writer.write(chunk)
                await writer.drain()
        writer.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._upstream)
        self._writers += [client_w, server_w]
        for task in (
            asyncio.create_task(self._pump(client_r, server_w, from_client=True)),
            asyncio.create_task(self._pump(server_r, client_w, from_client=False)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()


@asynccontextmanager
async def holding_proxy(
    dsn: str, hold: bytes = RESET_QUERY_MARK
) -> AsyncIterator[tuple[str, HoldingProxy]]:
    """A DSN reaching `dsn`'s server through the proxy, and the proxy."""
    parts = urlsplit(dsn)
    assert parts.hostname is not None and parts.port is not None
    proxy = HoldingProxy(parts.hostname, parts.port, hold)
    server = await asyncio.start_server(proxy._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    proxied = urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{port}"))
    try:
        yield proxied, proxy
    finally:
        server.close()
        await proxy.close()
        await server.wait_closed()
