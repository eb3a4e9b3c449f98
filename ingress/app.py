"""The ingress ASGI app: one route per configured endpoint, plus health and metrics.

Every endpoint request runs under one absolute deadline (ING-4). Rejections are
fail-closed and mode-independent (ING-3); internal failures answer 503 with
Retry-After, or 204 on an `ack_drop` endpoint (ING-2); a 2xx follows a commit (ING-1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from db.ingress_queries import UnstartedExecution
from ingress import actions
from ingress.admission import Admitter
from ingress.config import IngressConfig, TemporalTarget
from ingress.dispatch import Background, WorkflowStarter
from ingress.errors import OVER_CAPACITY_EXTENSION, DropReason, Rejection, Unavailable
from ingress.gate import deadline_budget_ms, read_verified_body
from ingress.metrics import DropCounter
from ingress.relay import Relay
from ingress.saves import SaveApi
from ingress.webhook import plan_admission
from protocol.ingress_policy import (
    EndpointMode,
    WebhookEndpoint,
    WorkflowActionEndpoint,
    WorkflowActionMode,
)
from services.logthrottle import ThrottledLog
from services.temporal_tls import temporal_tls

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

RETRY_AFTER_S: Final = "5"
READY_TIMEOUT_S: Final = 0.5

Clock = Callable[[], int]
Handler = Callable[[Request, str], Awaitable[Response]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class _JSONResponse(JSONResponse):
    """Starlette's JSONResponse, byte for byte, with its encoder built once (it builds one
    per response: json.dumps with non-default arguments does)."""

    _encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def render(self, content: Any) -> bytes:
        return self._encoder.encode(content).encode("utf-8")


class _PlainEndpoint:
    """A request -> response coroutine as an ASGI app. Starlette wraps a plain function
    in its request/response adapter; an object like this one is routed to as it is."""

    def __init__(self, respond: Callable[[Request], Awaitable[Response]]) -> None:
        self._respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._respond(Request(scope, receive))
        await response(scope, receive, send)


class _CapacityGate:
    """Answers at once a request the server marked beyond `max_connections` (ingress/
    server.py counts the connections; the answer depends on the endpoint's mode)."""

    def __init__(self, app: ASGIApp, ingress: IngressApp) -> None:
        self._app = app
        self._ingress = ingress

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and OVER_CAPACITY_EXTENSION in scope.get("extensions", {}):
            await self._ingress.over_capacity(scope["path"])(scope, receive, send)
            return
        await self._app(scope, receive, send)


class IngressApp:
    """Holds the loaded configuration and the admitter; builds one handler per endpoint."""

    def __init__(self, config: IngressConfig, admitter: Admitter, now_ms: Clock) -> None:
        self.config = config
        self.admitter = admitter
        self.now_ms = now_ms
        webhooks = {e.name for e in config.policy.endpoints if isinstance(e, WebhookEndpoint)}
        every = frozenset(e.name for e in config.policy.endpoints)
        self.drops = DropCounter(frozenset(webhooks), every)
        self.starter: WorkflowStarter | None = (
            None  # set by the lifespan when Temporal is configured
        )
        self.background = Background()
        self._endpoint_names = {e.path: e.name for e in config.policy.endpoints}
        # Set by the lifespan with the starter: the save API wakes link workflows with it.
        self.temporal: tuple[Client, str] | None = None

    def _after_commit_events(self, event_ids: list[str]) -> None:
        """Fire-and-forget: the response never waits on (or fails with) Temporal (ING-6)."""
        if self.starter is not None and event_ids:
            self.background.spawn(self.starter.start_events(self.admitter.pool, event_ids))

    def _after_commit_action(self, execution: UnstartedExecution) -> None:
        if self.starter is not None:
            self.background.spawn(self.starter.start_execution(self.admitter.pool, execution))

    def _unavailable(self, endpoint: str, reason: DropReason) -> Response:
        warn.warning("endpoint %s unavailable: %s", endpoint, reason.value)
        if self.config.policy.mode_of(endpoint) is EndpointMode.ACK_DROP:
            self.drops.increment(endpoint, reason)
            return Response(status_code=204)
        self.drops.unavailable(endpoint)
        return _JSONResponse(
            {"error": reason.value}, status_code=503, headers={"Retry-After": RETRY_AFTER_S}
        )

    def over_capacity(self, path: str) -> Response:
        """A request beyond `max_connections`: the endpoint's internal-failure answer
        (ING-2: 503 + Retry-After, 204 on ack_drop), anything else 503 + Retry-After;
        the connection is closed, so the slot it held is given back."""
        name = self._endpoint_names.get(path)
        if name is not None:
            response = self._unavailable(name, DropReason.OVER_CAPACITY)
        else:
            warn.warning("%s unavailable: %s", path, DropReason.OVER_CAPACITY.value)
            response = _JSONResponse(
                {"error": DropReason.OVER_CAPACITY.value},
                status_code=503,
                headers={"Retry-After": RETRY_AFTER_S},
            )
        response.headers["Connection"] = "close"
        return response

    def route(self, name: str, handle: Handler) -> ASGIApp:
        """The endpoint as a plain ASGI app (Starlette routes to it without wrapping it
        in its request/response adapter, which costs a few function layers per request)."""
        endpoint = self.config.endpoint(name)

        async def respond(request: Request) -> Response:
            request_id = str(uuid.uuid4())
            budget_s = deadline_budget_ms(endpoint, request) / 1000
            try:
                async with asyncio.timeout(budget_s):
                    return await handle(request, request_id)
            except Rejection as rejection:
                headers = None
                if rejection.status == 503:
                    self.drops.unavailable(name)
                    headers = {"Retry-After": RETRY_AFTER_S}
                return _JSONResponse(
                    {"error": rejection.reason}, status_code=rejection.status, headers=headers
                )
            except TimeoutError:
                return self._unavailable(name, DropReason.DEADLINE_EXCEEDED)
            except Unavailable as unavailable:
                return self._unavailable(name, unavailable.reason)

        return _PlainEndpoint(respond)

    def webhook(self, endpoint: WebhookEndpoint) -> Handler:
        secret = self.config.secrets[endpoint.name]

        async def handle(request: Request, request_id: str) -> Response:
            body = await read_verified_body(endpoint, secret, request, self.now_ms())
            plan = plan_admission(endpoint, body, request_id)
            new_ids = await self.admitter.admit_events(plan.events, plan.receipts)
            self._after_commit_events(new_ids)
            return _JSONResponse(
                {"requestId": request_id, "receipts": plan.correlations}, status_code=202
            )

        return handle

    def workflow_action(self, endpoint: WorkflowActionEndpoint) -> Handler:
        secret = self.config.secrets[endpoint.name]

        async def handle(request: Request, request_id: str) -> Response:
            body = await read_verified_body(endpoint, secret, request, self.now_ms())
            if self.config.policy.workflow_action_mode is WorkflowActionMode.DISABLED:
                return _JSONResponse(
                    {"error": "workflow_actions_disabled"},
                    status_code=503,
                    headers={"Retry-After": RETRY_AFTER_S},
                )
            execution = actions.parse_execution(body)
            result = await actions.answer(endpoint, self.admitter, execution, request_id)
            if (row := result.admitted) is not None:
                self._after_commit_action(
                    UnstartedExecution(row.execution_id, row.endpoint, row.callback_id)
                )
            return _JSONResponse(result.body, status_code=200)

        return handle

    def routes(self) -> list[Route]:
        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        for endpoint in self.config.policy.endpoints:
            handle = (
                self.webhook(endpoint)
                if isinstance(endpoint, WebhookEndpoint)
                else self.workflow_action(endpoint)
            )
            routes.append(Route(endpoint.path, self.route(endpoint.name, handle), methods=["POST"]))
        if (save_api := self.config.policy.save_api) is not None:  # API-1
            keys = self.config.save_api_keys
            routes += SaveApi(
                save_api, keys, lambda: self.admitter.pool, lambda: self.temporal
            ).routes()
        return routes

    async def healthz(self, request: Request) -> Response:
        return _JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        if await self.admitter.ready(READY_TIMEOUT_S):
            return _JSONResponse({"status": "ready"})
        return _JSONResponse({"status": "not_ready"}, status_code=503)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.drops.render())


