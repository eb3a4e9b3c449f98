"""The hubspot mode: HubSpot's CRM objects API as documented, and nothing more.

1. No idempotency key: an `Idempotency-Key` header is ignored (the config refuses
   `idempotency: true`), so the same POST twice is two objects.
2. No ETag and no `If-Match`: answers carry no entity tag, a PATCH applies whatever
   precondition it sends.
3. Every error body is `{status, message, correlationId, category}`; objects are
   `{id, properties, createdAt, updatedAt, archived}` (`sandbox.store.render`).
4. A request needs a bearer token (401 without one). The burst limit is per token, a
   sliding window with no tolerance (`sandbox.strict_limit`); the daily limit is the
   account's. A 429 names `TEN_SECONDLY_ROLLING` (or the window's name) or `DAILY`.
5. Locked (an admin switch, or a `status` fault of 423) answers 423; like a 429 it is
   refused before processing.
Objects, unique values, `idProperty` look-ups and the 409 "Existing ID" answer are the
generous mode's store (`sandbox.store.ObjectStore`), reached without its extras.
"""

from __future__ import annotations

import math
import uuid

from pydantic import JsonValue
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox.admin_api import callback_routes, core_admin_routes
from sandbox.callbacks import CallbackInbox
from sandbox.config import HubSpotLimits, SandboxConfig
from sandbox.connections import ConnectionRegistry
from sandbox.faults import FaultBook
from sandbox.front_door import Admission, FrontDoor, GateLog, GateReport, gate_admin_routes
from sandbox.holder import StateHolder
from sandbox.injector import FaultInjector
from sandbox.rate_limit import daily_limit_reached, policy_name, too_many_requests
from sandbox.remote_api import CALLBACKS, OBJECTS, to_response
from sandbox.replies import Reply
from sandbox.store import ObjectStore
from sandbox.strict_limit import DailyCount, SandboxClock, SlidingWindow

# HubSpot's category for an error of each status; others are reported as internal errors.
_CATEGORIES = {
    400: "VALIDATION_ERROR",
    401: "INVALID_AUTHENTICATION",
    403: "MISSING_SCOPES",
    404: "OBJECT_NOT_FOUND",
    409: "CONFLICT",
    423: "LOCKED",
    429: "RATE_LIMITS",
}


def hubspot_error(status: int, message: str, category: str | None = None) -> Reply:
    """HubSpot's error answer: `{status: "error", message, correlationId, category}`."""
    body: dict[str, JsonValue] = {
        "status": "error",
        "message": message,
        "correlationId": str(uuid.uuid4()),
        "category": category or _CATEGORIES.get(status, "INTERNAL_ERROR"),
    }
    return Reply(status, body)


def hubspot_shaped(reply: Reply) -> Reply:
    """A store or limiter answer as HubSpot gives it: no ETag, errors with a correlationId."""
    headers = {k: v for k, v in reply.headers.items() if k.lower() != "etag"}
    body = reply.body
    if isinstance(body, dict) and body.get("status") == "error":
        body = {**body, "correlationId": str(uuid.uuid4())}
    return Reply(reply.status, body, headers)


def locked() -> Reply:
    """423: the remote refuses the request before processing it."""
    return hubspot_error(423, "The object is locked by another request; retry shortly")


def hubspot_fault_body(status: int) -> JsonValue:
    """A `status` fault's body in HubSpot's shape (a 429 names the ten-secondly policy)."""
    if status == 429:
        limit = HubSpotLimits().burst
        assert limit is not None  # the default has a burst limit
        return hubspot_shaped(too_many_requests(limit, 1.0)).body
    if status == 423:
        return locked().body
    return hubspot_error(status, f"Injected fault {status}").body


