"""The strict modes' front door: credential, lock and limits, decided before faults and the app.

A mode supplies a `Gate`; `FrontDoor` asks it about every remote-API request (admin
routes under `/_sandbox` pass untouched) and either answers its refusal — nothing
reaches the fault rules or the store, so nothing is applied — or lets the request
through with the headers the gate adds to every answer. Refused requests are counted
per reason; admitted ones are logged with their arrival time, so a test or a benchmark
can check every window a client produced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox.config import SandboxMode
from sandbox.injector import ADMIN_PREFIX, drain
from sandbox.remote_api import to_response
from sandbox.replies import Reply
from sandbox.strict_limit import SandboxClock


@dataclass(frozen=True)
class Admission:
    """A gate's verdict: a refusal to answer instead of the app, and headers for the answer."""

    refusal: Reply | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


class Arrival(BaseModel):
    """A request the gate admitted: Unix time on the sandbox clock, credential fingerprint."""

    at: float
    credential: str
    method: str
    path: str


class GateReport(BaseModel):
    """What `GET /_sandbox/limits` answers."""

    mode: SandboxMode
    limits: JsonValue
    locked: bool
    refused: dict[str, int]
    admitted: list[Arrival]
    # When each refused request arrived (Unix time, sandbox clock): with `admitted`, every
    # request the client sent, as the remote counted them arriving (NF-8').
    refused_at: list[float] = Field(default_factory=list)


class Gate(Protocol):
    """One strict mode's admission rules."""

    def admit(self, method: str, path: str, credential: str | None) -> Admission:
        """Decide one request; `credential` is the bearer token's fingerprint, if any."""
        ...

    def configure(self, raw: bytes) -> JsonValue:
        """Replace the limits from a JSON body (raises ValidationError); the new limits."""
        ...

    def report(self) -> GateReport:
        """The limits, the lock, refusals by reason and every admitted request."""
        ...

    def set_locked(self, locked: bool) -> None:
        """While locked, every request is refused as the remote refuses a locked one."""
        ...

    def reset(self) -> None:
        """Empty windows and counts, unlocked (the limits stay)."""
        ...


class GateLog:
    """What every gate keeps: the lock switch, refusals by reason, admitted arrivals."""

    def __init__(self, clock: SandboxClock) -> None:
        self.clock = clock
        self.locked = False
        self._refused: dict[str, int] = {}
        self._admitted: list[Arrival] = []
        self._refused_at: list[float] = []

    def refuse(self, reason: str, refusal: Reply, headers: Mapping[str, str]) -> Admission:
        """Count a refusal under `reason`, and log when it arrived."""
        self._refused[reason] = self._refused.get(reason, 0) + 1
        self._refused_at.append(self.clock.wall())
        return Admission(refusal, headers)

    def admit(self, credential: str, method: str, path: str) -> None:
        """Log an admitted request."""
        arrival = Arrival(at=self.clock.wall(), credential=credential, method=method, path=path)
        self._admitted.append(arrival)

    def reset(self) -> None:
        self.locked = False
        self._refused.clear()
        self._admitted.clear()
        self._refused_at.clear()

    def report(self, mode: SandboxMode, limits: BaseModel) -> GateReport:
        return GateReport(
            mode=mode,
            limits=limits.model_dump(mode="json"),
            locked=self.locked,
            refused=dict(self._refused),
            admitted=list(self._admitted),
            refused_at=list(self._refused_at),
        )


def fingerprint(token: str) -> str:
    """A short stable name for a credential, so reports never show the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def bearer_credential(scope: Scope) -> str | None:
    """The fingerprint of the request's `Authorization: Bearer` token; None without one."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return fingerprint(token.strip())
    return None


class FrontDoor:
    """ASGI middleware: the gate decides each remote-API request before anything else."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self._app = app
        self._gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the gate's refusal, or serve the request with the gate's headers added."""
        if scope["type"] != "http" or scope["path"].startswith(ADMIN_PREFIX):
            await self._app(scope, receive, send)
            return
        admission = self._gate.admit(scope["method"], scope["path"], bearer_credential(scope))
        if admission.refusal is None:
            await self._app(scope, receive, _adding(admission.headers, send))
            return
        await drain(receive)
        refusal = admission.refusal
        headers = {**admission.headers, **refusal.headers}
        await to_response(Reply(refusal.status, refusal.body, headers))(scope, receive, send)


def _adding(headers: Mapping[str, str], send: Send) -> Send:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_headers


class LockSetting(BaseModel):
    """`PUT /_sandbox/lock`: lock or unlock the remote."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    locked: bool


class ClockAdvance(BaseModel):
    """`POST /_sandbox/clock`: move the sandbox clock forward."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seconds: float = Field(ge=0, le=366 * 86_400)


def gate_admin_routes(gate: Gate, clock: SandboxClock) -> list[Route]:
    """`/_sandbox/limits` (GET, PUT), `/_sandbox/lock` (PUT) and `/_sandbox/clock` (POST)."""

    async def report(request: Request) -> Response:
        return JSONResponse(gate.report().model_dump(mode="json"))

    async def configure(request: Request) -> Response:
        try:
            return JSONResponse(gate.configure(await request.body()))
        except ValidationError as exc:
            return _invalid(exc)

    async def lock(request: Request) -> Response:
        try:
            gate.set_locked(LockSetting.model_validate_json(await request.body()).locked)
        except ValidationError as exc:
            return _invalid(exc)
        return Response(status_code=204)

    async def advance(request: Request) -> Response:
        try:
            clock.advance(ClockAdvance.model_validate_json(await request.body()).seconds)
        except ValidationError as exc:
            return _invalid(exc)
        return JSONResponse({"wall": clock.wall()})

    return [
        Route(ADMIN_PREFIX + "/limits", report, methods=["GET"]),
        Route(ADMIN_PREFIX + "/limits", configure, methods=["PUT"]),
        Route(ADMIN_PREFIX + "/lock", lock, methods=["PUT"]),
        Route(ADMIN_PREFIX + "/clock", advance, methods=["POST"]),
    ]


def _invalid(exc: ValidationError) -> Response:
    return JSONResponse({"status": "error", "message": str(exc)}, 422)
