"""What the CRM-entry commands (`save`, `push`) share: Postgres first, Temporal best effort.

Admission never waits on Temporal (SPEC API-2): the pool opens (or the command
fails with one clear line), the saves are admitted, and only then is a Temporal
client sought, bounded in time; without one the wake-ups are deferred to the relay.
"""

from __future__ import annotations

import asyncio
import gc
import os
import traceback
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import asyncpg
from rich.console import Console
from temporalio.client import Client
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig

from cli.database import postgres_error
from cli.errors import EXIT_UNAVAILABLE, CliError, debug_enabled, load_settings
from cli.local_stack import local_stack_config
from db.pool import CONNECT_ERRORS, create_pool
from worker.client import connect_temporal
from worker.settings import RuntimeSettings

CONNECT_TIMEOUT_S: Final = 3.0
REQUIRED_CONNECT_TIMEOUT_S: Final = 10.0  # a command that cannot work without Temporal
T = TypeVar("T")
DEFERRED_WARNING: Final = (
    "warning: Temporal is unreachable; the admission stands and the wake-up is deferred "
    "(the relay dispatches it once Temporal is back)"
)

_stderr = Console(stderr=True)


def runtime_settings() -> RuntimeSettings:
    """The environment's settings, with the dev stack's Temporal address as the default in
    a checkout (a variable that breaks its rule, or no address in an installed wheel, is
    exit 5 naming it, never its value)."""
    settings = load_settings(RuntimeSettings)
    if settings.temporal_address is not None:
        return settings
    local = local_stack_config()
    if local is None:
        raise CliError(
            "TEMPORAL_ADDRESS is not set; set it to the Temporal frontend (host:port)",
            EXIT_UNAVAILABLE,
        )
    return settings.model_copy(update={"temporal_address": local.temporal.address})


@asynccontextmanager
async def admission_pool(dsn: str, max_size: int = 2) -> AsyncIterator[asyncpg.Pool]:
    """A pool for in-process admission; an unreachable database is one clear error."""
    try:
        pool = await asyncio.wait_for(create_pool(dsn, min_size=1, max_size=max_size), 10)
    except CONNECT_ERRORS as exc:
        error = postgres_error(dsn, exc)
        raise CliError(f"{error.message}; nothing was admitted", error.code) from None
    try:
        yield pool
    finally:
        await pool.close()


def cli_runtime() -> Runtime:
    """A Temporal runtime of the command's own (collected by `run_closing_temporal`).

    The SDK core's own log lines (a WARN per retried gRPC call while the server is away)
    are shown only with --debug: the command's answer is its one line, exit code 5 when
    Temporal did not answer.
    """
    logging = LoggingConfig.default if debug_enabled() else None
    return Runtime(telemetry=TelemetryConfig(logging=logging))


def temporal_error(settings: RuntimeSettings, exc: BaseException) -> CliError:
    """One line: what failed, the setting it came from, what to do (exit 5)."""
    source = (
        "$TEMPORAL_ADDRESS"
        if os.environ.get("TEMPORAL_ADDRESS")
        else "temporal.frontend_ip/frontend_port in temporal-dev.yaml"
    )
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return CliError(
        f"cannot reach Temporal at {settings.temporal_address} (from {source}): {detail}; "
        f"start it with `make dev` or fix {source}",
        EXIT_UNAVAILABLE,
    )


@asynccontextmanager
async def temporal_client(settings: RuntimeSettings) -> AsyncIterator[Client]:
    """A client on a runtime of its own, or a `CliError` (exit 5) when Temporal is down.

    Use with `run_closing_temporal`, which drops the runtime before the interpreter
    shuts down (a runtime left to interpreter finalization can crash the exit: 134/139).
    """
    runtime = cli_runtime()
    try:
        async with asyncio.timeout(REQUIRED_CONNECT_TIMEOUT_S):
            client = await connect_temporal(settings, runtime)
    except Exception as exc:  # refused, DNS, TLS, timeout: all one line
        raise temporal_error(settings, exc) from None
    yield client


def run_closing_temporal(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, then collect the client and runtime it made, while Python is alive."""
    try:
        return asyncio.run(main)
    except BaseException as exc:
        if exc.__traceback__ is not None and not debug_enabled():
            traceback.clear_frames(exc.__traceback__)  # frames hold the client
        raise
    finally:
        gc.collect()


async def connect_best_effort(settings: RuntimeSettings) -> Client | None:
    """A Temporal client, or None (after a warning) when the server does not answer soon.
    Run the command's coroutine with `run_closing_temporal`."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            # A runtime of its own, collected by `run_closing_temporal` (the default
            # runtime lives until interpreter shutdown, where its exit can crash).
            return await connect_temporal(settings, cli_runtime())
    except Exception:  # any failure to connect: the relay covers the wake-up
        warn_deferred()
        return None


def warn_deferred() -> None:
    _stderr.print(f"[yellow]{DEFERRED_WARNING}[/]", highlight=False, soft_wrap=True)
