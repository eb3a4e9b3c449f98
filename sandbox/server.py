"""Serving the sandbox with uvicorn: blocking (`run_sandbox`) or on a background thread."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Self

import httpx
import uvicorn

from sandbox.app import create_app
from sandbox.config import SandboxConfig
from sandbox.connections import ConnectionRegistry, tracking_protocol

# A hanging fault holds its request at most this long once the server is asked to stop.
GRACEFUL_SHUTDOWN_S = 5


def build_server(
    config: SandboxConfig,
    host: str,
    port: int,
    *,
    quiet: bool,
    graceful_shutdown_s: int = GRACEFUL_SHUTDOWN_S,
) -> uvicorn.Server:
    """A uvicorn server for the sandbox, with the connection tracking reset faults need."""
    connections = ConnectionRegistry()
    uvicorn_config = uvicorn.Config(
        create_app(config, connections),
        host=host,
        port=port,
        http=tracking_protocol(connections),
        # Plain asyncio: reset faults abort the transport's real socket (SO_LINGER 0).
        loop="asyncio",
        lifespan="off",
        # The client address keys the connection registry: never rewrite it from headers.
        proxy_headers=False,
        timeout_graceful_shutdown=graceful_shutdown_s,
        access_log=not quiet,
        log_config=None if quiet else uvicorn.config.LOGGING_CONFIG,
    )
    return uvicorn.Server(uvicorn_config)


def run_sandbox(config: SandboxConfig, host: str = "127.0.0.1", port: int = 8090) -> None:
    """Serve until interrupted (SIGINT/SIGTERM)."""
    build_server(config, host, port, quiet=False).run()


class BackgroundSandbox:
    """A sandbox on a daemon thread bound to a free port; `with` starts and stops it."""

    def __init__(
        self,
        config: SandboxConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        graceful_shutdown_s: int = GRACEFUL_SHUTDOWN_S,
    ) -> None:
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._graceful_shutdown_s = graceful_shutdown_s
        self._server = build_server(
            config, host, self.port, quiet=True, graceful_shutdown_s=graceful_shutdown_s
        )
        self._thread = threading.Thread(
            target=self._serve, name=f"sandbox:{self.port}", daemon=True
        )

    def start(self, ready_timeout_s: float = 10.0) -> Self:
        """Start serving and poll the health route until it answers."""
        self._thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while not self._healthy():
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"sandbox at {self.url} did not become ready")
            time.sleep(0.02)  # poll interval, not synchronisation: readiness is the health answer
        return self

    def stop(self) -> None:
        """Ask the server to exit and wait for its thread (hanging requests are cut off)."""
        self._server.should_exit = True
        self._thread.join(self._graceful_shutdown_s + 5)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError(f"sandbox at {self.url} did not stop")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        self._server.run(sockets=[self._sock])

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/_sandbox/health", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False
