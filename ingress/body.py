"""Bounded body reads: reject over-limit bodies, never truncate them (ING-3)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from ingress.errors import Rejection


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
