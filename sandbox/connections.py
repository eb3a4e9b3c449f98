"""Open TCP connections by client address, so a fault can reset one without answering.

An ASGI app cannot drop its connection: uvicorn answers 500 when the app raises or
returns without a response. The sandbox therefore serves through an h11 protocol
subclass that registers each transport under the peer address the ASGI scope reports
as `client`, and a reset aborts that transport with `SO_LINGER` 0 (a TCP RST).
"""

from __future__ import annotations

import asyncio
import socket
import struct

from uvicorn.protocols.http.h11_impl import H11Protocol

ClientAddress = tuple[str, int]


class ConnectionRegistry:
    """Transports of the connections currently open, keyed by client address."""

    def __init__(self) -> None:
        self._transports: dict[ClientAddress, asyncio.Transport] = {}
        self.attached = False

    def opened(self, client: ClientAddress | None, transport: asyncio.Transport) -> None:
        """Remember a new connection's transport."""
        if client is not None:
            self._transports[client] = transport

    def closed(self, client: ClientAddress | None) -> None:
        """Forget a connection that has gone."""
        if client is not None:
            self._transports.pop(client, None)

    def reset(self, client: ClientAddress | None) -> None:
        """Abort the client's connection with a TCP RST; no HTTP response is written."""
        if not self.attached:
            raise RuntimeError("reset faults need the sandbox server (see sandbox.server)")
        transport = self._transports.get(client) if client is not None else None
        if transport is None:
            return  # the client has already gone
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


def tracking_protocol(registry: ConnectionRegistry) -> type[H11Protocol]:
    """An h11 protocol class that reports its connections to `registry`."""
    registry.attached = True

    class TrackingH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            registry.opened(self.client, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            registry.closed(self.client)
            super().connection_lost(exc)

    return TrackingH11Protocol
