"""`connector-push dev`: the whole product on one machine, from `temporal-dev.yaml`.

The run owns its data directory (`cli/stack/lock.py`): a second run says who owns it
and touches nothing. Embedded Postgres and the Temporal dev server start unless
`DATABASE_URL` / `TEMPORAL_ADDRESS` point elsewhere (it says so in one line); those
two and the worker, ingress and sandbox remote are supervised, restarted when they
exit (`dev status` says what is down meanwhile); the demo pack and records are
loaded on a data directory's first run (or with `--demo`). Ctrl-C stops everything
this run started, and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from cli.database import AsJson, connect_postgres, echo_json, postgres_error
from cli.dsn import mask_dsn
from cli.errors import fail
from cli.stack.lock import DataDirLock, StackInfo, running_stack
from cli.stack.paths import DEFAULT_PATH
from cli.stack.postgres import EmbeddedPostgres
from cli.stack.process import StackError
from cli.stack.supervisor import Supervisor

if TYPE_CHECKING:  # imported where used: the CLI starts fast without them
    import asyncio

    import httpx

    from cli.stack.devconfig import DevConfig
    from cli.stack.temporal import TemporalDevServer

console = Console()


# Written once the demo data is loaded: later runs on this data directory leave it be.
DEMO_MARKER = "demo-loaded"

# Signing secrets for the demo ingress endpoints in `make dev` only (see docs/save-api.md).
DEV_WEBHOOK_SECRET = "dev-webhook-secret"
DEV_ACTION_SECRET = "dev-action-secret"
DEV_SAVE_API_KEY = "dev-save-api-key"  # the save API's demo client (API-1)


@dataclass
class Endpoints:
    database_url: str
    temporal_address: str
    ui_url: str | None


def planned_endpoints(config: DevConfig) -> Endpoints:
    """Where the stack will be: the exported services, else temporal-dev.yaml's."""
    external = os.environ.get("TEMPORAL_ADDRESS")
    return Endpoints(
        os.environ.get("DATABASE_URL") or config.postgres.dsn(),
        external or config.temporal.address,
        None if external else f"http://{config.temporal.frontend_ip}:{config.temporal.ui_port}",
    )


def stack_info(config: DevConfig, endpoints: Endpoints, children: Supervisor) -> StackInfo:
    from cli.stack.derived import service_url

    return StackInfo(
        pid=os.getpid(),
        database_url=endpoints.database_url,
        temporal_address=endpoints.temporal_address,
        temporal_namespace=config.temporal.namespace,
        ui_url=endpoints.ui_url,
        sandbox_url=service_url(config.sandbox),
        ingress_url=service_url(config.ingress),
        restarts=children.restart_counts(),
        children=children.pids(),
        down=children.down(),
    )


async def _ensure_database(server: EmbeddedPostgres, name: str) -> None:
    conn = await connect_postgres(server.dsn("postgres"))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')  # name from temporal-dev.yaml
    finally:
        await conn.close()


async def _migrate(database_url: str) -> None:
    from db.migrate import apply_migrations
    from db.pool import CONNECT_ERRORS

    try:
        applied = await apply_migrations(database_url)
    except CONNECT_ERRORS as exc:  # the causes' text may quote the password: not chained
        if os.environ.get("DATABASE_URL"):
            fix = "start that server, fix $DATABASE_URL, or unset it to run the embedded one"
            raise postgres_error(database_url, exc, "$DATABASE_URL", fix) from None
        raise postgres_error(database_url, exc, "postgres.* in the dev config") from None
    console.print(f"migrations: {len(applied)} applied" if applied else "migrations: current")


async def _answers(http: httpx.AsyncClient, url: str) -> bool:
    import httpx

    try:
        return (await http.get(url)).status_code == 200
    except httpx.TransportError:
        return False


