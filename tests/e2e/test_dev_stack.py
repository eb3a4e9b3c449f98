"""`connector-push dev` end to end (issues 2, 13, 31): the stack comes up, answers, runs
every documented command (tests/e2e/docs_runner.py), restarts a killed child, its
Temporal dev server and its Postgres (`dev status` saying what is down meanwhile), stops
on Ctrl-C, and a second run reuses its data without re-applying the demo; two runs on
one data directory (together or one after the other) leave the first untouched. All of
it is one stack's life in one test: a stack start costs ~15 s of CPU here. Ports and data
dirs come from a private copy of temporal-dev.yaml, so a developer's running stack is
never touched."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.stack.devconfig import DEFAULT_PATH, REPO_ROOT
from cli.stack.process import free_ports, port_is_free
from tests.e2e.docs_runner import run_every_doc
from tests.e2e.support import eventually_sync, wait_for_output

UP = "dev stack is up"


@pytest.fixture
def dev_config() -> Iterator[Path]:
    """A private copy of temporal-dev.yaml (free ports) in a directory laid out like a
    checkout: the stack's data in `.dev-data/` beside `examples/`, so the docs' relative
    paths hold when their commands run here."""
    # Not pytest's tmp_path: its 0700 base locks out the unprivileged postgres user.
    root = Path(tempfile.mkdtemp(prefix="cp-dev-"))
    root.chmod(0o755)
    (root / "examples").symlink_to(REPO_ROOT / "examples")
    data = root / ".dev-data"
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    frontend, ui, postgres, ingress, sandbox, metrics = free_ports(6)
    doc["data_dir"] = str(data)
    doc["temporal"].update(frontend_port=frontend, ui_port=ui, db_file=str(data / "temporal.db"))
    doc["postgres"].update(port=postgres, data_dir=str(data / "postgres"))
    doc["ingress"]["port"] = ingress
    doc["sandbox"].update(port=sandbox, persist_file=str(data / "sandbox.json"))
    doc["worker_metrics"]["port"] = metrics
    path = root / "temporal-dev.yaml"
    path.write_text(yaml.safe_dump(doc))
    yield path
    shutil.rmtree(root, ignore_errors=True)


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TEMPORAL_ADDRESS"}}
    with log.open("ab") as out:  # the child keeps its own handle
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "dev", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=env,
        )


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=90)


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )


def status(config: Path) -> dict[str, object]:
    result = cli(config, "dev", "status", "--json")
    assert result.returncode == 0, result.stderr
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


def kill_and_see_restart(config: Path, log: Path, process: subprocess.Popen[bytes]) -> None:
    """Issue 13: a killed child is restarted (one log line each), the count is visible."""
    children = status(config)["children"]
    assert isinstance(children, dict)
    os.kill(children["sandbox"], signal.SIGKILL)
    output = wait_for_output(log, "sandbox restarted (restart #1", process, timeout_s=60)
    assert "sandbox exited (killed by SIGKILL); restart #1 in 1s" in output
    restarts = status(config)["restarts"]
    assert restarts == {"postgres": 0, "temporal": 0, "sandbox": 1, "worker": 0, "ingress": 0}


def hold_port(port: int) -> socket.socket:
    """Listen on `port` as soon as it is free (its server was killed): bound and listening,
    so the server cannot bind it again until the socket is closed."""

    def listening() -> socket.socket | None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            sock.close()
            return None
        return sock

    held = eventually_sync(listening, lambda sock: sock is not None, 30, interval_s=0.02)
    assert held is not None
    return held


def restarted(config: Path, name: str, count: int) -> dict[str, object]:
    """`dev status --json` once `name` has been restarted `count` times and nothing is down."""
    return eventually_sync(
        lambda: status(config),
        lambda seen: seen["down"] == {} and seen["restarts"][name] == count,  # type: ignore[index]
        timeout_s=90,
        interval_s=0.5,
    )


def kill_temporal_and_see_the_truth(
    config: Path, log: Path, process: subprocess.Popen[bytes], doc: dict[str, Any]
) -> None:
    """Issue 31: the dev Temporal server is supervised like the children. Killed, it is
    restarted; while it cannot be (its port held here), `dev status` says it is down."""
    children = status(config)["children"]
    assert isinstance(children, dict)
    os.kill(children["temporal"], signal.SIGKILL)
    holder = hold_port(doc["temporal"]["frontend_port"])
    try:
        output = wait_for_output(log, "temporal did not restart (port", process, timeout_s=60)
        assert "temporal exited (killed by SIGKILL); restart #1 in 1s" in output
        # In this process: the retries (2 s, 4 s, 8 s) stop the stack if the port is held
        # ~15 s, longer than a loaded machine may take to start two CLI processes.
        runner = CliRunner()
        as_json = runner.invoke(app, ["dev", "status", "--json", "--config", str(config)])
        human = runner.invoke(app, ["dev", "status", "--config", str(config)])
    finally:
        holder.close()
    seen = json.loads(as_json.stdout)
    assert seen["state"] == "degraded", seen
    assert "is busy" in seen["down"]["temporal"]
    lines = human.stdout.splitlines()
    assert lines[0].startswith("degraded (pid "), lines
    assert lines[1].startswith("down: temporal (port 127.0.0.1:"), lines
    wait_for_output(log, "temporal restarted (restart #1", process, timeout_s=60)
    seen = restarted(config, "temporal", 1)
    assert seen["state"] == "running"
    assert seen["children"]["temporal"] != children["temporal"]  # type: ignore[index]
    assert cli(config, "dev", "status").stdout.startswith("running (pid ")
    ui = f"http://127.0.0.1:{doc['temporal']['ui_port']}"
    assert poll_status(ui, 60) == 200  # the server answers again


def kill_postgres_and_see_restart(
    config: Path, log: Path, process: subprocess.Popen[bytes]
) -> None:
    """Issue 31: the embedded Postgres is supervised too: its postmaster killed, it is
    restarted and answers on the same address."""
    children = status(config)["children"]
    assert isinstance(children, dict)
    os.kill(children["postgres"], signal.SIGKILL)
    output = wait_for_output(log, "postgres restarted (restart #1", process, timeout_s=90)
    assert f"postgres exited (postmaster pid {children['postgres']} is gone)" in output
    seen = restarted(config, "postgres", 1)
    assert seen["children"]["postgres"] != children["postgres"]  # type: ignore[index]
    dsn = json.loads(cli(config, "dev", "env", "--json").stdout)["database_url"]
    assert asyncio.run(_select_one(dsn)) == 1


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        value: int = await conn.fetchval("SELECT 1")
        return value
    finally:
        await conn.close()


def poll_status(url: str, timeout_s: float) -> int:
    """GET `url` until it answers 200 (the condition, not a fixed wait)."""

    def code() -> int:
        try:
            return httpx.get(url, timeout=5).status_code
        except httpx.HTTPError:
            return 0

    return eventually_sync(code, lambda got: got == 200, timeout_s, interval_s=0.5)


def poll_text(url: str, needle: str, timeout_s: float) -> str:
    """GET `url` until its body contains `needle` (the condition, not a fixed wait)."""

    def body() -> str:
        try:
            return httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            return ""

    return eventually_sync(body, lambda text: needle in text, timeout_s, interval_s=0.5)


def first_exit(processes: list[subprocess.Popen[bytes]], timeout_s: float) -> int:
    """Index of the first process to exit (polled, bounded)."""

    def exited() -> int | None:
        return next((i for i, p in enumerate(processes) if p.poll() is not None), None)

    index = eventually_sync(exited, lambda i: i is not None, timeout_s)
    assert index is not None
    return index


def _one_line_refusal(process: subprocess.Popen[bytes], log: Path) -> str:
    assert process.wait(timeout=120) == 1
    [line] = log.read_text().strip().splitlines()
    assert "a dev stack is already running" in line and "nothing was touched" in line
    return line


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(900)  # three starts, ~50 doc commands, three kills on a shared machine
def test_a_dev_stack_from_its_first_start_to_its_data_reused(dev_config: Path) -> None:
    """One stack's whole life, so its start is paid once for every check (issue 31): two
    runs started together on one data directory (one owns it, the other says so in one
    line, as does a third started after); the fresh stack answers on every port; every
    documented command runs against it (tests/e2e/docs_runner.py); a killed child, its
    Temporal server and its Postgres are restarted; Ctrl-C stops it; and a second run
    reuses its data without re-applying the demo."""
    doc = yaml.safe_load(dev_config.read_text())
    root = dev_config.parent
    logs = [root / f"dev-{n}.log" for n in range(3)]
    both = [start(dev_config, logs[0]), start(dev_config, logs[1])]
    codes: list[int] = []
    try:
        # Started together: exactly one owns the data directory, the other says so.
        loser = first_exit(both, timeout_s=120)
        process, log = both[1 - loser], logs[1 - loser]
        output = wait_for_output(log, UP, process, timeout_s=180)
        _one_line_refusal(both[loser], logs[loser])
        # And one after the other: one line with the running stack's PID and URLs.
        line = _one_line_refusal(start(dev_config, logs[2]), logs[2])
        assert f"pid {process.pid}" in line and f":{doc['postgres']['port']}/" in line

        assert "demo pack: demo-owner installed" in output
        t, s, i = doc["temporal"], doc["sandbox"], doc["ingress"]
        assert httpx.get(f"http://127.0.0.1:{t['ui_port']}", timeout=10).status_code == 200
        ledger = httpx.get(f"http://127.0.0.1:{s['port']}/_sandbox/ledger", timeout=10)
        assert ledger.json() == {"entries": []}
        assert httpx.get(f"http://127.0.0.1:{i['port']}/healthz", timeout=10).status_code == 200
        # OPS: the worker's metrics endpoint is on, with the status gauges (published
        # every 15 s once the worker runs).
        metrics = f"http://127.0.0.1:{doc['worker_metrics']['port']}/metrics"
        assert "connector_push_status" in poll_text(metrics, "connector_push_status", 90)
        env = cli(dev_config, "dev", "env")
        assert f"export SANDBOX_URL=http://127.0.0.1:{s['port']}" in env.stdout.splitlines()

        run_every_doc(root, dev_config)

        kill_and_see_restart(dev_config, log, process)
        kill_temporal_and_see_the_truth(dev_config, log, process, doc)
        kill_postgres_and_see_restart(dev_config, log, process)
        assert process.poll() is None  # the stack stayed up
    finally:
        codes = [stop(p) for p in both if p.poll() is None]
    assert codes == [0]
    for port in (doc["temporal"]["ui_port"], doc["postgres"]["port"], doc["sandbox"]["port"]):
        assert port_is_free("127.0.0.1", port), f"port {port} still taken after Ctrl-C"

    log = root / "dev-again.log"
    again = start(dev_config, log)
    try:
        output = wait_for_output(log, UP, again, timeout_s=180)
        assert "migrations: current" in output
        assert "demo data: loaded on an earlier run, left as it is" in output
        assert "demo pack:" not in output
    finally:
        assert stop(again) == 0
