"""Remote HTTP for the link steps: send a frozen request, report what the wire showed.

The classification into `protocol.outcome.Transport` is the one place that decides
whether a failed request may have reached the remote. Each request has one overall
deadline (SPEC G-7: pool wait, connect, write and read together), taken when it is
about to leave; a request cut before any byte of it was written is `not_sent`, one cut
after is a timeout that may have landed. The answer is read within the same deadline
and the bounds of S-6 (size, nesting, `Retry-After`). A credential leaves only for a host
bound to it (S-3, `services.credentials`), and each takes its turn in its budget's send
window right before it leaves (NF-8', `services.send_window`): this is the one sender,
so no path skips either.
A production worker's client refuses `http://` before connecting (`services.plain_http`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
from opentelemetry import trace
from pydantic import JsonValue

from protocol.answer_bounds import (
    MAX_ANSWER_BYTES,
    bounded_retry_after,
    nesting_exceeds,
    too_large,
)
from protocol.outcome import Observation, Transport
from protocol.request import wire_body
from protocol.snapshots import ProfileSnapshot
from protocol.timeouts import request_deadline_s
from services.credentials import CredentialNotBound, bind_credential
from services.plain_http import PlainHttpRefused
from services.send_window import SendTurn, take_turn

_tracer = trace.get_tracer(__name__)
log = logging.getLogger(__name__)

# Failures where the request provably never left this process.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
_TIMEOUT = (httpx.ReadTimeout, httpx.WriteTimeout)
_RESET = (httpx.RemoteProtocolError, httpx.ReadError)


class _Unusable(Exception):
    """The remote answered, but over a bound of S-6: the answer cannot be used."""


class _WriteWatch:
    """Whether any byte of the request may have been written (httpcore's trace events:
    the request headers start going out only once a connection is ready)."""

    def __init__(self) -> None:
        self.written = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_headers.started"):
            self.written = True


def _classify(error: httpx.TransportError, watch: _WriteWatch) -> Transport:
    if isinstance(error, _NOT_SENT) or not watch.written:
        return Transport.NOT_SENT
    if isinstance(error, _TIMEOUT):
        return Transport.TIMEOUT
    if isinstance(error, _RESET):
        return Transport.RESET_AFTER_SEND
    return Transport.ERROR_AFTER_SEND


async def send(
    http: httpx.AsyncClient,
    method: str,
    profile: ProfileSnapshot,
    relative_path: str,
    headers: Mapping[str, str],
    body: JsonValue | None,
    *,
    deadline: float | None = None,
    turn: SendTurn | None = None,
) -> Observation:
    """Send one request and classify the outcome; never raises for transport failures.

    `deadline`: the event-loop time (`loop.time()`) the calling activity's start-to-close
    ends at (`LinkStep.deadline`); None outside an activity (the request timeout alone).
    `turn`: where the request takes its turn in its budget's send window right before it
    leaves (NF-8', `LinkStep.turn`); a request that gets none in time is `not_sent`."""
    all_headers = dict(headers)
    content = None
    if body is not None:
        content = wire_body(body)
        all_headers["Content-Type"] = "application/json"
    loop = asyncio.get_running_loop()
    budget = request_deadline_s(None if deadline is None else deadline - loop.time())
    attributes = {"http.method": method, "url.path": relative_path}
    with _tracer.start_as_current_span(f"remote {method}", attributes=attributes) as span:
        span.set_attribute("connector.deadline_s", budget)
        if budget <= 0:  # its activity has no time left to record an answer: never sent
            span.set_attribute("connector.transport", Transport.NOT_SENT.value)
            return Observation(transport=Transport.NOT_SENT)
        request = http.build_request(
            method,
            profile.base_url + relative_path,
            headers=all_headers,
            content=content,
            timeout=httpx.Timeout(budget),
        )
        try:
            bind_credential(request, profile.credential_ref)
        except CredentialNotBound as refused:
            # Fail closed (S-3): the try is `not_sent`, which it provably is; the journal
            # records it so, and its retries run out into a park for an operator.
            log.warning("remote %s refused before sending: %s", method, refused)
            span.set_attribute("connector.credential_refused", str(refused))
            span.set_attribute("connector.transport", Transport.NOT_SENT.value)
            return Observation(transport=Transport.NOT_SENT)
        if turn is not None:
            waited = loop.time()
            granted = await take_turn(turn, profile.credential_ref, deadline)
            span.set_attribute("connector.window_wait_s", loop.time() - waited)
            # G-7 again after the turn (a turn taken and not used under-spends its window).
            budget = request_deadline_s(None if deadline is None else deadline - loop.time())
            if not granted or budget <= 0:
                span.set_attribute("connector.transport", Transport.NOT_SENT.value)
                return Observation(transport=Transport.NOT_SENT)
            request.extensions["timeout"] = httpx.Timeout(budget).as_dict()
        obs = await _exchange(http, request, budget, profile)
        span.set_attribute("connector.transport", obs.transport.value)
        if obs.status is not None:
            span.set_attribute("http.status_code", obs.status)
    return obs


async def _exchange(
    http: httpx.AsyncClient, request: httpx.Request, budget: float, profile: ProfileSnapshot
) -> Observation:
    """The request and its whole answer within `budget` seconds, classified."""
    watch = _WriteWatch()
    request.extensions["trace"] = watch
    status: int | None = None
    try:
        async with asyncio.timeout(budget):
            response = await http.send(request, stream=True)
            status = response.status_code
            try:
                answer = await _read_bounded(response)
            finally:
                await response.aclose()
    except TimeoutError:
        # G-7: the deadline passed; before a byte was written the request never left.
        return Observation(transport=Transport.TIMEOUT if watch.written else Transport.NOT_SENT)
    except PlainHttpRefused as refused:  # fail closed (S-3): provably never left
        log.warning("remote %s refused before sending: %s", request.method, refused)
        return Observation(transport=Transport.NOT_SENT)
    except httpx.TransportError as error:
        return Observation(transport=_classify(error, watch))
    except _Unusable as unusable:
        log.warning("remote answer %s unusable: %s", status, unusable)
        return Observation(transport=Transport.ERROR_AFTER_SEND)
    return _bounded_observation(response, answer, profile)


async def _read_bounded(response: httpx.Response) -> bytes:
    """The (decoded) body, refused past `MAX_ANSWER_BYTES` or `MAX_ANSWER_DEPTH` (S-6)."""
    if too_large(response.headers.get("content-length")):
        raise _Unusable(f"declares a body over {MAX_ANSWER_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise _Unusable(f"body over {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    content = b"".join(chunks)
    if nesting_exceeds(content):
        raise _Unusable("body nested too deep")
    return content


def _bounded_observation(
    response: httpx.Response, content: bytes, profile: ProfileSnapshot
) -> Observation:
    now = datetime.now(UTC)
    headers = dict(response.headers)  # httpx gives the names lowercased
    retry_after = headers.get("retry-after")
    if retry_after is not None:
        # S-6: a wait the remote asks for is bounded by the profile's not-applied budget.
        cap = float(profile.not_applied_budget_seconds)
        headers["retry-after"] = bounded_retry_after(retry_after, now, cap) or retry_after
    return Observation(
        transport=Transport.RESPONSE,
        status=response.status_code,
        headers=headers,
        body=content,
        now=now,
    )
