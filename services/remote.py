"""Remote HTTP for the create path: send a frozen request, report what the wire showed.

The classification into `protocol.outcome.Transport` is the one place that
decides whether a failed request may have reached the remote.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import httpx
from opentelemetry import trace
from pydantic import JsonValue

from protocol.outcome import Observation, Transport
from protocol.request import wire_body
from protocol.snapshots import ProfileSnapshot

_tracer = trace.get_tracer(__name__)

# Failures where the request provably never left this process.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
_TIMEOUT = (httpx.ReadTimeout, httpx.WriteTimeout)
_RESET = (httpx.RemoteProtocolError, httpx.ReadError)


def _classify(error: httpx.TransportError) -> Transport:
    if isinstance(error, _NOT_SENT):
        return Transport.NOT_SENT
    if isinstance(error, _TIMEOUT):
        return Transport.TIMEOUT
    if isinstance(error, _RESET):
        return Transport.RESET_AFTER_SEND
    return Transport.ERROR_AFTER_SEND


def credential_headers(profile: ProfileSnapshot) -> dict[str, str]:
    """Bearer token from `CONNECTOR_PUSH_CREDENTIAL_<REF>`; secrets are never stored (STO-3)."""
    name = "CONNECTOR_PUSH_CREDENTIAL_" + re.sub(r"[^A-Z0-9]", "_", profile.credential_ref.upper())
    token = os.environ.get(name)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def send(
    http: httpx.AsyncClient,
    method: str,
    profile: ProfileSnapshot,
    relative_path: str,
    headers: Mapping[str, str],
    body: JsonValue | None,
) -> Observation:
    """Send one request and classify the outcome; never raises for transport failures."""
    all_headers = {**credential_headers(profile), **headers}
    content = None
    if body is not None:
        content = wire_body(body)
        all_headers["Content-Type"] = "application/json"
    attributes = {"http.method": method, "url.path": relative_path}
    with _tracer.start_as_current_span(f"remote {method}", attributes=attributes) as span:
        try:
            response = await http.request(
                method, profile.base_url + relative_path, headers=all_headers, content=content
            )
        except httpx.TransportError as error:
            transport = _classify(error)
            span.set_attribute("connector.transport", transport.value)
            return Observation(transport=transport)
        span.set_attribute("http.status_code", response.status_code)
    return Observation(
        transport=Transport.RESPONSE,
        status=response.status_code,
        headers=dict(response.headers),
        body=response.content,
    )
