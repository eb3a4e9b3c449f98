"""`CONNECTOR_PUSH_INGRESS_PROCESSES` > 1: the extra processes end with the ingress.

They share the port (SO_REUSEPORT), so one left running after the ingress was stopped
would go on admitting requests with the old policy, and beside a restarted ingress.
uvicorn raises SIGTERM again after its graceful shutdown, and SIGTERM's default action
ended the first process before it stopped the others (found by a `make bench` run that
left one behind). A SIGKILLed first process cannot stop them at all: each extra process
asks Linux for SIGTERM when its parent dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from cli.stack.process import free_port
from tests.ingress.support import ENVIRON, policy_document, wait_until


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def _gone(pid: int) -> bool:
    """Exited: no longer in /proc, or a zombie nobody has reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def _serving(port: int) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        try:
            return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        except httpx.TransportError:
            return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_the_extra_process_ends_with_the_ingress(
    tmp_path: Path, db_dsn: str, stop: signal.Signals
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(policy_document()))
    port = free_port()
    env = {
        **os.environ,
        **ENVIRON,
        "DATABASE_URL": db_dsn,
        "CONNECTOR_PUSH_INGRESS_PORT": str(port),
        "CONNECTOR_PUSH_INGRESS_PROCESSES": "2",
    }
    first = subprocess.Popen(
        [sys.executable, "-m", "ingress", str(policy)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    extra: list[int] = []
    try:

        async def started() -> bool:
            extra[:] = _children(first.pid)
            return len(extra) == 1 and await _serving(port)

        await wait_until(started, timeout_s=60)
        (child,) = extra
        first.send_signal(stop)
        first.wait(timeout=60)

        async def child_gone() -> bool:
            return _gone(child)

        await wait_until(child_gone, timeout_s=30)

        async def port_closed() -> bool:
            return not await _serving(port)

        await wait_until(port_closed, timeout_s=10)
    finally:
        for pid in [*extra, first.pid]:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        first.wait(timeout=30)
