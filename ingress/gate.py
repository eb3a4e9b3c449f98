"""The checks every signed request passes first: deadline budget, bounded body, signature."""

from __future__ import annotations

from pydantic import SecretStr
from starlette.requests import Request

from ingress.body import read_limited_body
from ingress.errors import REQUEST_URI_RESOLVE_FAILED, Rejection
from ingress.signature import SignedRequest, check_headers, signing_uri, verify_signature
from protocol.ingress_policy import Endpoint


def deadline_budget_ms(endpoint: Endpoint, request: Request) -> int:
    """ING-4: the configured deadline, never more than the sender's timeout minus a margin."""
    budget = endpoint.deadline_ms
    if endpoint.timeout_header is not None:
        raw = request.headers.get(endpoint.timeout_header, "")
        if raw.isascii() and raw.isdigit() and len(raw) < 10:
            budget = min(budget, max(int(raw) - endpoint.timeout_margin_ms, 1))
    return budget


def _uri(endpoint: Endpoint, request: Request) -> str:
    raw_path = request.scope.get("raw_path")
    if not isinstance(raw_path, bytes):
        raise Rejection(503, REQUEST_URI_RESOLVE_FAILED)
    try:
        return signing_uri(
            endpoint.signature.public_base_url, raw_path, request.scope.get("query_string", b"")
        )
    except UnicodeDecodeError:
        raise Rejection(503, REQUEST_URI_RESOLVE_FAILED) from None


async def read_verified_body(
    endpoint: Endpoint, secret: SecretStr, request: Request, now_ms: int
) -> bytes:
    """The raw body, once it is within the limit and its signature verifies.

    What the headers alone refuse (no signature, no or a stale timestamp) is refused
    before the body is read: a 401 in every mode (ING-3), never a body that stalls into
    the deadline and answers 503, or 204 on ack_drop."""
    presented = check_headers(endpoint.signature, request.headers, now_ms)
    body = await read_limited_body(request, endpoint.body_limit)
    signed = SignedRequest(request.method, _uri(endpoint, request), body, request.headers)
    verify_signature(endpoint.signature, secret, presented, signed)
    return body
