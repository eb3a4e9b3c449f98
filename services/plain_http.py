"""SPEC S-3: a production worker sends nothing over plain `http://` unless the deployment
names the exception (`CONNECTOR_PUSH_ALLOW_PLAIN_HTTP`). The check is a request hook of
the worker's HTTP client (`worker.runtime.remote_http_client`), so it runs at every send,
whoever built the request and whatever pack was applied since the worker started."""

from __future__ import annotations

import httpx


class PlainHttpRefused(httpx.TransportError):
    """Raised by `refuse_plain_http` before any connection: the request never left."""


async def refuse_plain_http(request: httpx.Request) -> None:
    """A request hook of the production worker's client (`worker.runtime`): fail closed on
    any URL not `https`, so every request of that client, whoever builds it, is covered."""
    url = request.url
    if url.scheme != "https":
        origin = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
        raise PlainHttpRefused(
            f"{origin} is not https and the production profile refuses plain http "
            "(CONNECTOR_PUSH_ALLOW_PLAIN_HTTP unset); not sent",
            request=request,
        )
