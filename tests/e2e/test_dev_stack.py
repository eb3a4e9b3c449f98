"""`connector-push dev` end to end (issue 2): the stack comes up, answers, stops on Ctrl-C,
and a second run reuses its data. Ports and data dirs come from a private copy of
temporal-dev.yaml, so a developer's running stack is never touched."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from cli.stack.devconfig import DEFAULT_PATH, REPO_ROOT
from cli.stack.process import free_ports, port_is_free
from tests.e2e.support import wait_for_output

UP = "dev stack is up"


@pytest.fixture
def dev_config() -> Iterator[Path]:
    # Not pytest's tmp_path: its 0700 base locks out the unprivileged postgres user.
    root = Path(tempfile.mkdtemp(prefix="cp-dev-"))
    root.chmod(0o755)
    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    frontend, ui, postgres, ingress, sandbox = free_ports(5)
    doc["data_dir"] = str(root)
    doc["temporal"].update(
        frontend_port=frontend, ui_port=ui, db_file=str(root / "temporal.sqlite")
    )
    doc["postgres"].update(port=postgres, data_dir=str(root / "postgres"))
    doc["ingress"]["port"] = ingress
    doc["sandbox"].update(port=sandbox, persist_file=str(root / "sandbox.json"))
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


def test_dev_stack_starts_answers_stops_and_reuses_data(dev_config: Path) -> None:
    doc = yaml.safe_load(dev_config.read_text())
    log = dev_config.parent / "dev.log"
    process = start(dev_config, log)
    try:
        output = wait_for_output(log, UP, process, timeout_s=180)
        assert "demo pack: demo-owner installed" in output
        t, s, i = doc["temporal"], doc["sandbox"], doc["ingress"]
        assert httpx.get(f"http://127.0.0.1:{t['ui_port']}", timeout=10).status_code == 200
        ledger = httpx.get(f"http://127.0.0.1:{s['port']}/_sandbox/ledger", timeout=10)
        assert ledger.json() == {"entries": []}
        assert httpx.get(f"http://127.0.0.1:{i['port']}/healthz", timeout=10).status_code == 200
    finally:
        code = stop(process)
    assert code == 0
    for port in (doc["temporal"]["ui_port"], doc["postgres"]["port"], doc["sandbox"]["port"]):
        assert port_is_free("127.0.0.1", port), f"port {port} still taken after Ctrl-C"

    log = dev_config.parent / "dev-again.log"
    again = start(dev_config, log)
    try:
        output = wait_for_output(log, UP, again, timeout_s=180)
        assert "migrations: current" in output and "demo pack: demo-owner unchanged" in output
    finally:
        assert stop(again) == 0
