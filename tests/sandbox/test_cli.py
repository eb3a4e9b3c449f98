"""`connector-push sandbox` as a real process: YAML config, persistence, clean SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.sandbox.support import eventually

CONFIG_YAML = """\
seed: 3
object_types:
  widgets:
    unique_properties: [serial]
    idempotency: true
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def sandbox_process(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`python -m cli sandbox` on a free port with a YAML config and a persist file."""
    config = tmp_path / "sandbox.yaml"
    config.write_text(CONFIG_YAML, "utf-8")
    persist = tmp_path / "state.json"
    port = _free_port()
    command = [sys.executable, "-m", "cli", "sandbox", "--port", str(port),
               "--config", str(config), "--persist", str(persist)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield f"http://127.0.0.1:{port}", process, persist
    if process.poll() is None:
        process.kill()
        process.wait(10)
    if process.stderr is not None:
        process.stderr.close()


async def _health(http: httpx.AsyncClient) -> int:
    try:
        return (await http.get("/_sandbox/health")).status_code
    except httpx.TransportError:
        return 0


async def test_cli_serves_the_configured_types_and_persists(
    sandbox_process: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, process, persist = sandbox_process
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        await eventually(lambda: _health(http), lambda status: status == 200, timeout_s=30.0)
        body = {"properties": {"serial": "S-1"}}
        created = await http.post("/crm/v3/objects/widgets", json=body)
        duplicate = await http.post("/crm/v3/objects/widgets", json=body)

    process.send_signal(signal.SIGTERM)

    # uvicorn shuts down gracefully, then re-raises the signal it captured.
    assert process.wait(15) == -signal.SIGTERM
    assert process.stderr is not None
    assert "Finished server process" in process.stderr.read().decode()
    assert (created.status_code, duplicate.status_code) == (201, 409)
    assert '"serial":"S-1"' in persist.read_text("utf-8")


def test_cli_rejects_an_invalid_config_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("object_types: {}\nsedd: 1\n", "utf-8")

    result = subprocess.run(
        [sys.executable, "-m", "cli", "sandbox", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode != 0
    assert "sedd" in result.stderr
