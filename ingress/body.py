"""Bounded body reads and the one parse every endpoint uses (ING-3, NF-5).

Over-limit bodies are rejected, never truncated; a body is parsed as exact JSON
and checked storable (protocol/storable.py) before anything joins a commit.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from ingress.errors import Rejection
from protocol.event_identity import JsonError, parse_exact_json
from protocol.storable import unstorable_reason


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The whole body, or `Rejection(413)` as soon as it is known to exceed `limit` bytes.

    A declared `Content-Length` over the limit is refused before reading; a
    chunked body is read only until it passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isascii() or not declared.isdigit():
            raise Rejection(400, "bad_content_length")
        if int(declared) > limit:
            raise Rejection(413, "body_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Rejection(413, "body_too_large")
    except ClientDisconnect:
        raise Rejection(400, "client_disconnected") from None
    return bytes(body)


def parse_document(body: bytes) -> object:
    """The body as exact JSON; 400 `malformed_json`, or 400 with the reason the database
    could not store it (`unencodable_string`, `nul_in_text`, ...)."""
    try:
        document = parse_exact_json(body)
    except JsonError:
        raise Rejection(400, "malformed_json") from None
    if (problem := unstorable_reason(document)) is not None:
        raise Rejection(400, problem.value)
    return document