class DevStack:
    """Starts and stops the services in dependency order."""

    def __init__(self, config: DevConfig, *, load_demo: bool = False) -> None:
        self.config = config
        self.load_demo = load_demo
        self.postgres: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.children = Supervisor(config.logs_dir)

    async def start_postgres(self) -> str:
        if url := os.environ.get("DATABASE_URL"):
            console.print("Postgres: using $DATABASE_URL (unset it to run the embedded one)")
            return url
        pg = self.config.postgres
        self.postgres = EmbeddedPostgres(self.config.resolve(pg.data_dir), pg.host, pg.port)
        self.postgres.start()
        if self.postgres.started:  # a cluster that was already running is not ours to tend
            self.children.watch("postgres", self.postgres, time.monotonic())
        await _ensure_database(self.postgres, pg.database)
        return self.postgres.dsn(pg.database)

    async def start_temporal(self) -> tuple[str, str | None]:
        from cli.stack.temporal import TemporalDevServer

        if address := os.environ.get("TEMPORAL_ADDRESS"):
            console.print(
                f"Temporal: using $TEMPORAL_ADDRESS {address} (unset it to run the dev server)"
            )
            return address, None
        cfg = self.config.temporal
        self.temporal = TemporalDevServer(
            config=cfg,
            db_file=self.config.resolve(cfg.db_file),
            log_path=self.config.logs_dir / "temporal.log",
        )
        self.config.logs_dir.mkdir(parents=True, exist_ok=True)
        self.temporal.start()
        self.children.watch("temporal", self.temporal, time.monotonic())
        await self.temporal.wait_ready()
        return self.temporal.address, self.temporal.ui_url

    async def start(self) -> Endpoints:
        database_url = await self.start_postgres()
        await _migrate(database_url)
        address, ui = await self.start_temporal()
        env = {
            "DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": self.config.temporal.namespace,
        }
        self._start_children(env)
        await self._load_demo(database_url)
        await self._wait_children_ready()
        return Endpoints(database_url, address, ui)

    async def _load_demo(self, database_url: str) -> None:
        """After migrations: the demo pack and records, for a newcomer to push."""
        from cli.stack.demo_data import load_demo  # the services it loads with: only when it runs

        marker = self.config.resolve(self.config.data_dir) / DEMO_MARKER
        if marker.exists() and not self.load_demo:
            console.print(
                "demo data: loaded on an earlier run, left as it is "
                "(`connector-push dev --demo` loads it again; a user's pack is never replaced)"
            )
            return
        for line in await load_demo(database_url, self.config):
            console.print(line)
        marker.write_text("the demo pack and records were loaded into this data directory\n")

    async def _wait_children_ready(self, timeout_s: float = 60.0) -> None:
        """The stack is up only when every service answers (not when it was spawned)."""
        import asyncio

        import httpx

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
                        child, ended = exited
                        raise StackError(
                            f"{child.name} exited at start ({ended}); see {child.log_path}"
                        )
                    if asyncio.get_running_loop().time() > deadline:
                        raise StackError(f"{name} did not answer {url} within {timeout_s:.0f}s")
                    await asyncio.sleep(0.1)

    def _start_children(self, env: dict[str, str]) -> None:
        from cli.stack.derived import ingress_policy_file

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
        now = time.monotonic()
        self.children.spawn_cli("sandbox", sandbox_args, env, now)
        policy = str(ingress_policy_file(self.config))
        # S-2: the worker resolves workflow-action completion targets from the same policy.
        worker_env = {**env, "CONNECTOR_PUSH_INGRESS_CONFIG": policy}
        # S-3: the demo pack's credential may go to the sandbox only (if one is exported).
        worker_env.setdefault(
            "CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_SANDBOX_TOKEN", f"{sandbox.host}:{sandbox.port}"
        )
        if (metrics := self.config.worker_metrics) is not None:
            worker_env["CONNECTOR_PUSH_METRICS_BIND_ADDRESS"] = f"{metrics.host}:{metrics.port}"
        self.children.spawn_cli("worker", ["worker"], worker_env, now)
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
        self.children.spawn_cli("ingress", ["ingress", "--config", policy], ingress_env, now)

    def stop(self) -> None:
        # The children, then Temporal, then Postgres: only a cluster this run started
        # (never another's) is watched, so only that one is stopped.
        self.children.stop_all()


def _print_endpoints(endpoints: Endpoints, config: DevConfig) -> None:
    from cli.stack.derived import service_url

    console.print("\n[bold green]connector-push dev stack is up[/]")
    if endpoints.ui_url:
        console.print(f"  Temporal Web UI   {endpoints.ui_url}")
    console.print(f"  Temporal gRPC     {endpoints.temporal_address}")
    console.print(f"  Postgres          {mask_dsn(endpoints.database_url)}")
    console.print(f"  Sandbox remote    {service_url(config.sandbox)}")
    console.print(f"  Ingress           {service_url(config.ingress)}")
    if config.worker_metrics is not None:
        console.print(f"  Worker metrics    {service_url(config.worker_metrics)}/metrics")
    console.print(f"  Logs              {config.logs_dir}")
    console.print("\nTry next (in another shell):")
    console.print("  source .venv/bin/activate")
    console.print('  eval "$(connector-push dev env)"')
    console.print("  connector-push pack show")
    console.print('  curl -s "$SANDBOX_URL/_sandbox/ledger"')
    console.print(
        f"\nCtrl-C stops everything; data stays in {config.resolve(config.data_dir)} "
        "for the next run."
    )