async def connect_lazily(target: TemporalTarget) -> Client:
    """A client that connects on first use, so a down Temporal never blocks startup."""
    api_key = target.api_key.get_secret_value() if target.api_key else None
    return await Client.connect(
        target.address,
        namespace=target.namespace,
        data_converter=pydantic_data_converter,
        api_key=api_key,
        tls=temporal_tls(
            target.tls_ca, target.tls_cert, target.tls_key, tls=target.tls, api_key=bool(api_key)
        ),
        lazy=True,
    )


def create_app(
    config: IngressConfig,
    database_url: str,
    *,
    now_ms: Clock = wall_clock_ms,
    temporal: TemporalTarget | tuple[Client, str] | None = None,
    relay: bool = True,
) -> Starlette:
    """The ASGI app; its lifespan opens the admission pool and, when `temporal` is given
    (a target, or a client and task queue), the workflow starter and the relay."""
    # A shared commit is abandoned once it outlives the longest request deadline.
    longest_deadline_ms = max((e.deadline_ms for e in config.policy.endpoints), default=750)
    admitter = Admitter(database_url, commit_timeout_s=longest_deadline_ms / 1000)
    ingress = IngressApp(config, admitter, now_ms)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await admitter.open()
        relaying: asyncio.Task[None] | None = None
        if temporal is not None:
            if isinstance(temporal, TemporalTarget):
                client, task_queue = await connect_lazily(temporal), temporal.task_queue
            else:
                client, task_queue = temporal
            ingress.starter = WorkflowStarter(client, task_queue, config.policy)
            ingress.temporal = (client, task_queue)
            if relay:
                relaying = asyncio.create_task(Relay(ingress.starter).run(admitter.pool))
        try:
            yield
        finally:
            if relaying is not None:
                relaying.cancel()
                await asyncio.gather(relaying, return_exceptions=True)
            await ingress.background.close()
            await admitter.close()

    app = Starlette(
        routes=ingress.routes(),
        lifespan=lifespan,
        middleware=[Middleware(_CapacityGate, ingress=ingress)],
    )
    app.state.ingress = ingress
    return app
