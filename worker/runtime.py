"""Worker construction: sandbox pass-through, timeouts, search-attribute preflight."""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Mapping, Sequence
from datetime import timedelta

import asyncpg
import httpx
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from protocol.action_callback import CallbackTarget
from protocol.timeouts import REMOTE_HTTP_TIMEOUT, WORKER_GRACEFUL_SHUTDOWN
from services.dispatch_hooks import DispatchHooks
from services.plain_http import refuse_plain_http
from services.rate_limit import current_budget_rates, ensure_fairness_limit
from worker import registry
from worker.failures import DATA_CONVERTER, is_configured
from worker.settings import MAX_CACHED_WORKFLOWS
from workflows import search_attributes

log = logging.getLogger(__name__)


# Pure or I/O-bound modules that workflow code references but never runs inside the
# sandbox: passing them through is configured here once (STYLE rule 5). The four
# workflow helpers are pure (functions and constants, no module state, nothing
# non-deterministic imported), and the sandbox would otherwise re-import them for every
# new workflow instance: profiled, the re-imports were a third of the worker's time per
# create (NF-6, bench P1). Modules holding workflow code (workflows.link, link_operator) stay
# sandboxed although the sandbox is the largest single CPU cost of a create: every create
# is a new run, whose module runs again and whose every call is checked (`make bench
# ONLY=SANDBOX`, measured: 5-8 ms of this process per create, ~4 for the floor
# workflow). The sandbox is what fails a workflow task that reaches for the clock,
# randomness or I/O, and what keeps one run's module state from the next's: a guard at
# run time on every path, where the replay tests cover only the paths they recorded
# (tests/workflows/test_worker_sandbox.py keeps it on).
PASSTHROUGH_MODULES = (
    "protocol",
    "activities",
    "services",
    "db",
    "httpx",
    "asyncpg",
    "workflows.details",
    "workflows.link_retries",
    "workflows.refusals",
    "workflows.search_attributes",
)


class MissingSearchAttributes(RuntimeError):
    """The namespace lacks search attributes the workflows upsert (SPEC WF-4)."""


async def ensure_search_attributes(client: Client) -> None:
    """Refuse to run when a WF-4 attribute is unregistered: upserting it would retry forever."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    registered = dict(response.custom_attributes)
    missing = [
        f"{key.name}={key.indexed_value_type.name.title()}"
        for key in search_attributes.ALL
        if registered.get(key.name) != key.indexed_value_type.value
    ]
    if missing:
        raise MissingSearchAttributes(
            f"namespace {client.namespace!r} lacks search attributes {', '.join(missing)}: "
            "register them with `temporal operator search-attribute create --name N --type T` "
            "(the dev stack does this from temporal-dev.yaml)"
        )


async def ensure_rate_limits(client: Client, pool: asyncpg.Pool, task_queue: str) -> None:
    """Turn on the fairness-key limit that paces remote budgets on `task_queue` (PROF-3).

    `pack apply` does it too; doing it at start survives a Temporal server reset.
    """
    await ensure_fairness_limit(client, task_queue)
    rates = await current_budget_rates(pool)
    log.info("remote rate limits on %s: %d limited budget(s) now", task_queue, len(rates))


def workflow_runner(
    sandboxed: bool, restrictions: SandboxRestrictions = SandboxRestrictions.default
) -> WorkflowRunner:
    """Temporal's sandbox with `restrictions` (the SDK's own by default), or no sandbox at
    all: the one place the bench's `sandboxed=False` is turned into a runner."""
    if sandboxed:
        return SandboxedWorkflowRunner(restrictions=restrictions)
    return UnsandboxedWorkflowRunner()


def build_worker(
    client: Client,
    pool: asyncpg.Pool,
    http: httpx.AsyncClient,
    task_queue: str,
    workflows: Sequence[type] | None = None,
    hooks: DispatchHooks | None = None,
    graceful_shutdown: timedelta = WORKER_GRACEFUL_SHUTDOWN,
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS,
    sandboxed: bool = True,
    callback_targets: Mapping[str, CallbackTarget] | None = None,
) -> Worker:
    """The worker; `graceful_shutdown` is shortened only by tests that simulate a crash.
    `callback_targets`: where workflow-action completions go, by endpoint (S-2; from the
    ingress policy, `load_callback_targets`); none given, no completion is sent.

    `sandboxed=False` exists to measure what the sandbox costs (`make bench ONLY=SANDBOX`);
    the product's worker always runs its workflows sandboxed (see PASSTHROUGH_MODULES)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    return Worker(
        _operator_facing(client),
        task_queue=task_queue,
        workflows=list(workflows if workflows is not None else registry.workflow_classes()),
        activities=list(registry.activity_callables(pool, http, hooks, callback_targets)),
        workflow_runner=workflow_runner(sandboxed, restrictions),
        graceful_shutdown_timeout=graceful_shutdown,
        max_concurrent_activities=200,
        max_cached_workflows=max_cached_workflows,
        # An eagerly dispatched activity skips matching, and with it the fairness-key
        # rate limits that pace remote I/O (PROF-3): measured, 60 creates in 4.6 s
        # against a 3/s limit with eager dispatch on.
        disable_eager_activity_execution=True,
    )


def _operator_facing(client: Client) -> Client:
    """The worker's client with the trace-free refusal converter, however it was made."""
    if is_configured(client.data_converter):
        return client
    config = client.config()
    config["data_converter"] = DATA_CONVERTER
    return Client(**config)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process (httpx's defaults: certifi, or SSL_CERT_FILE /
    SSL_CERT_DIR when set). Building one reads the whole CA bundle, ~75 ms of CPU here,
    which every new client paid again; a context is safe to share between clients."""
    return httpx.create_ssl_context()


def remote_http_client(*, refuse_plain: bool = False) -> httpx.AsyncClient:
    """The shared HTTP client for remote calls; its timeout is below start-to-close (REC-1).

    `refuse_plain` (`RuntimeSettings.refuses_plain_http`, S-3): every `http://` request of
    this client, a profile's or a completion's, is refused before it connects."""
    seconds = REMOTE_HTTP_TIMEOUT.total_seconds()
    return httpx.AsyncClient(
        event_hooks={"request": [refuse_plain_http] if refuse_plain else []},
        verify=tls_context(),
        timeout=httpx.Timeout(seconds),
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )


async def run_until(stop: asyncio.Event, worker: Worker) -> None:
    async with worker:
        log.info("worker polling task queue %s", worker.task_queue)
        await stop.wait()
