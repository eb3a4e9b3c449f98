"""`connector-push dev`: the whole product on one machine, from `temporal-dev.yaml`.

Embedded Postgres and the Temporal dev server start unless `DATABASE_URL` /
`TEMPORAL_ADDRESS` point elsewhere; the worker, ingress and sandbox remote run as
child processes; the demo pack and records are loaded. Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import asyncpg
import httpx
import typer
from rich.console import Console

from cli.demo_data import load_demo
from cli.errors import fail
from cli.stack.devconfig import DEFAULT_PATH, DevConfig, load_dev_config
from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import StackError
from cli.stack.supervisor import Supervisor
from cli.stack.temporal import TemporalDevServer
from db.migrate import apply_migrations

console = Console()

# Steps run after migrations to give a newcomer something to push.
DemoLoader = Callable[[str, DevConfig], Awaitable[list[str]]]
DEMO_LOADERS: list[DemoLoader] = [load_demo]

# Signing secrets for the demo ingress endpoints in `make dev` only (see README).
DEV_WEBHOOK_SECRET = "dev-webhook-secret"
DEV_ACTION_SECRET = "dev-action-secret"
DEV_SAVE_API_KEY = "dev-save-api-key"  # the save API's demo client (API-1)


@dataclass
class Endpoints:
    database_url: str
    temporal_address: str
    ui_url: str | None


async def _ensure_database(server: EmbeddedPostgres, name: str) -> None:
    conn = await asyncpg.connect(server.dsn("postgres"))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')  # name from temporal-dev.yaml
    finally:
        await conn.close()


async def _answers(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(url)).status_code == 200
    except httpx.TransportError:
        return False


class DevStack:
    """Starts and stops the services in dependency order."""

    def __init__(self, config: DevConfig) -> None:
        self.config = config
        self.postgres: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.children = Supervisor(config.logs_dir)

    async def start_postgres(self) -> str:
        if url := os.environ.get("DATABASE_URL"):
            return url
        pg = self.config.postgres
        self.postgres = EmbeddedPostgres(self.config.resolve(pg.data_dir), pg.host, pg.port)
        self.postgres.start()
        await _ensure_database(self.postgres, pg.database)
        return self.postgres.dsn(pg.database)

    async def start_temporal(self) -> tuple[str, str | None]:
        if address := os.environ.get("TEMPORAL_ADDRESS"):
            return address, None
        cfg = self.config.temporal
        self.temporal = TemporalDevServer(
            config=cfg,
            db_file=self.config.resolve(cfg.db_file),
            log_path=self.config.logs_dir / "temporal.log",
        )
        self.config.logs_dir.mkdir(parents=True, exist_ok=True)
        self.temporal.start()
        await self.temporal.wait_ready()
        return self.temporal.address, self.temporal.ui_url

    async def start(self) -> Endpoints:
        database_url = await self.start_postgres()
        applied = await apply_migrations(database_url)
        console.print(f"migrations: {len(applied)} applied" if applied else "migrations: current")
        address, ui = await self.start_temporal()
        env = {
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": self.config.temporal.namespace,
        }
        self._start_children(env)
        for loader in DEMO_LOADERS:
            for line in await loader(database_url, self.config):
                console.print(line)
        await self._wait_children_ready()
        return Endpoints(database_url, address, ui)

    async def _wait_children_ready(self, timeout_s: float = 60.0) -> None:
        """The stack is up only when every service answers (not when it was spawned)."""
        sandbox, ingress = self.config.sandbox, self.config.ingress
        probes = {
            "sandbox": f"http://{sandbox.host}:{sandbox.port}/_sandbox/health",
            "ingress": f"http://{ingress.host}:{ingress.port}/healthz",
        }
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            for name, url in probes.items():
                while not await _answers(http, url):
                    if exited := self.children.first_exited():
                        raise StackError(
                            f"{exited.name} exited ({exited.process.returncode}); "
                            f"see {self.children.log_dir / (exited.name + '.log')}"
                        )
                    if asyncio.get_running_loop().time() > deadline:
                        raise StackError(f"{name} did not answer {url} within {timeout_s:.0f}s")
                    await asyncio.sleep(0.1)

    def _start_children(self, env: dict[str, str]) -> None:
        sandbox = self.config.sandbox
        sandbox_args = [
            "sandbox",
            "--host",
            sandbox.host,
            "--port",
            str(sandbox.port),
            "--config",
            str(self.config.resolve("examples/sandbox.yaml")),
        ]
        if sandbox.persist_file:
            sandbox_args += ["--persist", str(self.config.resolve(sandbox.persist_file))]
        self.children.spawn_cli("sandbox", sandbox_args, env)
        self.children.spawn_cli("worker", ["worker"], env)
        ingress = self.config.ingress
        ingress_env = {
            **env,
            "CONNECTOR_PUSH_INGRESS_HOST": ingress.host,
            "CONNECTOR_PUSH_INGRESS_PORT": str(ingress.port),
            # Development-only signing secrets, unless the caller exported real ones.
            "DEMO_WEBHOOK_SECRET": os.environ.get("DEMO_WEBHOOK_SECRET", DEV_WEBHOOK_SECRET),
            "DEMO_ACTION_SECRET": os.environ.get("DEMO_ACTION_SECRET", DEV_ACTION_SECRET),
            "DEMO_SAVE_API_KEY": os.environ.get("DEMO_SAVE_API_KEY", DEV_SAVE_API_KEY),
        }
        policy = str(self.config.resolve("examples/ingress.yaml"))
        self.children.spawn_cli("ingress", ["ingress", "--config", policy], ingress_env)

    def stop(self) -> None:
        self.children.stop_all()
        if self.temporal is not None:
            self.temporal.stop()
        if self.postgres is not None:
            self.postgres.stop()


def _print_endpoints(endpoints: Endpoints, config: DevConfig) -> None:
    console.print("\n[bold green]connector-push dev stack is up[/]")
    if endpoints.ui_url:
        console.print(f"  Temporal Web UI   {endpoints.ui_url}")
    console.print(f"  Temporal gRPC     {endpoints.temporal_address}")
    console.print(f"  Postgres          {endpoints.database_url}")
    console.print(f"  Sandbox remote    http://{config.sandbox.host}:{config.sandbox.port}")
    console.print(f"  Ingress           http://{config.ingress.host}:{config.ingress.port}")
    console.print(f"  Logs              {config.logs_dir}")
    console.print("\nTry next (in another shell, with `source .venv/bin/activate`):")
    console.print(f"  export DATABASE_URL={endpoints.database_url}")
    console.print(f"  export TEMPORAL_ADDRESS={endpoints.temporal_address}")
    console.print("  connector-push pack show")
    console.print(f"  curl -s http://{config.sandbox.host}:{config.sandbox.port}/_sandbox/ledger")
    console.print(f"\nCtrl-C stops everything; data stays in {config.data_dir} for the next run.")


def _stop_on_signals() -> asyncio.Event:
    """Ctrl-C / SIGTERM set the returned event (instead of raising KeyboardInterrupt)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _watch(stack: DevStack, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if exited := stack.children.first_exited():
            log = stack.children.log_dir / f"{exited.name}.log"
            console.print(f"[red]{exited.name} exited ({exited.process.returncode}); see {log}[/]")
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def _run(config: DevConfig) -> None:
    stack = DevStack(config)
    try:
        endpoints = await stack.start()
        # Before "up" is printed: a Ctrl-C right after it stops cleanly (exit 0), not
        # with a KeyboardInterrupt racing the handler's installation (exit 130).
        stop = _stop_on_signals()
        _print_endpoints(endpoints, config)
        await _watch(stack, stop)
    finally:
        console.print("stopping…")
        stack.stop()


def register(app: typer.Typer) -> None:
    @app.command("dev")
    def dev_command(
        config: Annotated[
            Path, typer.Option("--config", help="local stack settings", exists=True, dir_okay=False)
        ] = DEFAULT_PATH,
    ) -> None:
        """Run the local stack: Postgres, Temporal + UI, worker, ingress, sandbox, demo pack."""
        try:
            asyncio.run(_run(load_dev_config(config)))
        except StackError as exc:
            fail(str(exc))
