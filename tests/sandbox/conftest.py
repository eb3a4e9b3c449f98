"""Sandbox fixtures: a real uvicorn server on a free 127.0.0.1 port, reset before each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from sandbox.client import SandboxClient
from sandbox.config import SandboxConfig
from sandbox.server import BackgroundSandbox
from tests.sandbox.support import make_config
from worker.runtime import tls_context

StartSandbox = Callable[[SandboxConfig], BackgroundSandbox]


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[BackgroundSandbox]:
    """One sandbox for the session; `sandbox` resets it per test."""
    with BackgroundSandbox(make_config()) as server:
        yield server


@pytest.fixture
def start_sandbox() -> Iterator[StartSandbox]:
    """Start extra sandboxes (fresh state, polled until ready), stopped after the test."""
    started: list[BackgroundSandbox] = []

    def start(config: SandboxConfig) -> BackgroundSandbox:
        server = BackgroundSandbox(config).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
async def http(sandbox_server: BackgroundSandbox) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client whose base URL is the session sandbox."""
    async with httpx.AsyncClient(
        base_url=sandbox_server.url, timeout=10.0, verify=tls_context()
    ) as client:
        yield client


@pytest.fixture
async def sandbox(sandbox_server: BackgroundSandbox, http: httpx.AsyncClient) -> SandboxClient:
    """Admin client for the session sandbox, with all state and faults reset."""
    client = SandboxClient(sandbox_server.url, http)
    await client.reset()
    return client
