"""The ingress as its own process (`python -m ingress POLICY`), as it runs in production."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from cli.stack.process import free_port
from tests.ingress.support import ENVIRON, wait_until


@asynccontextmanager
async def ingress_process(
    tmp_path: Path, db_dsn: str, document: dict[str, Any], stderr: IO[bytes] | int | None = None
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """The process and its port, once `/healthz` answers; stopped with SIGTERM after."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    port = free_port()
    env = {
        **os.environ,
        **ENVIRON,
        "DATABASE_URL": db_dsn,
        "CONNECTOR_PUSH_INGRESS_PORT": str(port),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "ingress", str(policy)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if stderr is None else stderr,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

            async def serving() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(serving, timeout_s=60, what="the ingress serving")
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