class HubSpotGate:
    """Bearer token, lock, the account's day and the token's burst window, in that order."""

    def __init__(self, limits: HubSpotLimits, clock: SandboxClock) -> None:
        self._log = GateLog(clock)
        self._start(limits)

    def _start(self, limits: HubSpotLimits) -> None:
        """Apply `limits` with empty windows and days."""
        clock = self._log.clock
        self._limits = limits
        self._burst = SlidingWindow(limits.burst, clock) if limits.burst else None
        self._daily = DailyCount(limits.daily, clock) if limits.daily else None

    def admit(self, method: str, path: str, credential: str | None) -> Admission:
        if credential is None:
            message = "Authentication credentials not found. This API supports OAuth 2.0"
            return self._log.refuse("INVALID_AUTHENTICATION", hubspot_error(401, message), {})
        if self._log.locked:
            return self._log.refuse("LOCKED", locked(), {})
        refusal = self._over_a_limit(credential)
        if refusal is not None:
            return refusal
        if self._daily is not None:
            self._daily.take()
        if self._burst is not None:
            self._burst.take(credential)
        self._log.admit(credential, method, path)
        return Admission(headers=self._headers(credential))

    def _over_a_limit(self, credential: str) -> Admission | None:
        if self._daily is not None and (wait_s := self._daily.wait()) > 0:
            reply = daily_limit_reached(self._daily.limit.requests, wait_s)
            return self._log.refuse("DAILY", hubspot_shaped(reply), {})
        if self._burst is not None and (wait_s := self._burst.wait(credential)) > 0:
            reply = too_many_requests(self._burst.limit, wait_s)
            return self._log.refuse(policy_name(self._burst.limit), hubspot_shaped(reply), {})
        return None

    def _headers(self, credential: str) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self._burst is not None:
            limit = self._burst.limit
            headers["X-HubSpot-RateLimit-Max"] = str(limit.requests)
            left = limit.requests - self._burst.used(credential)
            headers["X-HubSpot-RateLimit-Remaining"] = str(left)
            headers["X-HubSpot-RateLimit-Interval-Milliseconds"] = str(
                math.ceil(limit.per_seconds * 1000)
            )
        if self._daily is not None:
            headers["X-HubSpot-RateLimit-Daily"] = str(self._daily.limit.requests)
            left = self._daily.limit.requests - self._daily.used()
            headers["X-HubSpot-RateLimit-Daily-Remaining"] = str(left)
        return headers

    def configure(self, raw: bytes) -> JsonValue:
        limits = HubSpotLimits.model_validate_json(raw)
        self._start(limits)
        return limits.model_dump(mode="json")

    def report(self) -> GateReport:
        return self._log.report("hubspot", self._limits)

    def set_locked(self, locked: bool) -> None:
        self._log.locked = locked

    def reset(self) -> None:
        self._log.reset()
        self._start(self._limits)


def hubspot_routes(store: ObjectStore, inbox: CallbackInbox) -> list[Route]:
    """The CRM objects routes and callback completions, answered as HubSpot answers."""

    def answer(reply: Reply) -> Response:
        return to_response(hubspot_shaped(reply))

    async def create(request: Request) -> Response:
        # The key is passed only to be written in the ledger: no type here honours one.
        key = request.headers.get("idempotency-key")
        return answer(store.create(request.path_params["object_type"], await request.body(), key))

    async def read(request: Request) -> Response:
        id_property = request.query_params.get("idProperty")
        return answer(store.read(*_address(request), id_property))

    async def patch(request: Request) -> Response:
        return answer(store.patch(*_address(request), await request.body()))

    async def delete(request: Request) -> Response:
        return answer(store.delete(*_address(request)))

    async def complete(request: Request) -> Response:
        callback_id = request.path_params["callback_id"]
        return answer(inbox.complete(callback_id, await request.body()))

    async def complete_batch(request: Request) -> Response:
        return answer(inbox.complete_batch(await request.body()))

    return [
        Route(OBJECTS, create, methods=["POST"]),
        Route(OBJECTS + "/{object_ref}", read, methods=["GET"]),
        Route(OBJECTS + "/{object_ref}", patch, methods=["PATCH"]),
        Route(OBJECTS + "/{object_ref}", delete, methods=["DELETE"]),
        Route(CALLBACKS + "/complete", complete_batch, methods=["POST"]),
        Route(CALLBACKS + "/{callback_id}/complete", complete, methods=["POST"]),
    ]


def _address(request: Request) -> tuple[str, str]:
    return request.path_params["object_type"], request.path_params["object_ref"]


def hubspot_app(config: SandboxConfig, connections: ConnectionRegistry) -> Starlette:
    """The hubspot mode's app: the gate first, then fault rules, then the routes."""
    holder = StateHolder(config)
    book = FaultBook(default_seed=config.seed)
    store = ObjectStore(config, holder)
    inbox = CallbackInbox(config, holder)
    clock = SandboxClock()
    gate = HubSpotGate(config.hubspot_limits, clock)
    routes = [
        *hubspot_routes(store, inbox),
        *core_admin_routes(holder, book, store.list_objects, gate.reset),
        *callback_routes(inbox),
        *gate_admin_routes(gate, clock),
    ]
    middleware = [
        Middleware(FrontDoor, gate=gate),
        Middleware(
            FaultInjector, book=book, connections=connections, fault_body=hubspot_fault_body
        ),
    ]
    return Starlette(routes=routes, middleware=middleware)
