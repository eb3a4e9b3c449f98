"""ASGI middleware that applies the first firing fault rule to a remote-API request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import assert_never

from pydantic import JsonValue
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox.connections import ConnectionRegistry
from sandbox.faults import FaultBook, FaultRuleSpec

ADMIN_PREFIX = "/_sandbox"
# An aborted transport reports its loss on the next loop turn; this only bounds the wait.
RESET_NOTICE_S = 5.0


# The body of a `status` fault that gives none, in the mode's error shape.
FaultBody = Callable[[int], JsonValue]


class FaultInjector:
    """Wraps the app; admin routes under `/_sandbox` are never faulted."""

    def __init__(
        self,
        app: ASGIApp,
        book: FaultBook,
        connections: ConnectionRegistry,
        fault_body: FaultBody | None = None,
    ) -> None:
        self._app = app
        self._book = book
        self._connections = connections
        self._fault_body = fault_body or generous_fault_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call, faulting it if a rule fires."""
        rule = None
        if scope["type"] == "http" and not scope["path"].startswith(ADMIN_PREFIX):
            rule = self._book.pick(scope["method"], scope["path"])
        if rule is None:
            await self._app(scope, receive, send)
            return
        await asyncio.sleep(rule.delay_ms / 1000)
        await self._apply(rule, scope, receive, send)

    async def _apply(self, rule: FaultRuleSpec, scope: Scope, receive: Receive, send: Send) -> None:
        match rule.action:
            case "delay_ms":
                await self._app(scope, receive, send)
            case "status":
                await drain(receive)
                await _status_response(rule, self._fault_body)(scope, receive, send)
            case "reset_before_effect":
                await drain(receive)
                await self._reset(scope, receive)
            case "reset_after_effect":
                await self._app(scope, receive, _swallow)
                await self._reset(scope, receive)
            case "hang_after_effect":
                await self._app(scope, receive, _swallow)
                await self._hang(rule, scope, receive)
            case "drip_after_effect":
                answer = _Captured()
                await self._app(scope, receive, answer)
                await _drip(answer, rule.drip_ms / 1000, receive, send)
            case _:
                assert_never(rule.action)

    async def _hang(self, rule: FaultRuleSpec, scope: Scope, receive: Receive) -> None:
        try:
            gone = await _wait_for_disconnect(receive, timeout_s=rule.hang_ms / 1000)
        except asyncio.CancelledError:
            # uvicorn cancels request tasks to stop; ending the task ourselves after dropping
            # the connection has the same effect, without uvicorn logging and answering 500.
            await self._reset(scope, receive)
            return
        if not gone:
            await self._reset(scope, receive)

    async def _reset(self, scope: Scope, receive: Receive) -> None:
        self._connections.reset(scope.get("client"))
        # Let the server see the disconnect, so it does not answer 500 for a silent app.
        await _wait_for_disconnect(receive, timeout_s=RESET_NOTICE_S)


def _status_response(rule: FaultRuleSpec, fault_body: FaultBody) -> Response:
    headers = {"Retry-After": rule.retry_after} if rule.retry_after is not None else {}
    assert rule.status is not None  # guaranteed by FaultRuleSpec's validator
    if rule.body_bytes is not None:  # a JSON object that many bytes long, sent chunked
        return StreamingResponse(
            _padded(rule.body_bytes), rule.status, headers, media_type="application/json"
        )
    if rule.body_depth is not None:  # valid JSON nested that deep
        raw = b"[" * rule.body_depth + b"]" * rule.body_depth
        return Response(raw, rule.status, headers, media_type="application/json")
    body = rule.body if rule.body is not None else fault_body(rule.status)
    return JSONResponse(body, rule.status, headers)


async def _padded(size: int) -> AsyncIterator[bytes]:
    """`{"pad":"xxx…"}`, `size` bytes in all, in 64 KiB chunks with no declared length."""
    yield b'{"pad":"'
    left = max(0, size - 10)
    while left > 0:
        chunk = min(left, 65_536)
        yield b"x" * chunk
        left -= chunk
    yield b'"}'


def generous_fault_body(status: int) -> JsonValue:
    """The generous mode's fault bodies: HubSpot's 429, else a HubSpot-style error."""
    if status == 429:
        return {
            "status": "error",
            "message": "You have reached your ten_secondly_rolling limit.",
            "errorType": "RATE_LIMIT",
            "policyName": "TEN_SECONDLY_ROLLING",
            "category": "RATE_LIMITS",
        }
    return {"status": "error", "message": f"Injected fault {status}", "category": "INJECTED"}


async def _swallow(message: Message) -> None:
    """Discard the app's answer: after-effect faults run it only for its effect."""


class _Captured:
    """The app's answer, kept to be sent later (`drip_after_effect`)."""

    def __init__(self) -> None:
        self.start: Message | None = None
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


async def _drip(answer: _Captured, every_s: float, receive: Receive, send: Send) -> None:
    """The status line and headers now, then the body a byte at a time, until it is all
    sent or the client hangs up (then the rest is dropped)."""
    assert answer.start is not None, "the app always answers"
    gone = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await send(answer.start)
        for i in range(len(answer.body)):
            chunk = answer.body[i : i + 1]
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.wait([gone], timeout=every_s)
            if gone.done():
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        gone.cancel()


async def drain(receive: Receive) -> None:
    """Read and drop the request body, so the connection can answer and carry on."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _wait_for_disconnect(receive: Receive, timeout_s: float) -> bool:
    """Wait until the client disconnects; False if `timeout_s` passed first."""
    try:
        await asyncio.wait_for(_until_disconnect(receive), timeout_s)
    except TimeoutError:
        return False
    return True
