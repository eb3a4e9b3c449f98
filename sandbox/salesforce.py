"""The salesforce mode: a Salesforce-shaped REST API under `/services/data/vNN.N/sobjects`.

1. Records, ids, look-ups and error arrays are `sandbox.salesforce_store`'s.
2. No idempotency key: an `Idempotency-Key` header is ignored.
3. A request needs a bearer token (401 `INVALID_SESSION_ID` without one).
4. The org's allocation counts every admitted request of every credential over a
   rolling 24 hours; once spent, a request is refused before processing with 403
   `REQUEST_LIMIT_EXCEEDED` (not a 429) and nothing is applied.
5. Locked (an admin switch, or a `status` fault of 400 with no body) answers 400
   `UNABLE_TO_LOCK_ROW`: nothing applied, retry later.
6. Every answer, refusals and faults included, carries
   `Sforce-Limit-Info: api-usage=USED/ALLOCATION`.
"""

from __future__ import annotations

import re

from pydantic import JsonValue
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandbox.admin_api import core_admin_routes
from sandbox.config import RateLimitConfig, SalesforceLimits, SandboxConfig
from sandbox.connections import ConnectionRegistry
from sandbox.faults import FaultBook
from sandbox.front_door import Admission, FrontDoor, GateLog, GateReport, gate_admin_routes
from sandbox.holder import StateHolder
from sandbox.injector import FaultInjector
from sandbox.remote_api import to_response
from sandbox.salesforce_store import RecordStore, not_found, sf_error
from sandbox.strict_limit import SandboxClock, SlidingWindow

DATA = "/services/data/{version}"
SOBJECTS = DATA + "/sobjects/{sobject}"
ROLLING_DAY_S = 86_400.0
# The allocation is the org's: every credential counts against one window.
_ORG = "org"
_VERSION = re.compile(r"v\d+\.\d")

_FAULT_CODES = {
    400: "UNABLE_TO_LOCK_ROW",
    401: "INVALID_SESSION_ID",
    403: "REQUEST_LIMIT_EXCEEDED",
    404: "NOT_FOUND",
    503: "SERVER_UNAVAILABLE",
}


def unable_to_lock_row() -> JsonValue:
    """The body of a row-lock refusal: nothing was applied, retry later."""
    message = "unable to obtain exclusive access to this record or 1 records"
    return sf_error(400, "UNABLE_TO_LOCK_ROW", message).body


def salesforce_fault_body(status: int) -> JsonValue:
    """A `status` fault's body as an error array (400: `UNABLE_TO_LOCK_ROW`)."""
    if status == 400:
        return unable_to_lock_row()
    code = _FAULT_CODES.get(status, "UNKNOWN_EXCEPTION")
    return sf_error(status, code, f"Injected fault {status}").body


class SalesforceGate:
    """Bearer token, lock, then the org's rolling 24-hour allocation."""

    def __init__(self, limits: SalesforceLimits, clock: SandboxClock) -> None:
        self._log = GateLog(clock)
        self._start(limits)

    def _start(self, limits: SalesforceLimits) -> None:
        """Apply `limits` with an empty window."""
        self._limits = limits
        allocation = RateLimitConfig(requests=limits.allocation, per_seconds=ROLLING_DAY_S)
        self._window = SlidingWindow(allocation, self._log.clock)

    def admit(self, method: str, path: str, credential: str | None) -> Admission:
        if credential is None:
            reply = sf_error(401, "INVALID_SESSION_ID", "Session expired or invalid")
            return self._log.refuse("INVALID_SESSION_ID", reply, self._usage())
        if self._log.locked:
            reply = sf_error(400, "UNABLE_TO_LOCK_ROW", "unable to obtain exclusive access")
            return self._log.refuse("UNABLE_TO_LOCK_ROW", reply, self._usage())
        if self._window.wait(_ORG) > 0:
            reply = sf_error(403, "REQUEST_LIMIT_EXCEEDED", "TotalRequests Limit exceeded.")
            return self._log.refuse("REQUEST_LIMIT_EXCEEDED", reply, self._usage())
        self._window.take(_ORG)
        self._log.admit(credential, method, path)
        return Admission(headers=self._usage())

    def _usage(self) -> dict[str, str]:
        used = self._window.used(_ORG)
        return {"Sforce-Limit-Info": f"api-usage={used}/{self._limits.allocation}"}

    def configure(self, raw: bytes) -> JsonValue:
        limits = SalesforceLimits.model_validate_json(raw)
        self._start(limits)
        return limits.model_dump(mode="json")

    def report(self) -> GateReport:
        return self._log.report("salesforce", self._limits)

    def set_locked(self, locked: bool) -> None:
        self._log.locked = locked

    def reset(self) -> None:
        self._log.reset()
        self._start(self._limits)


def salesforce_routes(store: RecordStore) -> list[Route]:
    """Create, read, update, delete, and read or upsert by an external-id field."""

    def base(request: Request) -> str | None:
        version = request.path_params["version"]
        return f"/services/data/{version}" if _VERSION.fullmatch(version) else None

    async def create(request: Request) -> Response:
        body = await request.body()
        if base(request) is None:
            return to_response(not_found())
        return to_response(store.create(request.path_params["sobject"], body))

    async def by_id(request: Request) -> Response:
        body = await request.body()
        data, params = base(request), request.path_params
        sobject, ref = params["sobject"], params["ref"]
        if data is None:
            return to_response(not_found())
        match request.method:
            case "GET":
                return to_response(store.read(sobject, ref, data))
            case "PATCH":
                return to_response(store.update(sobject, ref, body))
            case _:
                return to_response(store.delete(sobject, ref))

    async def by_field(request: Request) -> Response:
        body = await request.body()
        data, params = base(request), request.path_params
        if data is None:
            return to_response(not_found())
        sobject, field, value = params["sobject"], params["field"], params["value"]
        if request.method == "GET":
            return to_response(store.read_by(sobject, field, value, data))
        return to_response(store.upsert(sobject, field, value, body, data))

    return [
        Route(SOBJECTS, create, methods=["POST"]),
        Route(SOBJECTS + "/", create, methods=["POST"]),
        Route(SOBJECTS + "/{ref}", by_id, methods=["GET", "PATCH", "DELETE"]),
        Route(SOBJECTS + "/{field}/{value}", by_field, methods=["GET", "PATCH"]),
    ]


def salesforce_app(config: SandboxConfig, connections: ConnectionRegistry) -> Starlette:
    """The salesforce mode's app: the gate first, then fault rules, then the routes."""
    holder = StateHolder(config)
    book = FaultBook(default_seed=config.seed)
    store = RecordStore(config, holder)
    clock = SandboxClock()
    gate = SalesforceGate(config.salesforce_limits, clock)
    routes = [
        *salesforce_routes(store),
        *core_admin_routes(holder, book, store.list_records, gate.reset),
        *gate_admin_routes(gate, clock),
    ]
    middleware = [
        Middleware(FrontDoor, gate=gate),
        Middleware(
            FaultInjector, book=book, connections=connections, fault_body=salesforce_fault_body
        ),
    ]
    return Starlette(routes=routes, middleware=middleware)
