"""The worker process: one composition root wiring settings, telemetry, pool and client."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import asyncpg
from pydantic import ValidationError
from temporalio.runtime import Runtime

from db.pool import CONNECT_ERRORS, create_pool
from ingress.config import ConfigError, PolicyLocation, load_callback_targets
from protocol.action_callback import CallbackTarget
from worker.client import connect_temporal, sdk_runtime
from worker.gc_policy import WORKER_YOUNG_THRESHOLD, apply_gc_policy
from worker.link_counts import fold_counts
from worker.observability import configure_logging, configure_tracing
from worker.runtime import (
    build_worker,
    ensure_rate_limits,
    ensure_search_attributes,
    remote_http_client,
    run_until,
)
from worker.schedules import ensure_prune_schedule, ensure_relay_schedule
from worker.settings import RuntimeSettings
from worker.status_gauges import publish_status

log = logging.getLogger(__name__)


class DependencyUnavailable(Exception):
    """The worker could not start: Temporal or Postgres refused or did not answer."""

    def __init__(self, dependency: str, cause: BaseException) -> None:
        super().__init__(f"{dependency}: {cause}")
        self.dependency = dependency
        self.cause = cause


class Misconfigured(Exception):
    """A setting the worker cannot start with; names the variable, never its value."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def _readable_file(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.R_OK)


def check_configuration(settings: RuntimeSettings) -> None:
    """Refuse, before any connection, settings the worker cannot start with."""
    if settings.database_url is None or not settings.database_url.get_secret_value().strip():
        raise Misconfigured("DATABASE_URL", "is not set (`make dev` sets it for the local stack)")
    if not (settings.temporal_address or "").strip():
        raise Misconfigured(
            "TEMPORAL_ADDRESS", "is not set (host:port; `make dev` sets it for the local stack)"
        )
    cert, key = settings.temporal_tls_cert, settings.temporal_tls_key
    if bool(cert) != bool(key):
        raise Misconfigured("TEMPORAL_TLS_CERT/TEMPORAL_TLS_KEY", "set both or neither")
    files = (
        ("TEMPORAL_TLS_CERT", cert),
        ("TEMPORAL_TLS_KEY", key),
        ("TEMPORAL_TLS_CA", settings.temporal_tls_ca),
    )
    for variable, path in files:
        if path and not _readable_file(path):
            raise Misconfigured(variable, "is not a readable file")


def _callback_targets() -> dict[str, CallbackTarget]:
    """S-2: where workflow-action completions go, from the ingress policy file (never from
    a workflow's input); refused at start, naming the variable, when it cannot be read."""
    try:
        return load_callback_targets(PolicyLocation())
    except (ConfigError, ValidationError) as exc:
        raise Misconfigured("CONNECTOR_PUSH_INGRESS_CONFIG", str(exc)) from None


async def run_worker(settings: RuntimeSettings, stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or SIGINT/SIGTERM when no event is given).

    Every setting is checked, and Temporal and Postgres both answer, before the first
    remote side effect (schedules, rate limits): a misconfigured worker changes nothing.
    """
    check_configuration(settings)
    callback_targets = _callback_targets()
    # Everything the worker runs is imported by now; CPython's young threshold, not the
    # CLI's (the CLI's root callback applied that before this command ran): gc_policy.
    apply_gc_policy(WORKER_YOUNG_THRESHOLD)
    configure_logging(settings)
    configure_tracing(settings, "connector-push-worker")
    stop = stop or _stop_on_signals()
    runtime = sdk_runtime(settings)
    try:
        client = await connect_temporal(settings, runtime)
    except RuntimeError as exc:  # the SDK's "Failed client connect": refused, DNS, TLS
        raise DependencyUnavailable("temporal", exc) from exc
    try:
        pool = await create_pool(settings.require_database_url(), min_size=2, max_size=20)
    except CONNECT_ERRORS as exc:
        raise DependencyUnavailable("postgres", exc) from exc
    if not callback_targets:  # said once both dependencies answer: a refusal is one line
        log.warning(
            "no workflow-action callback targets (CONNECTOR_PUSH_INGRESS_CONFIG unset or "
            "naming none): must-complete actions stop without a completion (S-2)"
        )
    try:
        await ensure_search_attributes(client)
        await ensure_relay_schedule(client, settings.task_queue)
        await ensure_prune_schedule(client, settings.task_queue, settings.prune_input())
        await ensure_rate_limits(client, pool, settings.task_queue)
        _say_plain_http_allowed(settings)
        async with remote_http_client(refuse_plain=settings.refuses_plain_http()) as http:
            worker = build_worker(
                client,
                pool,
                http,
                settings.task_queue,
                max_cached_workflows=settings.max_cached_workflows,
                callback_targets=callback_targets,
            )
            gauges = _status_gauges(pool, runtime, stop)
            folding = asyncio.create_task(fold_counts(pool, stop))
            try:
                await run_until(stop, worker)
            finally:
                housekeeping = [folding] if gauges is None else [folding, gauges]
                for task in housekeeping:
                    task.cancel()
                await asyncio.gather(*housekeeping, return_exceptions=True)
    finally:
        await pool.close()


def _say_plain_http_allowed(settings: RuntimeSettings) -> None:
    """S-3: a production worker that may send over plain http says so at every start."""
    if settings.deployment_profile == "production" and settings.allow_plain_http:
        log.warning(
            "production profile allows plain http (CONNECTOR_PUSH_ALLOW_PLAIN_HTTP): "
            "requests to http:// remotes, and their credentials, are sent unencrypted"
        )


def _status_gauges(
    pool: asyncpg.Pool, runtime: Runtime | None, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """The status view beside the SDK metrics, when the worker serves metrics at all."""
    if runtime is None:
        return None
    return asyncio.create_task(publish_status(pool, runtime.metric_meter, stop))


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
