"""The campaign's private stack; every piece can be stopped and started again on the same data.

Postgres keeps its data dir, the Temporal dev server its SQLite file and the sandbox
its persist file across restarts; workers are `connector-push worker` subprocesses so
a SIGKILL is a real crash. Nothing is shared with `make dev`, the tests or `make bench`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import asyncpg
import httpx
import yaml
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.chaos.config import Family
from bench.chaos.packs import apply_legacy, campaign_manifest
from cli.stack.devconfig import load_dev_config
from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import free_ports, stop_process
from cli.stack.temporal import TemporalDevServer
from db.migrate import apply_migrations
from protocol.credential_hosts import hosts_variable, secret_variable

DATABASE = "chaos"
TASK_QUEUE = "connector-push"
START_TIMEOUT_S = 60.0
TOKEN = "chaos-campaign-token"  # the bearer token a strict sandbox mode requires


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def _popen(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out: IO[bytes]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # our terminal's Ctrl-C is the campaign's to handle
        )


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait()


@dataclass
class SandboxProcess:
    """The sandbox remote in its own process with a persist file, so its objects and
    ledger survive a stop (the remote being down is a SIGKILL, then a start)."""

    port: int
    persist: Path
    log: Path
    config: Path
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        args = ["sandbox", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--config", str(self.config), "--persist", str(self.persist)]
        self._process = _popen(args, self.log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(f"{self.url}/_sandbox/health"):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sandbox did not start; see {self.log}")
            time.sleep(0.1)  # poll interval; readiness is the health answer

    def kill(self) -> None:
        _kill(self._process)

    def stop(self) -> None:
        if self._process is not None:
            stop_process(self._process, 10)


@dataclass
class WorkerPool:
    """`connector-push worker` subprocesses; a slot is either running or deliberately down."""

    env: dict[str, str]
    log_dir: Path
    size: int
    _processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    down: set[int] = field(default_factory=set, init=False)

    def start(self, slot: int) -> None:
        self.down.discard(slot)
        self._processes[slot] = _popen(["worker"], self.log_dir / f"worker-{slot}.log", self.env)

    def start_all(self) -> None:
        for slot in range(self.size):
            self.start(slot)

    def sigkill(self, slot: int) -> None:
        """A crash: no graceful shutdown, in-flight activities die mid-request."""
        self.down.add(slot)
        _kill(self._processes.get(slot))

    def revive(self) -> int:
        """Restart workers that exited on their own (e.g. Temporal was down at start)."""
        revived = 0
        for slot in range(self.size):
            process = self._processes.get(slot)
            if slot not in self.down and (process is None or process.poll() is not None):
                self.start(slot)
                revived += 1
        return revived

    def stop_all(self) -> None:
        for process in self._processes.values():
            stop_process(process, 25)


@dataclass
class ChaosStack:
    root: Path
    pg: EmbeddedPostgres
    temporal: TemporalDevServer
    sandbox: SandboxProcess
    workers: WorkerPool
    dsn: str
    env: dict[str, str]  # for `connector-push` subprocesses (workers, CLI saves, operator)
    family: Family

    async def restart_postgres(self) -> None:
        await asyncio.to_thread(self.pg.stop)
        await asyncio.to_thread(self.pg.start)

    async def restart_temporal(self) -> None:
        await asyncio.to_thread(self.temporal.stop)
        await asyncio.to_thread(self.temporal.start)
        await self.temporal.wait_ready(START_TIMEOUT_S)

    async def connect(self) -> Client:
        return await Client.connect(
            self.temporal.address,
            namespace=self.temporal.config.namespace,
            data_converter=pydantic_data_converter,
        )


def sandbox_config(family: Family, root: Path) -> Path:
    """The family's sandbox config, with the campaign's changes written beside the data."""
    if not family.sandbox_changes:
        return family.sandbox
    config = {**yaml.safe_load(family.sandbox.read_text()), **family.sandbox_changes}
    path = root / "sandbox-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _credential_env(family: Family, sandbox: SandboxProcess) -> dict[str, str]:
    """The pack's token where the transport reads it, bound to the sandbox's host (S-3)."""
    if family.credential_ref is None:
        return {}
    return {
        secret_variable(family.credential_ref): TOKEN,
        hosts_variable(family.credential_ref): f"127.0.0.1:{sandbox.port}",
    }


def _cli_env(dsn: str, temporal_address: str, namespace: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "CONNECTOR_"))}
    env.update(
        DATABASE_URL=dsn,
        TEMPORAL_ADDRESS=temporal_address,
        TEMPORAL_NAMESPACE=namespace,
        CONNECTOR_PUSH_TASK_QUEUE=TASK_QUEUE,
        CONNECTOR_PUSH_LOG_LEVEL="WARNING",
        COLUMNS="10000",  # rich must not wrap the JSON the campaign parses
        NO_COLOR="1",
    )
    return env


async def _create_database(pg: EmbeddedPostgres, sandbox_url: str, family: Family) -> str:
    admin = await asyncpg.connect(pg.dsn("postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await admin.close()
    dsn = pg.dsn(DATABASE)
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        manifest = campaign_manifest(family, sandbox_url)
        await apply_legacy(conn, manifest)
    finally:
        await conn.close()
    return dsn


@asynccontextmanager
async def chaos_stack(root: Path, workers: int, family: Family) -> AsyncIterator[ChaosStack]:
    """Start everything under `root` (logs stay there); stop everything on exit."""
    dev = load_dev_config()
    pg_port, frontend, ui, sandbox_port = free_ports(4)
    root.chmod(0o755)  # the unprivileged postgres user must reach its data dir
    pg = EmbeddedPostgres(root / "pg", dev.postgres.host, pg_port, durable=False)
    temporal_config = dev.temporal.model_copy(update={"frontend_port": frontend, "ui_port": ui})
    temporal = TemporalDevServer(
        config=temporal_config,
        db_file=root / "temporal.sqlite",
        ui=False,
        log_path=root / "temporal.log",
    )
    sandbox = SandboxProcess(
        sandbox_port, root / "sandbox.json", root / "sandbox.log", sandbox_config(family, root)
    )
    pool: WorkerPool | None = None
    await asyncio.to_thread(pg.start)
    temporal.start()
    try:
        await asyncio.to_thread(sandbox.start)
        dsn = await _create_database(pg, sandbox.url, family)
        await temporal.wait_ready(START_TIMEOUT_S)
        env = _cli_env(dsn, temporal.address, temporal_config.namespace)
        env.update(_credential_env(family, sandbox))
        pool = WorkerPool(env, root, workers)
        pool.start_all()
        yield ChaosStack(root, pg, temporal, sandbox, pool, dsn, env, family)
    finally:
        with suppress(Exception):
            if pool is not None:
                await asyncio.to_thread(pool.stop_all)
        sandbox.stop()
        temporal.stop()
        await asyncio.to_thread(pg.stop)