def _stop_on_signals() -> asyncio.Event:
    """Ctrl-C / SIGTERM set the returned event (instead of raising KeyboardInterrupt)."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _watch(stack: DevStack, stop: asyncio.Event, on_restart: Callable[[], None]) -> None:
    """Tend the children until Ctrl-C; a child failing at start raises `StackError`."""
    import asyncio

    while not stop.is_set():
        lines = stack.children.tend(time.monotonic())
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)
        if lines:
            on_restart()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def run_stack(config: DevConfig, *, load_demo: bool) -> None:
    """Own the data directory, start, watch until Ctrl-C, stop what this run started."""
    lock = DataDirLock(config.resolve(config.data_dir))
    lock.acquire()  # raises StackRunning (touching nothing) when another run owns it
    stack = DevStack(config, load_demo=load_demo)
    endpoints = planned_endpoints(config)
    try:
        lock.publish(stack_info(config, endpoints, stack.children))
        endpoints = await stack.start()
        lock.publish(stack_info(config, endpoints, stack.children))
        # Before "up" is printed: a Ctrl-C right after it stops cleanly (exit 0), not
        # with a KeyboardInterrupt racing the handler's installation (exit 130).
        stop = _stop_on_signals()
        _print_endpoints(endpoints, config)

        def publish() -> None:
            lock.publish(stack_info(config, endpoints, stack.children))

        await _watch(stack, stop, publish)
    finally:
        console.print("stopping…")
        stack.stop()
        lock.release()


def _running(config_path: Path) -> StackInfo:
    from cli.stack.devconfig import load_dev_config

    config = load_dev_config(config_path)
    data_dir = config.resolve(config.data_dir)
    info = running_stack(data_dir)
    if info is None:
        fail(escape(f"no dev stack is running on {data_dir}: start one with `make dev`"))
    return info


ConfigPath = Annotated[
    Path, typer.Option("--config", help="local stack settings", exists=True, dir_okay=False)
]


def register(app: typer.Typer) -> None:
    dev = typer.Typer(help="The local stack (`make dev`), its exports and its status.")

    @dev.callback(invoke_without_command=True)
    def dev_command(
        ctx: typer.Context,
        config: ConfigPath = DEFAULT_PATH,
        demo: Annotated[
            bool,
            typer.Option("--demo", help="load the demo pack and records even if loaded before"),
        ] = False,
    ) -> None:
        """Run the local stack: Postgres, Temporal + UI, worker, ingress, sandbox, demo pack."""
        import asyncio

        from cli.stack.devconfig import load_dev_config

        if ctx.invoked_subcommand is not None:
            return
        try:
            asyncio.run(run_stack(load_dev_config(config), load_demo=demo))
        except StackError as exc:
            fail(escape(str(exc)))

    @dev.command("env")
    def env_command(config: ConfigPath = DEFAULT_PATH, as_json: AsJson = False) -> None:
        """Print the running stack's exports: `eval "$(connector-push dev env)"`."""
        info = _running(config)
        if as_json:
            echo_json(asdict(info))
            return
        typer.echo("\n".join(info.exports()))

    @dev.command("status")
    def status_command(config: ConfigPath = DEFAULT_PATH, as_json: AsJson = False) -> None:
        """Whether a stack runs on the data directory (`degraded` while a service is down
        and waiting to restart): its PID, URLs and restarts."""
        info = _running(config)
        if as_json:
            echo_json(info.shown())
            return
        restarts = ", ".join(f"{name} {count}" for name, count in info.restarts.items())
        typer.echo(f"{info.state} (pid {info.pid}): {info.urls()}")
        for name, ended in info.down.items():
            typer.echo(f"down: {name} ({ended}), restarting")
        typer.echo(f"restarts: {restarts or 'none yet'}")

    app.add_typer(dev, name="dev")
